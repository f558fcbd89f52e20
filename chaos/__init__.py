"""Chaos checkers: locked tasks on real prefork workers under SIGKILLs, revokes, time limits and
Redis outages, with a checker for mutual exclusion, fencing order, lost work and leftover locks.

Run as modules from the repository root: ``python -m chaos.torture`` (celery-redlock alone; the
suite runs its short mode in ``tests/e2e/test_torture.py``) and ``python -m chaos.flawed``
(beside four flawed lock recipes and a plain one). See ``chaos/README.md``.
"""
