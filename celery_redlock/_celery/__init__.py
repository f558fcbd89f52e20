"""The Celery layer: task options and settings, a call's lock identity, the one execution path,
the worker wiring and its startup checks. It builds on :mod:`celery_redlock._redis`."""
