"""Prompts, answers and token spans: generated sets, readers for real files, scoring."""
