"""An asyncio lock held by a handler of a real uvicorn that is stopped with SIGTERM after its
graceful-shutdown timeout (Kubernetes, systemd and docker stop so): the handler is cancelled,
and the process ends at once after the lifespan shutdown, by SIGTERM raised again with the
default handler, before ``asyncio.run``'s shutdown would wait for the handler's release.
:func:`celery_redlock.asyncio.wait_released` in the lifespan shutdown lets it reach Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import redis as redis_py

from celery_redlock._redis.keys import keys_for
from celery_redlock.asyncio import Lock, wait_released
from celery_redlock.testing import free_port, wait_until

pytest.importorskip("uvicorn")

APP = """
import asyncio, contextlib

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from celery_redlock.asyncio import Lock, wait_released

URL = {url!r}
WAIT = {wait!r}


@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    if WAIT:
        await wait_released()


async def hold(request):
    async with Lock(URL, "asgi-held", ttl=60):
        try:
            await asyncio.sleep(60)
        finally:  # the handler's own clean-up, cancelled or not: its lock is released after it
            await asyncio.sleep(1.0)
    return PlainTextResponse("done")


app = Starlette(routes=[Route("/hold", hold)], lifespan=lifespan)
"""


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _request(port: int) -> None:
    with contextlib.suppress(OSError):  # the server goes away under it: what this test does
        urllib.request.urlopen(f"http://127.0.0.1:{port}/hold", timeout=30).read()


def _serve_and_stop(tmp_path: Path, redis_url: str, r: redis_py.Redis, *, wait: bool) -> int:
    """Serve the app, hold the lock in a request, SIGTERM uvicorn: the key's PTTL after."""
    (tmp_path / "asgiapp.py").write_text(APP.format(url=redis_url, wait=wait))
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "asgiapp:app", "--port", str(port)),
            *("--timeout-graceful-shutdown", "1", "--log-level", "warning"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    key = keys_for("redlock", "asgi-held").lock
    try:
        wait_until(lambda: _listening(port), 20, "uvicorn listens")
        threading.Thread(target=_request, args=(port,), daemon=True).start()
        wait_until(lambda: r.exists(key), 20, "the handler holds its lock")
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == -signal.SIGTERM  # ended by SIGTERM raised again
        return int(r.pttl(key))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        r.delete(key)


def test_uvicorn_ends_before_a_cancelled_handler_releases(
    tmp_path: Path, redis_url: str, r: redis_py.Redis
) -> None:
    """Pins uvicorn's behaviour that makes :func:`wait_released` needed (asgi probe, round 3:
    the guide said the release outlived this shutdown): the key stays for its TTL. The
    handler's clean-up takes a second, so its release cannot win a race with the exit (a
    release right after the cancellation won it in one CI run, and lost it in the probe's
    runs and in ours before)."""
    assert _serve_and_stop(tmp_path, redis_url, r, wait=False) > 0


def test_wait_released_in_the_lifespan_shutdown_lets_the_release_through(
    tmp_path: Path, redis_url: str, r: redis_py.Redis
) -> None:
    assert _serve_and_stop(tmp_path, redis_url, r, wait=True) == -2  # no key


def test_wait_released_refuses_a_timeout_that_is_no_seconds() -> None:
    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(ValueError, match=f"timeout must be seconds >= 0, got {bad!r}"):
            asyncio.run(wait_released(bad))  # type: ignore[arg-type]


def test_wait_released_gives_up_at_its_timeout_naming_what_is_held(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> bool:
        async with Lock(redis_url, "asgi-own", ttl=30):  # the caller's own lock: never released
            return await wait_released(0.05)

    assert asyncio.run(main()) is False
    assert "1 lock(s) still held" in caplog.text and "redlock:{asgi-own}" in caplog.text
    assert not r.exists(keys_for("redlock", "asgi-own").lock)  # released as the block ended
