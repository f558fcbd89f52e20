"""Every Lua script touches only the keys it declares in ``KEYS``.

Dragonfly runs a script only on its declared keys, and Redis Cluster needs every key of a
script in one slot, so a key a script reached by name would break on both. Two proofs:

* statically, for every script of the package (whatever its layout): no key argument of a
  ``redis.call``/``redis.pcall`` is a string literal or built with ``..``;
* on a real redis-server, under ``MONITOR``: each lock operation runs its scripts, and every
  key a command inside a script touches (as the server itself says, ``COMMAND GETKEYS``) is
  among the ``KEYS`` of the ``EVALSHA`` calls of that operation.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, LockedTask
from celery_redlock._redis import scripts
from celery_redlock._redis.lock import release_attempt
from celery_redlock._redis.scripts import sha1
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app

#: Every script source of the package, by the name it is importable under.
SCRIPTS = {
    name: value
    for name, value in vars(scripts).items()
    if isinstance(value, str) and "redis.call(" in value and not name.startswith("_")
}

#: ``redis.call('CMD', <first argument>`` (the first argument is the key of every keyed
#: command the scripts use, and the channel of PUBLISH).
_CALL = re.compile(r"redis\.p?call\(\s*'(\w+)'\s*(?:,\s*([^,)]+))?")
#: Commands whose first argument is no key (``PUBSUB NUMSUB`` takes the release channel).
_KEYLESS = {"TIME", "PUBLISH", "PUBSUB"}


def test_the_scripts_are_found() -> None:
    assert {"ACQUIRE", "RELEASE", "EXTEND", "WAIT", "MARK_QUEUED", "RATE"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_script_names_a_key_itself(name: str) -> None:
    calls = _CALL.findall(SCRIPTS[name])
    assert calls, name
    for command, first in calls:
        if command.upper() in _KEYLESS:
            continue
        assert first, f"{name}: redis.call('{command}') without a key"
        assert not first.strip().startswith(("'", '"')), f"{name}: {command} on a literal key"
        assert ".." not in first, f"{name}: {command} on a key built in the script"


class Monitor:
    """What the server runs, as ``MONITOR`` reports it, in a thread."""

    def __init__(self, server: RedisServer) -> None:
        self.client = redis_py.Redis(port=server.port, decode_responses=True)
        self.lines: list[dict[str, Any]] = []
        self._monitor = self.client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._monitor.listen():
                self.lines.append(line)
        except (redis_py.ConnectionError, ValueError, AttributeError):
            return  # the monitor connection closed at the end of the test

    def mark(self, label: str) -> None:
        """End a segment: a command that shows in the stream, and wait for it."""
        marker = f"redlock-test-mark:{label}"
        self.client.echo(marker)
        wait_until(lambda: any(marker in ln["command"] for ln in self.lines), 5, marker)

    def close(self) -> None:
        self._monitor.connection.disconnect()
        self._thread.join(5)
        self.client.close()


@pytest.fixture
def own() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def keys_of(client: redis_py.Redis, words: list[str]) -> set[str]:
    """The keys of one command, as the server sees them (none for TIME, PUBLISH...)."""
    try:
        return set(client.command_getkeys(*words))
    except redis_py.ResponseError:  # "The command has no key arguments", "Invalid arguments"
        return set()


def check_segments(monitor: Monitor, client: redis_py.Redis) -> tuple[set[str], int]:
    """Check every segment between marks; return the SHA1s of the scripts that ran and how
    many keys commands inside them touched."""
    ran: set[str] = set()
    checked = 0
    declared: set[str] = set()
    touched: dict[str, str] = {}
    for line in monitor.lines:
        words = line["command"].split(" ")
        if words[0].upper() == "ECHO" and words[1].startswith("redlock-test-mark:"):
            undeclared = {k: c for k, c in touched.items() if k not in declared}
            assert not undeclared, f"scripts touched keys not in KEYS: {undeclared}"
            declared, touched = set(), {}
        elif line["client_type"] == "lua":
            for key in keys_of(client, words):
                touched[key] = line["command"]
                checked += 1
        elif words[0].upper() in ("EVALSHA", "EVAL"):
            ran.add(words[1])
            declared.update(words[3 : 3 + int(words[2])])
    return ran, checked


def test_the_check_sees_a_script_that_reaches_a_key_by_name(own: RedisServer) -> None:
    monitor = Monitor(own)
    client = redis_py.Redis(port=own.port, decode_responses=True)
    rogue = "redis.call('SET', KEYS[1], '1') return redis.call('GET', 'elsewhere')"
    client.evalsha(client.script_load(rogue), 1, "declared")
    monitor.mark("rogue")
    with pytest.raises(AssertionError, match="elsewhere"):
        check_segments(monitor, client)
    monitor.close()
    client.close()


def test_each_lock_operation_touches_only_the_keys_it_declares(
    own: RedisServer, redis_server: RedisServer, redis_url: str
) -> None:
    url = own.url
    monitor = Monitor(own)
    client = redis_py.Redis(port=own.port, decode_responses=True)
    steps: list[tuple[str, Callable[[], Any]]] = []

    first = Lock(url, "keys", 10, owner="a", host="h")
    second = Lock(url, "keys", 10, owner="b", host="h", timeout=5)
    semaphore = Lock(url, "sem", 10, limit=2, owner="c")
    steps.append(("acquire", lambda: first.acquire(blocking=False)))
    steps.append(("fencing", lambda: first.fencing_token))
    steps.append(("contended", lambda: second.acquire(blocking=False)))
    steps.append(("holder ttl", lambda: second.last_holder_ttl))
    steps.append(("extend", lambda: first.extend(10)))
    steps.append(("semaphore", lambda: semaphore.acquire(blocking=False)))
    steps.append(("semaphore release", semaphore.release))
    steps.append(("noscript", lambda: client.script_flush()))
    steps.append(("acquire after flush", lambda: Lock(url, "other", 10).acquire(blocking=False)))
    for label, step in steps:
        step()
        monitor.mark(label)

    # A blocking waiter queues (WAIT), is handed the lock on release (RELEASE), and leaves.
    won: list[bool] = []
    waiter = threading.Thread(target=lambda: won.append(second.acquire(blocking=True)))
    waiter.start()
    wait_until(lambda: client.exists(second.keys.waiters) == 1, 5, "the waiter to queue")
    monitor.mark("queued")
    first.extend(5)  # shorter than its 10 s: wakes the queue (EXISTS, ZRANGE on it)
    monitor.mark("shortened")
    first.release()
    waiter.join(10)
    assert won == [True]
    monitor.mark("handed over")
    timing_out = Lock(url, "keys", 10, owner="c", timeout=0.2)
    assert not timing_out.acquire(blocking=True)  # WAIT, then LEAVE when the wait ends
    monitor.mark("left")
    assert release_attempt(url, "keys", "redlock", "b", "h", 0) is False  # wrong pid
    monitor.mark("release attempt")
    second.release()
    monitor.mark("released")

    # The task-level scripts: the queued marker, the newest call, the rate window.
    app: Celery = make_app(redis_server, redlock_url=url)

    @app.task(base=LockedTask, lock_enqueue=True)
    def enqueued() -> None: ...

    @app.task(base=LockedTask, lock_rate="5/m")
    def rated() -> None: ...

    @app.task(base=LockedTask, lock_enqueue="replace")
    def replaced() -> None: ...

    enqueued.delay()
    monitor.mark("enqueued")
    enqueued.delay()  # the duplicate
    monitor.mark("duplicate")
    rated.apply()
    monitor.mark("rated")
    replaced.delay()
    monitor.mark("replaced")
    ran, checked = check_segments(monitor, client)
    assert checked > 40
    monitor.close()
    client.close()

    exercised = {name for name, source in SCRIPTS.items() if sha1(source) in ran}
    expected = {"ACQUIRE", "EXTEND", "RELEASE", "WAIT", "LEAVE", "RELEASE_ATTEMPT"}
    expected |= {"MARK_QUEUED", "RATE", "MARK_NEWEST"}  # FENCE too on Redis 7, not on 6.2
    assert expected <= exercised, f"not run: {expected - exercised}"
