"""The example project's Celery app: a beat job that never overlaps itself, a per-account
task that never runs twice at once for one account, and a reindex where the newest edit wins.

Redis is configured in :mod:`example_project.settings` (``EXAMPLE_REDIS_URL``).

Run it with ``docker compose up`` (two workers, beat, a producer) or ``make demo`` (no Docker).
"""

from __future__ import annotations

import time

from celery import Celery

from celery_redlock import LockedTask, current_lock
from example_project import journal
from example_project.settings import BROKER_URL, LOCKS_URL, RESULTS_URL

#: Seconds between two sends of the beat job, and how long one run takes: on purpose a run
#: outlasts the interval, so without the lock runs would pile up on top of each other.
REPORT_INTERVAL = 1.0
REPORT_DURATION = 3.0
#: How long the key stays held after a run: a bit under the interval.
REPORT_COOLDOWN = 0.8 * REPORT_INTERVAL

app = Celery("example_project", broker=BROKER_URL, backend=RESULTS_URL)
app.conf.update(
    redlock_url=LOCKS_URL,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    result_expires=3600,
    beat_schedule={
        # The recommended beat setup: lock_cooldown on the task a bit under the interval (a
        # second beat sending the same tick finds the key still held and is skipped);
        # `expires` no longer than the cooldown (a duplicate send that waited in the queue
        # past the cooldown is dropped instead of running the same tick a second time); a
        # hard `time_limit` (a hung run frees the lock at T + redlock_ttl_margin instead of
        # blocking every later tick).
        "refresh-report": {
            "task": "example_project.tasks.refresh_report",
            "schedule": REPORT_INTERVAL,
            "options": {"expires": REPORT_COOLDOWN, "time_limit": 30},
        },
    },
)


@app.task(base=LockedTask, lock_by=(), lock_cooldown=REPORT_COOLDOWN)
def refresh_report() -> str:
    """The periodic job: one run at a time, whatever the number of workers and beats."""
    with journal.inside("report", current_lock()):
        time.sleep(REPORT_DURATION)
    return "report refreshed"


@app.task(base=LockedTask, lock_by=["account_id"])
def sync_account(account_id: int, full: bool = False) -> int:
    """At most one execution per account at a time; a duplicate call is skipped.

    ``current_lock().fencing_token`` grows with each acquisition: a store that remembers the
    last token it accepted can refuse a write from a holder whose lock expired meanwhile.
    """
    with journal.inside(f"account:{account_id}", current_lock()):
        time.sleep(0.3)
    return account_id


@app.task(base=LockedTask, lock_by=["doc_id"], lock_enqueue="replace", lock_on_contention="wait")
def reindex(doc_id: int, version: int) -> int:
    """Sent on every edit of a document: only the newest queued edit of a document runs.

    An older call still waiting when a newer one is sent ends as superseded (SUCCESS,
    ``None``, an INFO line naming the newer call); a reindex already running finishes, and the
    newest waits for it (``lock_on_contention="wait"``).
    """
    with journal.inside(f"doc:{doc_id}", current_lock()):
        time.sleep(0.2)
    return version
