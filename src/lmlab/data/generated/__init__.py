"""Datasets generated offline from templates and real facts."""
