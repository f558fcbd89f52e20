"""Submits work to the example project the way a web application would.

Every second it calls ``sync_account.delay()`` twice for each of three accounts (a double click,
a retrying client), and every other second four threads read a dashboard whose cache entry has
just been invalidated, through :func:`example_project.cache.get_or_rebuild`.

    python -m example_project.producer --seconds 20   # 0: until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import Any

from example_project.cache import data, get_or_rebuild
from example_project.tasks import app, sync_account

ACCOUNTS = (1, 2, 3)
READERS = 4


def build_dashboard() -> bytes:
    time.sleep(0.2)  # an expensive query
    return f"dashboard built at {time.time():.3f}".encode()


def stampede() -> None:
    """Invalidate the dashboard, then let several readers miss it at the same moment."""
    data.delete("dashboard")
    start = threading.Barrier(READERS)

    def read() -> None:
        start.wait()
        get_or_rebuild("dashboard", build_dashboard, ttl=30)

    readers = [threading.Thread(target=read) for _ in range(READERS)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0, help="run time; 0 = until stopped")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + args.seconds if args.seconds > 0 else float("inf")
    calls = rounds = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for account in ACCOUNTS:
            sync_account.delay(account)
            sync_account.delay(account)
            calls += 2
        if rounds % 2 == 0:
            stampede()
        rounds += 1
        stop.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))  # pacing, not syncing
    cache = {k.decode(): int(v) for k, v in data.hgetall("cache").items()}
    print(
        f"producer: {calls} sync_account calls submitted; dashboard cache: "
        f"{cache.get('requests', 0)} reads, {cache.get('rebuilds', 0)} rebuilds "
        f"in {(rounds + 1) // 2} stampedes",
        flush=True,
    )
    app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
