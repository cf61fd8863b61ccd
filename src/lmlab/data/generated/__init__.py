"""Datasets generated offline from templates and real facts (filled in by the study issues)."""
