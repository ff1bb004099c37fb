"""Tests of what the Dagster instance loads from us."""
