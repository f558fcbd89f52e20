"""Support code shared by the test suite, the benchmarks and the chaos checkers.

Not part of the package (``pyproject.toml`` ships ``celery_redlock`` only): it lives at the
repository root beside ``tests/``, ``benchmarks/`` and ``chaos/``, which all import it.

* :mod:`support.apps`: the one layout of a Celery app on a test redis-server (``make_app``,
  ``lock_keys``), and the one environment-variable convention (``REDLOCK_TEST_*``) of the
  suite, the benchmarks and the checkers;
* :mod:`support.workers`: ``celery worker`` (or ``beat``) subprocesses in their own process
  groups, logging to a file, and the in-process worker (``running_worker``, ``Holder``);
* :mod:`support.polling`: tight polling for latency measurements, on top of
  :func:`celery_redlock.testing.wait_until` (the one polling helper);
* :mod:`support.procfs`: what Linux ``/proc`` tells about a process;
* :mod:`support.servers`: Redis topologies beyond one server (Sentinel, Cluster, TLS), each a
  :class:`celery_redlock.testing.RedisServer` (the one server wrapper), and a
  latency-injecting proxy;
* :mod:`support.layers`: the package's modules by layer, for the layer tests.

Tests import shared helpers from here, never from a ``conftest.py`` or another tier
(``tests/unit/test_support.py``).
"""

from pathlib import Path

#: The repository root: the working directory and ``PYTHONPATH`` entry of every subprocess.
ROOT = Path(__file__).resolve().parents[1]
