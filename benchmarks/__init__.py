"""Benchmarks of celery-redlock (scripts, not tests; see README.md)."""
