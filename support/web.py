"""The dashboard under test: an ASGI app served by a real uvicorn (:func:`served`), and the
``lock_admin_action`` signals it sends (:func:`admin_actions`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from celery_redlock.signals import lock_admin_action
from celery_redlock.testing import free_port, wait_until


@contextlib.contextmanager
def served(asgi: Any) -> Iterator[str]:
    """``asgi`` served by uvicorn on a free loopback port, in a thread: yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def admin_actions() -> Iterator[list[dict[str, Any]]]:
    """Every ``lock_admin_action`` sent in the block, its fields without the signal."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **fields: Any) -> None:
        seen.append({k: v for k, v in fields.items() if k != "signal"})

    lock_admin_action.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        lock_admin_action.disconnect(receiver)
