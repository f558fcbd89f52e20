"""The README quickstart with ``base=LockedTask`` forgotten, in a project that imports nothing of
celery-redlock (nor ``support.apps``, which does): the check that refuses ``lock_by`` there
must come from the ``celery.commands`` entry point alone. ``REDLOCK_TEST_PORT`` is the test's
private redis-server (broker db 1, locks db 0). With ``REDLOCK_TEST_FOREIGN=1`` it is a project
that does not use the package at all: no ``redlock_*`` setting, and a lock base class of its own
that reads a ``lock_ttl``."""

from __future__ import annotations

import os

from celery import Celery, Task

BASE = f"redis://127.0.0.1:{os.environ['REDLOCK_TEST_PORT']}"

app = Celery("unimported_app", broker=f"{BASE}/1")

if os.environ.get("REDLOCK_TEST_FOREIGN") == "1":

    class HomegrownLock(Task):
        """Reads ``self.lock_ttl`` in its own ``__call__`` (not shown)."""

    @app.task(name="unimported_app.sync_account", base=HomegrownLock, lock_ttl=120)
    def sync_account(account_id: int) -> int:
        return account_id

else:
    app.conf.redlock_url = f"{BASE}/0"

    @app.task(name="unimported_app.sync_account", lock_by=["account_id"])
    def sync_account(account_id: int) -> int:
        return account_id
