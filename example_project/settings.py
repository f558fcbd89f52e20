"""Where the example project's Redis is: ``EXAMPLE_REDIS_URL``, a URL without a database number.

One Redis serves four databases: 0 the locks, 1 the broker, 2 the results, 3 the app's data
(the cache of :mod:`example_project.cache` and the demo's journal). Run it with
``--maxmemory-policy noeviction``: an evicted lock no longer excludes anything.
"""

from __future__ import annotations

import os

REDIS_URL = os.environ.get("EXAMPLE_REDIS_URL", "redis://localhost:6379").rstrip("/")
LOCKS_URL = f"{REDIS_URL}/0"
BROKER_URL = f"{REDIS_URL}/1"
RESULTS_URL = f"{REDIS_URL}/2"
DATA_URL = f"{REDIS_URL}/3"
