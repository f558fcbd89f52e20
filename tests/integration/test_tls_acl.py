"""``rediss://`` with a private CA and client certificates, password auth, and the minimal ACL.

The servers listen on TLS only (``--port 0``) and require a client certificate
(``--tls-auth-clients yes``). The ``default`` user has a password; the locks use
:data:`ACL_RULES`, the README's ACL line, which :func:`test_every_rule_of_the_acl_is_needed`
shows to be minimal: dropping any one rule breaks an operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import (
    Lock,
    LockedTask,
    LockUnavailable,
    current_lock,
    metrics,
    single_instance,
)
from celery_redlock._celery.checks import run_startup_checks
from celery_redlock._celery.options import reset_settings
from celery_redlock._redis import probe
from celery_redlock._redis import timeline as ring
from celery_redlock._redis.inventory import Inventory, InventoryRefused
from celery_redlock._redis.lock import release_attempt
from celery_redlock.asyncio import Lock as AsyncLock
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.servers import SERVICE, Certs, SentinelServer, TlsServer, make_certs, tls_supported
from support.workers import running_worker

#: The commands the plugin runs: EVALSHA (every operation; the scripts' own calls are checked
#: against the same user: GET SET DEL PEXPIRE PTTL TIME PUBLISH), SCRIPT LOAD (after NOSCRIPT),
#: PTTL (``locked()``, ``remaining_ttl()``), SUBSCRIBE (blocking acquire), PING (a quorum
#: picks a live node to subscribe on), HINCRBY (the workers' event counters).
ACL_RULES = (
    "on >secret resetchannels &redlock:* resetkeys ~redlock:* -@all "
    "+evalsha +script|load +get +set +del +pexpire +pttl +time +publish +subscribe +ping "
    "+hincrby"
)
#: The line for redis.conf / an ACL file (the README's).
ACL_LINE = f"user redlock {ACL_RULES}"
COMMANDS = [rule for rule in ACL_RULES.split() if rule.startswith("+")]
#: What a feature adds to the line (the guide's table), by the startup check's feature name.
ACL_ADDITIONS = {
    "newest": "+hget +hset +hdel",  # lock_enqueue="replace", lock_debounce
    "rate": "+llen +lindex +rpush +ltrim",  # lock_rate
    "queue": "+zadd +zrem +zpopmin +exists +zrange",  # the queue of blocking waiters
    "cli": "+scan +exists +mget +hgetall +zpopmin +zrange +zrem",  # celery redlock ...
    "timeline": "+lpush +ltrim",  # redlock_timeline, the dashboard's ring
}
ADMIN_PASSWORD = "admin-pw"

NO_TLS = tls_supported()
pytestmark = pytest.mark.skipif(NO_TLS is not None, reason=NO_TLS or "")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def servers(certs: Certs) -> Iterator[list[TlsServer]]:
    """Three TLS servers (three independent nodes for the quorum tests), user from the line."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(TlsServer(certs, ADMIN_PASSWORD, users=[ACL_LINE.split(" ", 1)[1]]))
            for _ in range(3)
        ]


@pytest.fixture
def tls(servers: list[TlsServer]) -> TlsServer:
    for server in servers:
        admin = server.admin()
        try:
            admin.flushall()
            admin.script_flush()  # so that SCRIPT LOAD is exercised too
        finally:
            admin.close()
    return servers[0]


def operations(target: str | list[str], name: str) -> None:
    """Every lock operation once: raises on the first one that the server refuses."""
    holder = Lock(target, name, ttl=10, owner="task-1", host="w1")
    assert holder.acquire(blocking=False)
    contender = Lock(target, name, ttl=10)
    assert not contender.acquire(blocking=False)  # the holder's PTTL, from the script
    assert contender.last_holder is not None and contender.last_holder.task_id == "task-1"
    assert holder.locked()
    assert 9.0 < (holder.remaining_ttl() or 0) <= 10.0
    holder.extend(20)
    holder.release()

    holder = Lock(target, name, ttl=10)
    assert holder.acquire(blocking=False)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            holder.release()
        except BaseException as exc:  # reported by the waiter below
            errors.append(exc)

    waiter = Lock(target, name, ttl=10)
    releaser = threading.Timer(0.05, release)
    releaser.start()
    try:
        start = time.monotonic()
        acquired = waiter.acquire(timeout=3)
    finally:
        releaser.join()
    if errors:
        raise errors[0]
    assert acquired and time.monotonic() - start < 2.0  # woken by the release notification
    waiter.release()

    lock = Lock(target, name, ttl=10, owner="task-2", host="w1")
    assert lock.acquire(blocking=False)
    assert release_attempt(target, name, "redlock", "task-2", "w1", os.getpid())
    assert not lock.locked()


def test_tls_needs_the_ca_the_client_certificate_and_the_password(tls: TlsServer) -> None:
    operations(tls.url("", ADMIN_PASSWORD), "admin")  # password auth, default user

    bad = {
        "no client certificate": tls.url("redlock", "secret", client_cert=False),
        "wrong password": tls.url("redlock", "wrong-pw"),
        "no password": tls.url(),
        "plain TCP": f"redis://redlock:secret@127.0.0.1:{tls.port}/0",
    }
    for what, url in bad.items():
        with pytest.raises(LockUnavailable) as info:
            Lock(url, "job", ttl=10).acquire(blocking=False)
        assert f"127.0.0.1:{tls.port}" in str(info.value), what
        assert "secret" not in str(info.value) and "wrong-pw" not in str(info.value), what

    no_ca = f"rediss://redlock:secret@127.0.0.1:{tls.port}/0?ssl_cert_reqs=required"
    with pytest.raises(LockUnavailable, match="certificate verify failed"):
        Lock(no_ca, "job", ttl=10).acquire(blocking=False)


def test_a_url_whose_tls_does_not_match_the_port_says_what_to_check(
    tls: TlsServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither mismatch names TLS by itself: ``redis://`` to a TLS-only port is "Connection
    reset by peer", ``rediss://`` to a plain port is "Timeout connecting to server". Each
    names the other scheme: from the thread and asyncio locks, the startup check and the
    inventory (``celery redlock ls`` and the dashboard). TLS options on a ``redis://`` URL are
    refused when the lock is built."""
    plain_to_tls = f"redis://redlock:secret@127.0.0.1:{tls.port}/0"
    # redis-py 5.0 times the TLS handshake by socket_timeout, the newest by the connect timeout.
    tls_to_plain = (
        f"rediss://127.0.0.1:{redis_server.port}/0?socket_connect_timeout=0.3&socket_timeout=0.3"
    )
    for url, fix in (
        (plain_to_tls, "use the rediss scheme"),
        (tls_to_plain, "use the redis scheme"),
    ):
        with pytest.raises(LockUnavailable, match=fix):
            Lock(url, "job", ttl=10).acquire(blocking=False)

        async def take(url: str = url) -> None:
            await AsyncLock(url, "job", ttl=10).acquire(blocking=False)

        with pytest.raises(LockUnavailable, match=fix):
            asyncio.run(take())
        with pytest.raises(LockUnavailable, match=fix):
            Inventory([url], "redlock").read("redlock:{job}")
        app = make_app(redis_server, "tls-mismatch", redlock_url=url)

        @app.task(base=LockedTask, shared=False)
        def work() -> None: ...

        (error,) = _checked(app, caplog)[logging.ERROR]
        assert "cannot reach the lock Redis" in error and fix in error, error
        app.close()
    with pytest.raises(ValueError, match=r"TLS options need a rediss:// URL"):
        Lock(tls.url("redlock", "secret").replace("rediss://", "redis://"), "job", ttl=10)


def test_a_url_without_the_client_certificate_a_server_wants_says_to_give_it(
    tls: TlsServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Probe: ``tls-auth-clients yes`` and a URL without ``ssl_certfile`` gave "Error 8 while
    writing to socket. EOF occurred in violation of protocol" (or, read first, "tlsv13 alert
    certificate required"): no word of the certificate to give. The lock, the asyncio lock,
    the inventory and the startup check now say it."""
    url = tls.url("redlock", "secret", client_cert=False)
    fix = (
        "the server may want a client certificate (tls-auth-clients yes): give ssl_certfile "
        "and ssl_keyfile in the URL"
    )
    error = _every_reader_says(url, fix, redis_server, caplog)
    assert "cannot reach the lock Redis" in error and fix in error, error


def _every_reader_says(
    url: str, fix: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> str:
    """Assert that the lock, the asyncio lock and the inventory, connecting to ``url``, raise
    a ``LockUnavailable`` that says ``fix``; return the startup check's ERROR for it."""
    with pytest.raises(LockUnavailable, match=re.escape(fix)):
        Lock(url, "job", ttl=10).acquire(blocking=False)

    async def take() -> None:
        await AsyncLock(url, "job", ttl=10).acquire(blocking=False)

    with pytest.raises(LockUnavailable, match=re.escape(fix)):
        asyncio.run(take())
    with pytest.raises(LockUnavailable, match=re.escape(fix)):
        Inventory(url, "redlock").read("redlock:{job}")
    app = make_app(redis_server, "tls-refused", redlock_url=url)

    @app.task(base=LockedTask, shared=False)
    def work() -> None: ...

    try:
        (error,) = _checked(app, caplog)[logging.ERROR]
    finally:
        app.close()
    return error


def test_a_certificate_that_does_not_verify_names_the_ca_option(
    tls: TlsServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Probe: a self-signed server and a URL without ``ssl_ca_certs`` read as an outage
    ("cannot reach ... CERTIFICATE_VERIFY_FAILED ... until it answers"), and nothing named
    the fix, which no wait brings. The lock, the asyncio lock, the inventory and the startup
    check now name ``ssl_ca_certs``."""
    url = f"rediss://redlock:secret@127.0.0.1:{tls.port}/0"
    fix = "the server's certificate does not verify: give the CA that signed it in the URL"
    error = _every_reader_says(url, fix, redis_server, caplog)
    assert "ssl_ca_certs=/path/ca.pem" in error, error
    with pytest.raises(LockUnavailable, match="could not be trusted for lock"):
        Lock(url, "job", ttl=10).acquire(blocking=False)


def test_tls_checks_that_the_certificate_names_the_host(tls: TlsServer) -> None:
    """The server's certificate names 127.0.0.1; reached as ``localhost``, the CA's signature
    alone is not enough (redis-py 5.x connected: any certificate of the CA would do).
    ``ssl_check_hostname=false`` opts out."""
    named = tls.url("redlock", "secret").replace("127.0.0.1", "localhost")
    with pytest.raises(LockUnavailable, match=r"(?i)hostname|IP address mismatch|match"):
        Lock(named, "job", ttl=10).acquire(blocking=False)
    lock = Lock(f"{named}&ssl_check_hostname=false", "job", ttl=10)
    assert lock.acquire(blocking=False)
    lock.release()


def test_every_operation_works_with_the_acl_user(tls: TlsServer, servers: list[TlsServer]) -> None:
    operations(tls.url("redlock", "secret"), "single")
    operations([s.url("redlock", "secret") for s in servers], "quorum")


def test_the_acl_user_is_refused_everything_else(tls: TlsServer) -> None:
    c = tls.connect(username="redlock", password="secret")
    try:
        for command in (
            ("FLUSHALL",),
            ("GET", "other"),
            ("SET", "other", "1"),
            ("DEL", "other"),
            ("KEYS", "*"),
            ("SCAN", "0"),
            ("CONFIG", "GET", "*"),
            ("SCRIPT", "FLUSH"),
            ("EVAL", "return 1", "0"),
            ("PUBLISH", "other", "1"),
            ("SELECT", "1"),
            ("ACL", "WHOAMI"),
            ("INCR", "redlock:{x}"),
            ("EVALSHA", "0" * 40, "1", "other"),
        ):
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                c.execute_command(*command)
        pubsub = c.pubsub()
        try:
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                pubsub.subscribe("other")
                pubsub.get_message(timeout=1)
        finally:
            pubsub.close()
    finally:
        c.close()


@pytest.mark.parametrize("dropped", COMMANDS)
def test_every_rule_of_the_acl_is_needed(
    tls: TlsServer, servers: list[TlsServer], dropped: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"probe-{dropped.strip('+').replace('|', '-')}"
    rules = [rule for rule in ACL_RULES.split() if rule != dropped]
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
        finally:
            admin.close()
    if dropped == "+hincrby":
        c = tls.connect(username=user, password="secret")
        try:
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                c.hincrby("redlock:stats:task", "acquired", 1)
        finally:
            c.close()
        return
    if dropped == "+publish":
        # The release deletes the key but cannot wake the waiters: it says exactly that.
        holder = Lock(tls.url(user, "secret"), "single", ttl=10)
        assert holder.acquire(blocking=False)
        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
            holder.release()
        assert not holder.locked()
        assert "released on" in caplog.text and "waiters were not notified" in caplog.text
        return
    with pytest.raises((redis_py.exceptions.ResponseError, LockUnavailable)) as info:
        operations(tls.url(user, "secret"), "single")
        operations([s.url(user, "secret") for s in servers], "quorum")
    assert "permission" in str(info.value) or "can't run this command" in str(info.value)


@pytest.mark.parametrize("dropped", COMMANDS)
def test_the_startup_dry_run_names_exactly_the_command_a_user_lacks(
    tls: TlsServer, dropped: str
) -> None:
    """The dry run of the startup check, for the guide's line less one rule, names that one
    command more than for the whole line. ``+pttl`` dropped used to be named as EVALSHA too
    (its probe runs a script that calls PTTL, refused inside the script)."""
    refused = {}
    for name, rules in (("whole", ACL_RULES), ("less", ACL_RULES.replace(f" {dropped}", ""))):
        user = f"dry-{name}-{dropped.strip('+').replace('|', '-')}"
        admin = tls.admin()
        try:
            admin.execute_command("ACL", "SETUSER", user, "reset", *rules.split())
        finally:
            admin.close()
        client = tls.connect(username=user, password="secret")
        try:
            refused[name] = set(probe.dry_run(client, "redlock"))
        finally:
            client.close()
    assert refused["less"] - refused["whole"] == {dropped[1:].upper()}, refused


def test_a_user_without_script_load_and_evalsha_is_told_both_at_one_start(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dry run skipped EVALSHA when SCRIPT LOAD was refused (nothing loaded to run): the
    first start said to grant ``+script|load``, the next ``+evalsha``, two rounds for one fix.
    EVALSHA of a script not loaded is refused by the ACL first, else answered NOSCRIPT: one
    start names both, and granting what it names ends the ERROR."""
    _set_user(servers, "no-scripts", ACL_RULES.replace(" +evalsha +script|load", ""))
    app = make_app(redis_server, "acl-scripts", redlock_url=tls.url("no-scripts", "secret"))

    @app.task(base=LockedTask, shared=False)
    def work() -> None: ...

    (error,) = _checked(app, caplog)[logging.ERROR]
    assert "refuses commands this package needs: EVALSHA, SCRIPT|LOAD (" in error, error
    grant = re.search(r"grant them to the ACL user \(([^)]*)\)", error)
    assert grant is not None and set(grant[1].split()) == {"+evalsha", "+script|load"}, error
    _set_user(servers, "granted", f"{ACL_RULES.replace(' +evalsha +script|load', '')} {grant[1]}")
    app.conf.redlock_url = tls.url("granted", "secret")
    reset_settings(app)
    assert logging.ERROR not in _checked(app, caplog)
    app.close()


def test_a_user_without_time_leaves_no_key_behind_its_refused_acquire(tls: TlsServer) -> None:
    """The acquire script wrote the lock, then failed at ``TIME`` (refused): the key stayed,
    held by nobody, and the task's own retry found it held by itself. The script now reads
    before it writes."""
    user = "no-time"
    admin = tls.admin()
    try:
        rules = ACL_RULES.replace(" +time", "").split()
        admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
        lock = Lock(tls.url(user, "secret"), "no-time", ttl=10, owner="task-1")
        with pytest.raises(LockUnavailable):
            lock.acquire(blocking=False)
        assert admin.exists(lock.key) == 0
    finally:
        admin.close()


def test_a_command_refused_inside_a_script_names_the_scripts_commands(
    tls: TlsServer, servers: list[TlsServer]
) -> None:
    """Inside a script Redis names the script's SHA, not the refused command ("The user
    executing the script can't run this command or subcommand script: 3e7f..."): the thread
    and asyncio locks' errors name what the script runs."""
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command("ACL", "SETUSER", "no-del", "reset", *ACL_RULES.split(), "-del")
        finally:
            admin.close()
    url = tls.url("no-del", "secret")
    holder = Lock(url, "no-del", ttl=10)
    assert holder.acquire(blocking=False)
    with pytest.raises(LockUnavailable) as info:
        holder.release()
    assert "(the release script runs GET, " in str(info.value) and "DEL" in str(info.value)

    async def release() -> None:
        lock = AsyncLock(url, "no-del-async", ttl=10)
        assert await lock.acquire(blocking=False)
        await lock.release()

    with pytest.raises(LockUnavailable) as info:
        asyncio.run(release())
    assert "(the release script runs GET, " in str(info.value), info.value


def holds_its_lock_on(tls: TlsServer) -> Any:
    """A task body: whether the lock it runs under is a key on ``tls``."""

    def work(key: str) -> bool:
        lock = current_lock()
        assert lock is not None
        admin = tls.admin()
        try:
            return bool(admin.exists(lock.key))
        finally:
            admin.close()

    return work


def test_locked_task_over_tls_with_the_acl_user(tls: TlsServer, redis_server: RedisServer) -> None:
    """Broker and results on a plain server; locks and event counters over TLS, ACL user."""
    redis_server.client().flushall()
    app = make_app(redis_server, "tls", redlock_url=tls.url("redlock", "secret"))

    work = app.task(base=LockedTask)(holds_its_lock_on(tls))

    with running_worker(app, concurrency=1):
        assert work.delay("k").get(timeout=10) is True  # the lock was on the TLS server
    metrics.flush()  # the event counters, written with HINCRBY as the ACL user
    admin = tls.admin(decode_responses=True)
    try:
        assert int(admin.hget(f"redlock:stats:{work.name}", "acquired") or 0) >= 1
        keys: list[str] = admin.keys("redlock:{*")  # type: ignore[assignment]
        assert [k for k in keys if not k.endswith(":fence")] == []
    finally:
        admin.close()


def test_without_redlock_url_locks_reach_a_tls_broker_with_its_broker_use_ssl(
    tls: TlsServer,
) -> None:
    """The broker's TLS options travel with its URL: without them the client would verify the
    server against the system CAs and fail."""
    app = Celery(
        "tls-broker", broker=f"rediss://redlock:secret@127.0.0.1:{tls.port}/0", set_as_current=False
    )
    app.conf.broker_use_ssl = {
        "ssl_ca_certs": tls.certs.ca,
        "ssl_certfile": tls.certs.client_cert,
        "ssl_keyfile": tls.certs.client_key,
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }

    work = app.task(base=LockedTask, shared=False)(holds_its_lock_on(tls))

    assert work.apply(args=("k",)).get() is True
    app.close()


@pytest.mark.parametrize("setting", ["broker_url", "redlock_url"])
@pytest.mark.parametrize("reqs", ["CERT_REQUIRED", "CERT_NONE", "cert_optional"])
def test_a_tls_url_in_celerys_spelling_of_ssl_cert_reqs_reaches_the_locks(
    tls: TlsServer, setting: str, reqs: str
) -> None:
    """``ssl_cert_reqs=CERT_NONE`` (kombu and Celery's Redis backend take it) is redis-py's
    ``none``: a worker with that broker URL and no ``redlock_url`` refused to start, blaming a
    ``redlock_url`` never written ("Invalid SSL Certificate Requirements Flag: CERT_NONE").
    A ``redlock_url`` copied from the broker's is taken too, by the thread and asyncio locks."""
    url = tls.url("redlock", "secret").replace("ssl_cert_reqs=required", f"ssl_cert_reqs={reqs}")
    assert f"ssl_cert_reqs={reqs}" in url
    broker = url if setting == "broker_url" else "memory://"
    app = Celery("tls-spelling", broker=broker, set_as_current=False)
    if setting == "redlock_url":
        app.conf.redlock_url = url

    work = app.task(base=LockedTask, shared=False)(holds_its_lock_on(tls))

    assert work.apply(args=("k",)).get() is True
    app.close()

    async def aio() -> None:
        lock = AsyncLock(url, "aio-spelling", ttl=10)
        assert await lock.acquire(blocking=False)
        await lock.release()

    asyncio.run(aio())


def test_the_asyncio_lock_works_with_the_acl_user(tls: TlsServer) -> None:
    """Its scripts too are loaded again with ``SCRIPT LOAD`` after the flush: the user may run
    ``EVALSHA`` and ``SCRIPT LOAD``, not ``EVAL``."""

    async def operations() -> None:
        url = tls.url("redlock", "secret")
        holder = AsyncLock(url, "aio", ttl=10)
        assert await holder.acquire(blocking=False)
        assert not await AsyncLock(url, "aio", ttl=10).acquire(blocking=False)
        await holder.extend(20)
        await holder.release()
        assert not await holder.locked()

    asyncio.run(operations())


def test_a_release_refused_its_channel_names_the_channel_rule(
    tls: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A user given every command and key but no channel (Redis 7's default for a user
    written ``+@all ~*``): the release cannot PUBLISH, and the warning names ``&redlock:*``,
    not only the commands, which the user has."""
    admin = tls.admin()
    try:
        admin.execute_command(
            "ACL",
            "SETUSER",
            "every-command",
            "reset",
            "resetchannels",
            "on",
            ">secret",
            "~*",
            "+@all",
        )
    finally:
        admin.close()
    holder = Lock(tls.url("every-command", "secret"), "single", ttl=10)
    assert holder.acquire(blocking=False)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        holder.release()
    assert not holder.locked()
    assert "waiters were not notified" in caplog.text
    assert "channels &redlock:*?" in caplog.text


def _user(servers: list[TlsServer], user: str, *additions: str) -> None:
    """The ACL user ``user``: the guide's line, plus ``additions`` (feature names)."""
    extra = " ".join(ACL_ADDITIONS[name] for name in additions).split()
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command("ACL", "SETUSER", user, "reset", *ACL_RULES.split(), *extra)
        finally:
            admin.close()


def _checked(app: Any, caplog: pytest.LogCaptureFixture) -> dict[int, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, True)
    found: dict[int, list[str]] = {}
    for record in caplog.records:
        found.setdefault(record.levelno, []).append(record.getMessage())
    return found


def test_the_startup_check_asks_only_what_the_registered_tasks_need(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 24 item 6, issue 22 item 3. With the guide's line, an app of plain locked tasks
    gets no ERROR (the command line's SCAN and HGETALL are an INFO); an app with a replace
    task gets one ERROR naming HGET, HSET, HDEL and that task, gone with the documented
    addition; likewise ``lock_rate``."""
    plain = make_app(redis_server, "acl-plain", redlock_url=tls.url("redlock", "secret"))

    @plain.task(base=LockedTask, shared=False)
    def work() -> None: ...

    found = _checked(plain, caplog)
    assert logging.ERROR not in found
    (cli,) = [m for m in found[logging.INFO] if "command line" in m]
    assert "SCAN" in cli and "HGETALL" in cli and "workers do not need them" in cli
    # Helper probe, round 3: INFO refused skipped the eviction, version and server checks with
    # an INFO line only; the guide's table names +info for them.
    (skipped,) = [m for m in found[logging.WARNING] if "INFO is refused" in m]
    assert "maxmemory-policy" in skipped and "grant +info to have them" in skipped
    _set_user(servers, "with-info", f"{ACL_RULES} +info")
    with_info = make_app(redis_server, "acl-info", redlock_url=tls.url("with-info", "secret"))

    @with_info.task(base=LockedTask, shared=False)
    def informed() -> None: ...

    found = _checked(with_info, caplog)
    assert not [m for m in found.get(logging.WARNING, []) if "INFO" in m]
    assert any(m.startswith("celery_redlock: locks on Redis ") for m in found[logging.INFO])
    with_info.close()

    for feature, options in (
        ("newest", {"lock_enqueue": "replace"}),
        ("rate", {"lock_rate": "5/s"}),
    ):
        app = make_app(redis_server, f"acl-{feature}", redlock_url=tls.url("redlock", "secret"))

        @app.task(base=LockedTask, shared=False, name=f"acl.{feature}", **options)
        def featured() -> None: ...

        @app.task(base=LockedTask, shared=False, name=f"acl.{feature}.plain")
        def unfeatured() -> None: ...

        (error,) = _checked(app, caplog)[logging.ERROR]
        grant = ACL_ADDITIONS[feature]
        assert f"grant them to the ACL user ({grant})" in error, error
        assert ", ".join(c.lstrip("+").upper() for c in grant.split()) in error
        assert f"(tasks: acl.{feature})" in error and "secret" not in error

        _user(servers, f"with-{feature}", feature)
        app.conf.redlock_url = tls.url(f"with-{feature}", "secret")
        reset_settings(app)
        assert logging.ERROR not in _checked(app, caplog)
        app.close()
    plain.close()


def test_an_app_with_a_timeline_ring_is_told_what_to_grant(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``redlock_timeline`` makes every locked task push its events: with the guide's line the
    startup check's ERROR names LPUSH and LTRIM and the tasks; gone with the addition."""
    app = make_app(
        redis_server, "acl-ring", redlock_url=tls.url("redlock", "secret"), redlock_timeline=50
    )

    @app.task(base=LockedTask, shared=False, name="acl.ring")
    def ringed() -> None: ...

    (error,) = _checked(app, caplog)[logging.ERROR]
    assert "redlock_timeline needs (tasks: acl.ring): LPUSH, LTRIM" in error, error
    assert f"grant them to the ACL user ({ACL_ADDITIONS['timeline']})" in error
    assert "their events are not recorded" in error
    _user(servers, "with-timeline", "timeline")
    app.conf.redlock_url = tls.url("with-timeline", "secret")
    reset_settings(app)
    assert logging.ERROR not in _checked(app, caplog)
    app.close()


def test_a_ring_refused_ltrim_does_not_grow_and_each_feature_names_all_it_needs(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user granted LPUSH but not LTRIM: the ring's push was LPUSH then LTRIM in a pipeline,
    so every event grew it, its TTL renewed by each push. It is now refused before it grows.
    The startup check named LTRIM only under ``lock_rate``'s ERROR, and asked the ring for
    ``+lpush`` alone; each feature's ERROR now names all it is refused."""
    _user(servers, "no-ltrim")
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command("ACL", "SETUSER", "no-ltrim", "+lpush")
        finally:
            admin.close()
    url = tls.url("no-ltrim", "secret")
    with pytest.raises(redis_py.exceptions.ResponseError, match=r"(?i)script|NOPERM"):
        ring.push(url, "redlock", {"t": 1}, 5)
    admin = tls.admin()
    try:
        assert admin.exists("redlock:timeline") == 0
    finally:
        admin.close()

    app = make_app(redis_server, "acl-ltrim", redlock_url=url, redlock_timeline=5)

    @app.task(base=LockedTask, shared=False, name="acl.ltrim.rate", lock_rate="5/s")
    def rated() -> None: ...

    errors = _checked(app, caplog)[logging.ERROR]
    assert len(errors) == 2, errors
    rate, timeline = sorted(errors, key=lambda e: "redlock_timeline" in e)
    assert "lock_rate needs (tasks: acl.ltrim.rate): LLEN, LINDEX, RPUSH, LTRIM" in rate, rate
    assert "redlock_timeline needs (tasks: acl.ltrim.rate): LTRIM" in timeline, timeline
    assert "grant them to the ACL user (+ltrim)" in timeline
    app.close()


def test_an_acl_without_hincrby_is_told_that_only_the_counters_stop(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The counters are the only user of HINCRBY: its refusal was reported as "lock operations
    fail and locked tasks follow redlock_on_unavailable", while the tasks locked and ran."""
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command(
                "ACL", "SETUSER", "no-hincrby", "reset", *ACL_RULES.split(), "-hincrby"
            )
        finally:
            admin.close()
    app = make_app(redis_server, "acl-hincrby", redlock_url=tls.url("no-hincrby", "secret"))

    @app.task(base=LockedTask, shared=False, name="acl.counted")
    def counted() -> str:
        return "ran"

    (error,) = _checked(app, caplog)[logging.ERROR]
    assert "the event counters need: HINCRBY" in error and "(+hincrby)" in error, error
    assert "the tasks lock and run as usual" in error and "redlock_on_unavailable" not in error
    assert counted.apply().get() == "ran"
    app.close()


def _set_user(servers: list[TlsServer], user: str, rules: str) -> None:
    for server in servers:
        admin = server.admin()
        try:
            admin.execute_command("ACL", "SETUSER", user, "reset", *rules.split())
        finally:
            admin.close()


def test_key_patterns_that_leave_out_the_high_water_mark_or_the_ring_are_an_error(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Key patterns ``~redlock:{* ~redlock:stats:*`` cover the lock's keys but not the fencing
    tokens' high-water mark (``redlock:fence:{<tag>}``) nor the ring (``redlock:timeline``):
    the startup check said nothing, then every acquire was refused, and the ring stayed
    empty. Each is now an ERROR that names the key pattern to grant."""
    narrow = ACL_RULES.replace("~redlock:*", "~redlock:{* ~redlock:stats:*")
    _set_user(servers, "narrow", f"{narrow} {ACL_ADDITIONS['timeline']}")
    url = tls.url("narrow", "secret")
    with pytest.raises(LockUnavailable, match="keys"):
        Lock(url, "narrow", ttl=10).acquire(blocking=False)
    app = make_app(redis_server, "acl-narrow", redlock_url=url, redlock_timeline=5)

    @app.task(base=LockedTask, shared=False, name="acl.narrow")
    def narrowed() -> None: ...

    lock, timeline = sorted(_checked(app, caplog)[logging.ERROR], key=lambda e: "ring" in e)
    assert f"this package needs: {probe.HIGH_WATER} (" in lock, lock
    assert "grant them to the ACL user (~redlock:*)" in lock and "+set" not in lock, lock
    assert f"redlock_timeline needs (tasks: acl.narrow): {probe.RING}" in timeline, timeline
    assert "(~redlock:*)" in timeline
    _set_user(servers, "narrow", f"{ACL_RULES} {ACL_ADDITIONS['timeline']}")
    assert logging.ERROR not in _checked(app, caplog)
    app.close()


def test_a_missing_channel_pattern_is_named_not_the_commands_the_user_has(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without ``&redlock:*`` the ERROR asked for ``+publish +subscribe``, which the user had."""
    _set_user(servers, "no-channels", ACL_RULES.replace(" &redlock:*", ""))
    app = make_app(redis_server, "acl-channels", redlock_url=tls.url("no-channels", "secret"))

    @app.task(base=LockedTask, shared=False, name="acl.channels")
    def work() -> None: ...

    (error,) = _checked(app, caplog)[logging.ERROR]
    assert "PUBLISH, SUBSCRIBE" in error and "grant them to the ACL user (&redlock:*)" in error
    app.close()


def test_a_single_node_that_refuses_ping_is_reached_and_checked(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without ``+ping`` (only a quorum needs it) the check said it "cannot reach" the node,
    and skipped the dry run: a command the tasks need went unreported. The node is checked;
    here the missing ``+hincrby`` is named, and PING is not."""
    _set_user(servers, "no-ping", ACL_RULES.replace(" +ping", "").replace(" +hincrby", ""))
    app = make_app(redis_server, "acl-ping", redlock_url=tls.url("no-ping", "secret"))

    @app.task(base=LockedTask, shared=False, name="acl.ping")
    def work() -> str:
        return "ran"

    found = _checked(app, caplog)
    (error,) = found[logging.ERROR]
    assert "the event counters need: HINCRBY" in error and "PING" not in error, error
    assert not [m for m in found[logging.INFO] + error.split("\n") if "cannot reach" in m]
    assert work.apply().get() == "ran"
    app.close()


def test_a_quorum_that_refuses_ping_is_told_that_blocking_waits_fail_not_every_lock(
    tls: TlsServer,
    servers: list[TlsServer],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Helper probe, round 3, session 22: a quorum's ACL user without ``+ping`` got an ERROR
    per node saying "until then lock operations fail", while its tasks locked and ran: only
    a blocking wait pings the nodes (to pick one to listen on)."""
    _set_user(servers, "no-ping-q", ACL_RULES.replace(" +ping", ""))
    urls = [server.url("no-ping-q", "secret") for server in servers]
    app = make_app(redis_server, "acl-ping-q", redlock_url=urls)

    @app.task(base=LockedTask, shared=False, name="acl.ping_q")
    def work() -> str:
        return "ran"

    errors = _checked(app, caplog)[logging.ERROR]
    assert len(errors) == len(servers), errors
    for error in errors:
        assert "PING" in error and "lock operations fail" not in error, error
        assert "a quorum's blocking wait" in error and "grant them to the ACL user (+ping)" in error
    assert work.apply().get() == "ran"
    holder = Lock(urls, "ping-q", ttl=10)
    assert holder.acquire(blocking=False)  # the locks work
    with pytest.raises(LockUnavailable, match="PING"):  # a wait does not
        Lock(urls, "ping-q", ttl=10).acquire(blocking=True, timeout=0.5)
    holder.release()
    app.close()


def test_the_command_line_names_the_permission_it_was_refused(
    tls: TlsServer, servers: list[TlsServer]
) -> None:
    """The command line's refusal hint listed its fixed set of commands, whatever was
    refused: a ``SELECT`` of database 1, a key pattern. It now names the rule to grant."""
    _set_user(servers, "cli-user", f"{ACL_RULES} {ACL_ADDITIONS['cli']}")
    with pytest.raises(InventoryRefused) as info:
        Inventory(tls.url("cli-user", "secret").replace("/0?", "/1?"), "redlock").counters()
    assert "grant the ACL user +select;" in str(info.value), info.value
    rules = f"{ACL_RULES} {ACL_ADDITIONS['cli']}".replace("~redlock:*", "~other:*")
    _set_user(servers, "cli-user", rules)
    admin = tls.admin()
    try:
        admin.hset("redlock:stats:acl.counted", "acquired", 1)
        with pytest.raises(InventoryRefused) as info:
            Inventory(tls.url("cli-user", "secret"), "redlock").counters()
        assert "grant the ACL user ~redlock:*;" in str(info.value), info.value
    finally:
        admin.delete("redlock:stats:acl.counted")
        admin.close()


def test_a_replace_call_refused_by_the_acl_is_published_with_a_permission_warning(
    tls: TlsServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22 item 3. Without ``+hget +hset +hdel`` the call is still published (it will
    run, unmarked), and the caller's WARNING says permission, naming what to grant; not
    "Redis is unavailable"."""
    redis_server.client().flushall()
    app = make_app(redis_server, "acl-replace", redlock_url=tls.url("redlock", "secret"))

    @app.task(base=LockedTask, lock_enqueue="replace", shared=False)
    def replaced() -> None: ...

    @app.task(shared=False)
    @single_instance(debounce=5)
    def debounced() -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
        replaced.delay()
        debounced.delay()
    warnings = [r.getMessage() for r in caplog.records if "newest-call marker" in r.getMessage()]
    assert len(warnings) == 2
    for warning in warnings:
        assert "refused permission" in warning and "+hget +hset +hdel" in warning, warning
        assert "unavailable" not in warning and warning.count("script runs") == 1
    broker = redis_py.Redis(port=redis_server.port, db=1)
    try:
        messages = [json.loads(m)["headers"] for m in broker.lrange("celery", 0, -1)]
    finally:
        broker.close()
    assert [m["redlock_newest"] for m in messages] == [False, False]  # published, unmarked
    app.close()


def test_the_guide_gives_each_feature_its_acl_addition() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    for addition in ACL_ADDITIONS.values():
        assert f"`{addition}`" in guide, addition


class _TlsSentinel(SentinelServer):
    """A Sentinel that reaches a TLS primary over TLS; with ``tls_only``, it takes clients on a
    TLS port alone (``port 0``), else on a plain one."""

    def __init__(self, primary: TlsServer, tls_only: bool) -> None:
        super().__init__(primary.server)
        self.tls, self.tls_only = primary, tls_only

    def command(self) -> list[str]:
        command = super().command()
        certs = self.tls.certs
        lines = [
            f"sentinel auth-pass {SERVICE} {self.tls.admin_password}",
            "tls-replication yes",
            f"tls-cert-file {certs.server_cert}",
            f"tls-key-file {certs.server_key}",
            f"tls-ca-cert-file {certs.ca}",
        ]
        if self.tls_only:  # and an ACL user of its own, the default one off
            lines += ["port 0", f"tls-port {self.port}", "user default off"]
            lines += ["user watcher on >watch-pw allcommands allchannels"]
        with self.conf.open("a") as conf:
            conf.write("\n".join(lines) + "\n")
        return command

    def client(self) -> redis_py.Redis:
        if not self.tls_only:
            return super().client()
        certs = self.tls.certs
        return redis_py.Redis(
            host="127.0.0.1",
            port=self.port,
            ssl=True,
            ssl_ca_certs=certs.ca,
            ssl_certfile=certs.client_cert,
            ssl_keyfile=certs.client_key,
            socket_timeout=2,
            username="watcher",
            password="watch-pw",
        )


@pytest.mark.parametrize("tls_only", [False, True], ids=["plain-sentinel", "tls-sentinel"])
def test_rediss_sentinel_reaches_the_primary_over_tls_and_the_sentinels_as_told(
    certs: Certs, tls: TlsServer, tls_only: bool
) -> None:
    """``rediss+sentinel://`` is TLS to the primary; the Sentinels are reached over TLS with
    ``sentinel_ssl=true`` (the URL's certificates), else over plain TCP, as redis-py's and
    kombu's Sentinel clients do. Helper probe, round 3, session 22: Sentinels that take TLS
    only could not be used at all ("No master found", the connection reset), nor Sentinels
    with an ACL user (``sentinel_username``)."""
    with _TlsSentinel(tls, tls_only) as sentinel:
        query = (
            f"ssl_ca_certs={certs.ca}&ssl_certfile={certs.client_cert}"
            f"&ssl_keyfile={certs.client_key}"
        )
        base = f"rediss+sentinel://redlock:secret@127.0.0.1:{sentinel.port}/{SERVICE}/0?{query}"
        if tls_only:
            base += "&sentinel_username=watcher&sentinel_password=watch-pw"
        url = base + ("&sentinel_ssl=true" if tls_only else "")
        lock = Lock(url, "via-sentinel", ttl=10)
        wait_until(lambda: _answers(lock), 10, "the Sentinel to name its primary")
        assert lock.held and tls.admin().exists(lock.key)
        lock.release()
        if tls_only:  # without it, the plain connection to the TLS port is reset
            with pytest.raises(LockUnavailable, match="sentinel_ssl=true"):
                Lock(base, "via-sentinel", ttl=10).acquire(blocking=False)


def _answers(lock: Lock) -> bool:
    with contextlib.suppress(LockUnavailable):
        return bool(lock.acquire(blocking=False))
    return False
