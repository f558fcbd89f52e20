"""``celery_redlock.testing.RedisServer`` reports started only when the server answering on its
port is its own process: another Redis already there is named in an error, never used (nor
emptied by the plugin's ``FLUSHDB``). "The other server" is a fresh one on a free port."""

from __future__ import annotations

import pytest

from celery_redlock.testing import RedisServer


def test_a_port_another_redis_serves_is_an_error_not_that_server() -> None:
    with RedisServer() as other:
        other.client().set("precious", "data")
        clash = RedisServer(port=other.port)
        with pytest.raises(RuntimeError, match=rf"port {other.port} is served by another process"):
            clash.start()
        assert clash.process is None  # stopped, not left failing to bind
        assert other.client().get("precious") == b"data"
        assert other.process is not None and other.process.poll() is None


def test_a_restart_on_a_port_taken_meanwhile_is_an_error() -> None:
    with RedisServer() as server:
        server.stop()
        with RedisServer(port=server.port) as other:  # took the port between stop and start
            other.client().set("precious", "data")
            with pytest.raises(RuntimeError, match=rf"port {server.port} is served by another"):
                server.restart()
            assert other.client().get("precious") == b"data"
