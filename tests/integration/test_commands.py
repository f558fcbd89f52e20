"""The lock's direct command path (:mod:`celery_redlock._redis.commands`), pinned on every
redis-py and valkey version of the test matrix: what it sends, what it returns, when it steps
aside for ``execute_command``, and how it fails."""

from __future__ import annotations

import functools
import gc
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redlock._redis import commands
from celery_redlock._redis.commands import execute, pack
from celery_redlock.testing import RedisServer

try:
    import valkey
except ImportError:  # the lowest-dependency session has no valkey
    valkey = None

LIBRARIES = [
    "redis",
    pytest.param("valkey", marks=pytest.mark.skipif(valkey is None, reason="no valkey")),
]


def client_of(library: str, url: str, **options: Any) -> Any:
    module = redis_py if library == "redis" else valkey
    cls = module.Redis if library == "redis" else module.Valkey
    return cls.from_url(url, **options)


@pytest.fixture(params=LIBRARIES)
def client(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Any]:
    made = client_of(request.param, redis_url)
    yield made
    made.close()


def library_calls(run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()``'s result, and how many times a library's own ``execute_command`` ran in it.

    The garbage collector is off meanwhile: a collection in ``run()`` can finalize an earlier
    test's Celery result, whose ``__del__`` unsubscribes through a ``PubSub.execute_command``
    of ``redis.client`` (seen once in CI: 3 calls counted where the client made 1)."""
    calls = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        library = frame.f_globals.get("__name__") in ("redis.client", "valkey.client")
        if event == "call" and code.co_name == "execute_command" and library:
            calls.append(code)

    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return result, len(calls)


@pytest.mark.parametrize(
    "args",
    [
        ("SET", "redlock:{t:ab}", "0f|12|1700000000000|hôst|id", "NX", "PX", 30000, "GET"),
        ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "token", 0, "1"),
        ("SET", b"\x00\xffbytes", b"", "PX", -1),
        ("SET", "k" * 2000, b"v" * 1500, "PX", 1, "x" * 1023, b"y" * 1024),  # long lengths
    ],
)
@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_the_packer_sends_the_bytes_the_library_packs(
    args: tuple[Any, ...], encoding: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed afresh and then from the kept short arguments (a second call), per encoding."""
    monkeypatch.setattr(commands, "_packed", {})
    for library in ("redis", "valkey") if valkey is not None else ("redis",):
        connection = client_of(
            library, redis_url, encoding=encoding
        ).connection_pool.make_connection()
        expected = b"".join(connection.pack_command(*args))
        assert pack(connection.encoder, args) == expected
        assert pack(connection.encoder, args) == expected


def test_the_packer_keeps_short_ascii_text_and_integers_within_bounds(
    monkeypatch: pytest.MonkeyPatch, r: redis_py.Redis
) -> None:
    """Keys and tokens (longer than a script digest) and non-ASCII text are never kept, and at
    most ``PACKED_MAX`` of each kind per encoding."""
    monkeypatch.setattr(commands, "_packed", {})
    monkeypatch.setattr(commands, "PACKED_MAX", 3)
    encoder = r.connection_pool.make_connection().encoder
    pack(encoder, ("SET", "b" * 41, "hôst", "a" * 40, 7, 8, 9, 10, "NX", "PX"))
    texts, numbers = commands._packed[encoder.encoding]
    assert sorted(texts) == ["NX", "SET", "a" * 40]
    assert sorted(numbers) == [7, 8, 9]


def test_a_kept_integer_does_not_let_a_bool_through(r: redis_py.Redis) -> None:
    """``True == 1`` and they hash alike: the type is checked before the kept packing."""
    encoder = r.connection_pool.make_connection().encoder
    pack(encoder, ("SET", "k", 1))
    with pytest.raises(TypeError, match="bool"):
        pack(encoder, ("SET", "k", True))


def test_the_packer_refuses_a_type_it_does_not_send(r: redis_py.Redis) -> None:
    connection = r.connection_pool.make_connection()
    with pytest.raises(TypeError, match="float"):
        pack(connection.encoder, ("SET", "k", 1.5))


def test_a_plain_client_gets_the_replies_of_execute_command_without_calling_it(client: Any) -> None:
    client.delete("direct")
    command = ("SET", "direct", "mine", "PX", 60000, "GET")  # NX with GET needs Redis 7.0
    first, calls = library_calls(lambda: execute(client, *command, get=True))
    assert (first, calls) == (None, 0)
    second, calls = library_calls(lambda: execute(client, *command, get=True))
    assert (second, calls) == (b"mine", 0)
    assert second == client.execute_command(*command, get=True)
    script = "return {KEYS[1], ARGV[1], 7}"
    sha = client.script_load(script)
    reply, calls = library_calls(lambda: execute(client, "EVALSHA", sha, 1, "k", "v"))
    assert (reply, calls) == ([b"k", b"v", 7], 0)


def test_a_reply_error_is_raised_and_the_connection_goes_back_to_the_pool(client: Any) -> None:
    pool = client.connection_pool
    execute(client, "PING")
    with pytest.raises(Exception) as raised:  # the library's own class, checked by name
        execute(client, "EVALSHA", "0" * 40, 0)
    assert "NoScriptError" in {cls.__name__ for cls in type(raised.value).__mro__}
    assert len(pool._in_use_connections) == 0
    assert execute(client, "PING") in (b"PONG", True)


def wrapped(client: Any) -> list[tuple[Any, ...]]:
    """Wrap ``client.execute_command`` on the instance, recording each call."""
    seen: list[tuple[Any, ...]] = []
    original = client.execute_command

    def recording(*args: Any, **options: Any) -> Any:
        seen.append(args)
        return original(*args, **options)

    client.execute_command = recording
    return seen


def test_an_instance_wrapper_and_a_single_connection_client_take_execute_command(
    redis_url: str,
) -> None:
    for options in ({}, {"single_connection_client": True}):
        made = redis_py.Redis.from_url(redis_url, **options)
        seen = wrapped(made)
        assert execute(made, "SET", "instrumented", "v", "PX", 1000) in (b"OK", True)
        assert seen == [("SET", "instrumented", "v", "PX", 1000)]
        made.close()


def test_a_class_wrapper_takes_execute_command(redis_url: str) -> None:
    """A wrapper installed on the class, as OpenTelemetry's and Sentry's Redis
    instrumentations install theirs (``functools.wraps`` copies the name and module)."""
    seen: list[tuple[Any, ...]] = []

    class Instrumented(redis_py.Redis):  # type: ignore[misc]
        pass

    original = redis_py.Redis.execute_command

    @functools.wraps(original)
    def traced(self: Any, *args: Any, **options: Any) -> Any:
        seen.append(args)
        return original(self, *args, **options)

    Instrumented.execute_command = traced
    made = Instrumented.from_url(redis_url)
    assert execute(made, "PING") in (b"PONG", True)
    assert seen == [("PING",)]
    made.close()


@pytest.mark.parametrize(("retry_on_timeout", "handed"), [(False, 0), (True, 1)])
def test_a_server_that_stops_answering_costs_what_the_retry_policy_says(
    retry_on_timeout: bool, handed: int
) -> None:
    """A time-out on the direct path is raised at once when the client's retry policy does not
    retry time-outs (redis-py's default), as ``execute_command`` would: one socket timeout,
    not two. A policy that retries them gets the command handed to ``execute_command``. Either
    way its error is raised, no connection is left checked out, and the direct path serves
    again once the server answers."""
    with RedisServer() as server:
        made = redis_py.Redis.from_url(
            server.url,
            socket_timeout=0.3,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=retry_on_timeout,
        )
        assert execute(made, "PING") in (b"PONG", True)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        failed: list[BaseException] = []

        def attempt() -> None:
            try:
                execute(made, "PING")
            except redis_py.TimeoutError as exc:
                failed.append(exc)

        try:
            _, calls = library_calls(attempt)
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert len(failed) == 1 and calls == handed
        assert len(made.connection_pool._in_use_connections) == 0
        reply, calls = library_calls(lambda: execute(made, "PING"))
        assert (reply in (b"PONG", True), calls) == (True, 0)
        made.close()


#: A process of its own (redis-py's observability and OpenTelemetry's meter provider are set
#: once per process): the Redis operations redis-py recorded for one lock's acquire and release.
OBSERVED = """
import json, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.observability.config import MetricGroup, OTelConfig
from redis.observability.providers import get_observability_instance
import celery_redlock

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.COMMAND]))
lock = celery_redlock.Lock(sys.argv[1], "observed", 30)
for _ in range(2):  # the first acquire on a connection is a script, the next a SET
    assert lock.acquire(blocking=False)
    lock.release()
names = [
    point.attributes.get("db.operation.name")
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics
    if metric.name == "db.client.operation.duration"
    for point in metric.data.data_points
]
print(json.dumps(sorted(set(filter(None, names)))))
"""


def test_with_redis_py_observability_on_the_lock_commands_are_recorded(
    r: redis_py.Redis, redis_url: str
) -> None:
    """redis-py's own command metrics (redis-py >= 7.1) see the lock's commands: with
    observability enabled the lock sends them through ``execute_command``. The release is an
    ``EVALSHA``; the acquire a ``SET ... GET`` on Redis >= 7.0 but for the first (6.2 refuses it,
    and a refused command is not recorded as an operation; the acquire script that follows is
    an ``EVALSHA``)."""
    pytest.importorskip("redis.observability.providers")
    pytest.importorskip("opentelemetry.sdk.metrics")
    major = int(str(r.info("server")["redis_version"]).split(".")[0])
    run = subprocess.run(
        [sys.executable, "-c", OBSERVED, redis_url], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    expected = {"EVALSHA", "SET"} if major >= 7 else {"EVALSHA"}
    assert expected <= set(json.loads(run.stdout.splitlines()[-1]))
