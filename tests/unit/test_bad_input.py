"""Bad input ends in a clear error naming what to fix, at registration or at the first settings
read, never per execution and never with a password in it (issue 14, rows 3 to 9 and 14, 15).

No Redis is contacted: every URL here is only parsed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task, beat, signals
from celery.apps.beat import Beat

import celery_redlock.asyncio
from celery_redlock import LockConfigError, LockedTask, lock_key, single_instance
from celery_redlock._celery import routing
from celery_redlock._celery.options import MAX_SECONDS, reset_settings, settings_for
from celery_redlock._celery.wiring import check_app
from celery_redlock._redis import keys as _keys
from celery_redlock._redis.clients import redact, redact_url
from celery_redlock.testing import hold_lock

LOCK_URL = "redis://127.0.0.1:1/0"  # never connected to
PASSWORD = "hunter2"
#: URLs that are not URLs, with a password in them (a missing ':' or '/').
MALFORMED = [f"redis//u:{PASSWORD}@h:1/0", f"redis:/u:{PASSWORD}@h/0"]


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("bad", set_as_current=False)
    app.conf.redlock_url = LOCK_URL
    yield app
    app.close()


def declare(app: Celery, **options: Any) -> Any:
    @app.task(base=LockedTask, name="bad.task", lazy=False, **options)
    def task(account_id: Any = None) -> None:
        """A locked task."""

    return task


# -- row 4: numbers that no Redis TTL can hold ----------------------------------------------------

#: An int that no float can hold (``float()`` of it raises ``OverflowError``).
HUGE_INT = pytest.param(10**400, id="10**400")


@pytest.mark.parametrize("option", ["lock_ttl", "lock_enqueue_ttl", "lock_cooldown"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e17, HUGE_INT])
def test_a_non_finite_or_huge_task_option_is_refused_at_registration(
    app: Celery, option: str, value: float
) -> None:
    with pytest.raises(LockConfigError) as info:
        declare(app, **{option: value})
    message = str(info.value)
    assert "bad.task" in message and option in message
    assert f"<= {MAX_SECONDS:.0f}" in message  # the largest accepted value


@pytest.mark.parametrize("value", [float("inf"), 1e17, HUGE_INT])
def test_a_non_finite_or_huge_lease_is_refused_at_the_settings_read(
    app: Celery, value: float
) -> None:
    app.conf.redlock_lease = value
    with pytest.raises(LockConfigError, match=f"redlock_lease.*<= {MAX_SECONDS:.0f}"):
        settings_for(app)


# -- rows 5 and 3: URLs that no client can be built from ------------------------------------------


def test_a_url_with_a_bad_port_is_refused_at_the_settings_read(app: Celery) -> None:
    app.conf.redlock_url = "redis://:badport"
    with pytest.raises(LockConfigError, match="redlock_url"):
        settings_for(app)


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_url_is_refused_without_its_password(app: Celery, url: str) -> None:
    app.conf.redlock_url = url
    with pytest.raises(LockConfigError) as info:
        settings_for(app)
    assert "redlock_url" in str(info.value)
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)


@pytest.mark.parametrize("url", MALFORMED)
def test_a_failed_call_does_not_show_the_password_in_its_result(app: Celery, url: str) -> None:
    task = declare(app)
    app.conf.redlock_url = url
    result = task.apply(args=(1,))
    assert result.failed()
    assert isinstance(result.result, LockConfigError)
    assert PASSWORD not in str(result.result)
    assert PASSWORD not in (result.traceback or "")


#: URLs that parse but that no client could use, and what the refusal says.
UNUSABLE = [
    (f"redis://admin:{PASSWORD}/abc@h:1/0", "percent-encode"),
    (f"redis+sentinel://:{PASSWORD}/x@h:1/m", "percent-encode"),
    (f"redis://:{PASSWORD}@h:1/l", "database '/l' is not a number"),
    (f"redis://:{PASSWORD}@h:1/0?sockettimeout=3", "did you mean 'socket_timeout'?"),
    (f"rediss://:{PASSWORD}@h:1/0?ssl_ca_cert=ca.pem", "did you mean 'ssl_ca_certs'?"),
    (f"redis://:{PASSWORD}@h:1/0?ssl_ca_certs=ca.pem", "TLS options need a rediss:// URL"),
    (f"redis://:{PASSWORD}@h:1/0?ssl=true", "TLS options need a rediss:// URL"),
    ("unix:///tmp/redis.sock?ssl_cert_reqs=none", "a query option is not one redis-py takes"),
    (f"rediss://:{PASSWORD}@h:1/0?ssl_cert_reqs=maybe", "maybe"),
    (f"redis://:{PASSWORD}@h:1/0?socket_timeout=abc", "socket_timeout"),
    (f"redis+sentinel://:{PASSWORD}@h:1/", "names the service"),
    (f"redis+sentinel://:{PASSWORD}@h:1/mymaster/x", "names the service"),
    (f"redis+sentinel://:{PASSWORD}@h:1/m?socket_timeout=3", "'socket_timeout' is not taken"),
    (f"rediss+sentinel://:{PASSWORD}@h:1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs takes"),
    (f"rediss+sentinel://:{PASSWORD}@h:1/m?sentinel_ssl=yes", "sentinel_ssl takes true or false"),
    (f"redis+sentinel://:{PASSWORD}@h:1/m?sentinel_ssl=true", "'sentinel_ssl' is not taken"),
    (f"redis+cluster://:{PASSWORD}@h:1/3", "database 0 only"),
    (f"redis+sentinel://:{PASSWORD}@[::1]:x/m", "a port is not a number"),
    (f"redis+cluster://:{PASSWORD}@h:1,h:/", "a port is not a number"),
    (f"redis://:{PASSWORD}@h:1/1;redis://h:2/1", "failover form"),
    (f"redis://h:1/1,redis://:{PASSWORD}@h:2/1,redis://h:3/1", "a list of URLs, not one string"),
    (f"redis://:{PASSWORD}@h:1/1, rediss://h:2/1", "a list of URLs, not one string"),
    (f"redis://u:p/{PASSWORD} x@h:1/0", "percent-encode"),
    (f"redis://u:p'{PASSWORD}@h:1/0x", "database '/0x'"),
    # Helper probe, round 3: each was taken, then every call found Redis "unavailable" (or,
    # for -1, failed with redis-py's ValueError from settimeout).
    (f"redis://:{PASSWORD}@h:1/0?socket_timeout=-1", "socket_timeout is -1.0; expected seconds"),
    (f"redis://:{PASSWORD}@h:1/0?socket_timeout=0", "socket_timeout is 0.0; expected seconds"),
    (f"redis://:{PASSWORD}@h:1/0?socket_connect_timeout=0", "socket_connect_timeout is 0.0"),
    ("unix://", "it names no socket path"),
    (f"redis://:{PASSWORD}@h:0/0", "its port is 0"),
    (f"redis://:{PASSWORD}@h ", "ends with a space"),
    # Helper probe, round 3 (topologies): a raw '?' in a password read as "its port is not a
    # number".
    (f"redis://u:{PASSWORD}?x@h:1/0", "holds '/', '?' or '#': percent-encode them"),
]


def test_a_url_ending_in_a_line_break_is_taken(app: Celery) -> None:
    """Review, round 3: a URL read from a file keeps its line break, which urlsplit and
    redis-py drop: it worked, as a broker URL that redlock_url falls back to does in kombu,
    and must not be refused with the trailing space that does not work."""
    app.conf.redlock_url = "redis://h:1/0\n"
    assert settings_for(app).url == "redis://h:1/0\n"


@pytest.mark.parametrize(("url", "says"), UNUSABLE)
def test_an_unusable_url_is_refused_at_the_settings_read_without_its_password(
    app: Celery, url: str, says: str
) -> None:
    app.conf.redlock_url = url
    with pytest.raises(LockConfigError, match="setting redlock_url=") as info:
        settings_for(app)
    assert says in str(info.value)
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize(("url", "says"), UNUSABLE)
def test_an_unusable_url_given_to_a_lock_is_a_value_error_without_its_password(
    url: str, says: str
) -> None:
    async def acquire() -> None:
        await celery_redlock.asyncio.Lock(url, "job").acquire(blocking=False)

    attempts = [lambda: celery_redlock.Lock(url, "job").acquire(blocking=False)]
    if "+" not in url.partition("://")[0]:  # the asyncio Lock takes Sentinel/Cluster clients only
        attempts.append(lambda: asyncio.run(acquire()))
    for attempt in attempts:
        with pytest.raises(ValueError, match="is not a valid Redis URL") as info:
            attempt()
        assert says in str(info.value)
        assert PASSWORD not in str(info.value)


@pytest.mark.parametrize("url", ["", "http://x", "  "])
def test_a_url_of_no_redis_scheme_is_quoted_and_named_alike_by_both_locks(url: str) -> None:
    """An unset environment variable (``""``) read "got : pass a redis.asyncio client
    (Sentinel, Cluster) instead" from the asyncio lock, and " is not a valid Redis URL" from
    the thread lock; a typo in the scheme pointed the asyncio user to Sentinel and Cluster."""

    async def acquire() -> None:
        await celery_redlock.asyncio.Lock(url, "job").acquire(blocking=False)

    said = []
    for attempt in (lambda: celery_redlock.Lock(url, "job"), lambda: asyncio.run(acquire())):
        with pytest.raises(ValueError) as info:
            attempt()
        said.append(str(info.value))
    assert said[0] == said[1]
    assert said[0].startswith(f"{url!r} is not a valid Redis URL: the scheme is not one of")


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:1",
        "redis://h:1/2/",
        f"redis://u:{PASSWORD}%2Fx@h:1/0",
        "unix:///tmp/redis.sock?db=3",
        "rediss://h:1/0?ssl_cert_reqs=none",
        "redis+sentinel://h:1,h:2/mymaster/1?sentinel_password=x",
        "rediss+sentinel://h:1/m?ssl_cert_reqs=required",
        "rediss+sentinel://h:1/m?sentinel_ssl=true&sentinel_username=u&sentinel_password=x",
        "redis+cluster://h:1,h:2/",
        "redis+cluster://h:1/0",
        "redis+sentinel://[::1]/mymaster",  # IPv6, the default port
        "redis+cluster://[::1]:1,[fe80::1]:2/",
        "redis://h:1//",  # kombu's form of database 0
        "unix:///run/redis@1/redis.sock",
    ],
)
def test_a_usable_url_is_accepted(app: Celery, url: str) -> None:
    app.conf.redlock_url = url
    assert settings_for(app).url == url


@pytest.mark.parametrize(
    "text",
    [
        f"redis://admin:{PASSWORD}/abc@h:1/0",
        f"redis://user:pa {PASSWORD}@h:1/0",
        f"redis+sentinel://:{PASSWORD}/pw@h:1/m",
        f"redis://u:p@{PASSWORD}@h:1/0",
        f"['redis://h:1', 'redis://u:{PASSWORD}@h:2']",
        f"redis://u:p'{PASSWORD}@h:1/0",
        f'redis://u:p"{PASSWORD}@h:1/0',
        f"redis://h:1/0?pasword={PASSWORD}",
        f"redis://h:1/0?password=p@{PASSWORD}",  # an @ in a query value, as redis-py reads it
        f"redis+sentinel://h:1/m?sentinel_password=s@{PASSWORD}:x",
    ],
)
def test_redaction_hides_passwords_with_slashes_spaces_quotes_and_at_signs(text: str) -> None:
    for hidden in (redact(text), redact_url(text)):
        assert PASSWORD not in hidden
        assert "h:1" in hidden and "***" in hidden


# -- row 6: the same node twice in a quorum -------------------------------------------------------


@pytest.mark.parametrize(
    "urls",
    [
        ["redis://127.0.0.1:7001/0", "redis://localhost:7001/0", "redis://127.0.0.1:7001"],
        ["redis://[::1]:7001/0", "redis://h:7002/0", "redis://localhost:7001/0"],
        [
            "redis+sentinel://[::1]:7001/m",
            "redis+sentinel://h:7002/m",
            "redis+sentinel://localhost:7001/m",
        ],
        # Databases of one server fail together: one crash takes every "node".
        ["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1", "redis://127.0.0.1:7001/2"],
    ],
)
def test_a_quorum_naming_one_node_twice_is_refused(app: Celery, urls: list[str]) -> None:
    app.conf.redlock_url = urls
    with pytest.raises(LockConfigError, match="same node twice"):
        settings_for(app)


@pytest.mark.parametrize("scheme", ["redis+cluster", "rediss+cluster"])
def test_a_cluster_listed_as_a_quorum_node_is_refused_by_the_settings_and_the_lock(
    app: Celery, scheme: str
) -> None:
    """Accepted, it made every lock operation fail with an ``AttributeError`` of the Cluster
    client (it has no pool of one node), at the first call and in every task."""
    urls = ["redis://h1:7001/0", "redis://h2:7001/0", f"{scheme}://u:{PASSWORD}@h3:7001/"]
    app.conf.redlock_url = urls
    with pytest.raises(LockConfigError, match="setting redlock_url is invalid") as info:
        settings_for(app)
    with pytest.raises(ValueError, match="is a Redis Cluster") as built:
        celery_redlock.Lock(urls, "job")
    for said in (str(info.value), str(built.value)):
        assert "a Redlock quorum's nodes are single servers" in said
        assert f"{scheme}://***@h3:7001/" in said and PASSWORD not in said


# -- rows 8 and 9: arguments without a canonical encoding, a lock_by that raises ------------------


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("argument", "expected"),
    [({48213: "a", "48213": 2}, "collide"), (nested(500), "nests containers deeper")],
)
def test_an_argument_without_a_canonical_encoding_is_a_type_error_naming_it(
    app: Celery, argument: Any, expected: str
) -> None:
    task = declare(app)
    with pytest.raises(TypeError) as info:
        lock_key(task, argument)
    assert "account_id" in str(info.value) and expected in str(info.value)
    assert "bad.task" in str(info.value)
    assert "48213" not in str(info.value)  # an argument's value, never shown


def _use(helper: str, task: Any) -> None:
    """Call the public helper named ``helper`` on ``task``, with one argument."""
    if helper == "lock_key":
        lock_key(task, 1)
    else:
        with hold_lock(task, 1):
            pass


@pytest.mark.parametrize("helper", ["lock_key", "hold_lock"])
def test_the_key_helpers_given_no_task_say_so(app: Celery, helper: str) -> None:
    """``lock_key`` and ``hold_lock`` given a task's ``.run``, a function, or a task name
    failed with ``AttributeError: run``; a task without a lock is a ``ValueError``."""

    @single_instance(by=["n"])
    def undecorated(n: int) -> None: ...

    task = declare(app)
    for wrong in (task.run, undecorated, "bad.task"):
        with pytest.raises(TypeError, match=re.escape(f"{helper}() takes a Celery task")):
            _use(helper, wrong)
    with pytest.raises(TypeError, match=re.escape("decorate it with @app.task too")):
        _use(helper, undecorated)

    @app.task(name="bad.plain", shared=False)
    def plain(n: int) -> int:
        return n

    with pytest.raises(ValueError, match=re.escape("bad.plain is not a locked task")):
        _use(helper, plain)


def test_a_lock_by_callable_that_raises_names_the_task_and_lock_by(app: Celery) -> None:
    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return str(kwargs["missing"])

    task = declare(app, lock_by=by)
    with pytest.raises(LockConfigError) as info:
        lock_key(task, 1)
    # "task X:", as every other message names a task (it began "bad.task:").
    assert str(info.value).startswith("task bad.task: the lock_by callable raised KeyError")
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("api", ["replace", "debounce"])
def test_a_superseding_call_whose_lock_name_cannot_be_built_is_not_published(
    app: Celery, api: str
) -> None:
    """Helper probe, round 3: under ``keep`` such a ``delay()`` raised, under ``replace`` and
    debounce it was published with a WARNING that it "will run, not superseded", and the
    worker failed it. Now it raises in the caller too, under both APIs."""
    app.conf.broker_url = "memory://"

    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return str(kwargs["missing"])

    if api == "replace":
        task = declare(app, lock_by=by, lock_enqueue="replace")
    else:

        @app.task(name="bad.task", lazy=False)
        @single_instance(by=by, debounce=5)
        def task(account_id: int) -> None: ...

    published: list[Any] = []

    def count(**kwargs: Any) -> None:
        published.append(kwargs)

    signals.before_task_publish.connect(count, weak=False)
    try:
        with pytest.raises(LockConfigError) as info:
            task.delay(1)
        assert "bad.task" in str(info.value) and "lock_by" in str(info.value)
        with pytest.raises(LockConfigError):
            task.apply_async((1,), countdown=1)
        assert published == []
        task.apply_async((1,), lock_bypass=True)  # no lock, so no lock name to build
        assert len(published) == 1
    finally:
        signals.before_task_publish.disconnect(count)


# -- row 14: the keyed digest ---------------------------------------------------------------------


def test_a_key_secret_changes_every_key_and_keys_by_the_secret(app: Celery) -> None:
    task = declare(app)
    plain = lock_key(task, 48213)
    other = Celery("bad", set_as_current=False)
    other.conf.update(redlock_url=LOCK_URL, redlock_key_secret="s3cret")
    keyed_task = declare(other)
    keyed = lock_key(keyed_task, 48213)
    assert keyed != plain and keyed.rsplit(":", 1)[0] == plain.rsplit(":", 1)[0]
    assert lock_key(keyed_task, 48213) == keyed  # stable
    other.conf.redlock_key_secret = b"s3cret"  # bytes and str of the same secret agree
    reset_settings(other)
    assert lock_key(keyed_task, 48213) == keyed
    other.conf.redlock_key_secret = "another"
    reset_settings(other)
    assert lock_key(keyed_task, 48213) not in (plain, keyed)
    assert "s3cret" not in repr(settings_for(other)) and "another" not in repr(settings_for(other))
    other.close()


@pytest.mark.parametrize(
    "url",
    [f"redis://u:{PASSWORD}@h:1/0", [f"redis://u:{PASSWORD}@h{i}:1/0" for i in range(3)]],
    ids=["one", "quorum"],
)
def test_the_settings_repr_hides_the_url_password(url: Any) -> None:
    """An error tracker that records a failing frame's locals (Sentry) records this repr."""
    other = Celery("bad", set_as_current=False)
    other.conf.redlock_url = url
    shown = repr(settings_for(other))
    assert PASSWORD not in shown and "***@h" in shown and "prefix='redlock'" in shown
    other.close()


def test_a_long_secret_is_accepted_and_digests_stay_32_hex_characters() -> None:
    canonical = b'["A",["account_id",48213]]'
    digest = _keys.digest(canonical, "x" * 200)
    assert len(digest) == 32 and digest != _keys.digest(canonical, "x" * 199)
    assert _keys.digest(canonical) != _keys.digest(canonical, "x")


@pytest.mark.parametrize("secret", ["", b"", 12345, ["s"]])
def test_an_invalid_key_secret_is_refused_without_showing_it(app: Celery, secret: Any) -> None:
    app.conf.redlock_key_secret = secret
    with pytest.raises(LockConfigError, match="redlock_key_secret"):
        settings_for(app)


# -- row 15: control characters in names ----------------------------------------------------------


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "esc\x1b[31m"])
def test_a_lock_name_or_prefix_with_a_control_character_is_refused(app: Celery, name: str) -> None:
    with pytest.raises(LockConfigError, match="control characters"):
        declare(app, lock_name=name)
    app.conf.redlock_prefix = name
    with pytest.raises(LockConfigError, match="control characters"):
        settings_for(app)


# -- the first hour (issue 24, items 1, 4 and 9; issue 22, item 12) ---------------------------


def test_a_rate_with_a_non_ascii_digit_is_a_config_error_naming_task_and_option(
    app: Celery,
) -> None:
    with pytest.raises(LockConfigError) as info:
        declare(app, lock_rate="²/s")
    assert "task bad.task: option lock_rate='²/s' is invalid" in str(info.value)
    assert "'N/s'" in str(info.value)


def test_a_task_name_with_braces_is_refused_when_the_class_is_built(app: Celery) -> None:
    with pytest.raises(LockConfigError) as info:

        @app.task(base=LockedTask, name="bad.{tagged}", lazy=False)
        def tagged() -> None: ...

    message = str(info.value)
    assert "task bad.{tagged}" in message and "hash tag" in message and "lock_name" in message


def test_a_task_name_with_braces_works_when_lock_name_names_the_lock(app: Celery) -> None:
    @app.task(base=LockedTask, name="bad.{tagged}", lazy=False, lock_name="tagged")
    def tagged() -> None: ...

    assert lock_key(tagged).startswith("redlock:{tagged:")


def test_a_decorated_task_name_with_braces_is_refused_at_its_first_use(app: Celery) -> None:
    @app.task(name="bad.{decorated}", lazy=False)
    @single_instance
    def decorated() -> None: ...

    with pytest.raises(LockConfigError, match=r"task bad\.\{decorated\}: its name contains"):
        decorated.apply().get()


def test_a_task_name_with_a_control_character_is_refused_unless_lock_name_replaces_it(
    app: Celery,
) -> None:
    """Helper probe, round 3: ``lock_name="a\\nb"`` was refused, but a task named so became
    the lock name unchecked (a line break in a key splits ``celery redlock ls``)."""
    with pytest.raises(LockConfigError) as info:

        @app.task(base=LockedTask, name="bad.a\nb", lazy=False)
        def broken() -> None: ...

    assert "task 'bad.a\\nb': its name contains '{', '}' or a non-printable character" in str(
        info.value
    )

    @app.task(base=LockedTask, name="bad.a\x00c", lock_name="renamed", lazy=False)
    def renamed() -> None: ...

    assert lock_key(renamed).startswith("redlock:{renamed:")


def test_lock_by_self_on_a_bound_lockedtask_says_what_self_is(app: Celery) -> None:
    """Helper probe, round 3: the message said only "unknown lock_by parameter 'self' (known:
    account_id)", which reads as a bug of ours on a task whose signature starts with self."""
    with pytest.raises(LockConfigError) as info:

        @app.task(base=LockedTask, bind=True, lock_by=["self"], lazy=False)
        def bound(self: Any, account_id: int) -> None: ...

    message = str(info.value)
    assert "lock_by=['self'] names 'self', which is the task itself (bind=True)" in message
    assert "expected parameter names among: account_id" in message


@pytest.mark.parametrize("api", ["LockedTask", "single_instance"])
def test_bind_true_on_a_function_without_a_task_parameter_names_both_fixes(
    app: Celery, api: str
) -> None:
    """Helper probe, round 23: ``bind=True`` on ``def sync(account_id)`` with
    ``by=["account_id"]`` said "unknown lock_by parameter 'account_id' (known: )" under
    ``base=LockedTask``, and "use by=()" under ``@single_instance``, which locks the task
    object; the fix is a parameter for the task, or no ``bind=True``."""
    with pytest.raises(LockConfigError) as info:
        if api == "LockedTask":

            @app.task(base=LockedTask, bind=True, lock_by=["account_id"], lazy=False)
            def sync(account_id: int) -> None: ...

        else:

            @app.task(name="bad.sync", bind=True, lazy=False)
            @single_instance(by=["account_id"])
            def sync(account_id: int) -> None: ...

            sync.apply(args=(1,)).get()
    message = str(info.value)
    assert "names 'account_id', which is the task itself (bind=True)" in message
    assert "expected parameter names among: none. If 'account_id' is an argument" in message
    assert "(def sync(self, account_id, ...)), or drop bind=True" in message
    assert "use by=()" not in message


def test_by_naming_the_bound_task_itself_is_refused_at_its_first_use(app: Celery) -> None:
    """``@single_instance`` checks ``by`` before ``bind=True`` is known; ``self`` is then the
    task, not an argument of the call (``lock_by=["self"]`` is refused when the class is
    built)."""

    @app.task(name="bad.bound", bind=True, lazy=False)
    @single_instance(by=["self"])
    def bound(self: Any, account_id: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        bound.apply(args=(1,)).get()
    message = str(info.value)
    assert "task bad.bound: by=['self'] names 'self', which is the task itself" in message
    assert "expected parameter names among: account_id" in message


def test_by_naming_the_bound_task_itself_is_refused_at_the_first_publish(app: Celery) -> None:
    """A ``delay()`` raises in the caller and publishes nothing: no worker would run the call
    (it used to log the error from a publish receiver and publish anyway)."""
    app.conf.update(broker_url="memory://")

    @app.task(name="bad.bound_sent", bind=True, lazy=False)
    @single_instance(by=["self"])
    def bound(self: Any, account_id: int) -> None: ...

    sent: list[Any] = []

    def publishing(headers: Any = None, **_: Any) -> None:
        sent.append(headers)

    signals.before_task_publish.connect(publishing, weak=False)
    try:
        with pytest.raises(LockConfigError, match=r"task bad\.bound_sent: by=\['self'\]"):
            bound.delay(1)
    finally:
        signals.before_task_publish.disconnect(publishing)
    assert sent == []


def test_a_misspelled_by_name_on_a_bound_function_is_not_offered_self(app: Celery) -> None:
    with pytest.raises(LockConfigError) as info:

        @app.task(name="bad.bound_typo", bind=True, lazy=False)
        @single_instance(by=["acount_id"])
        def bound(self: Any, account_id: int) -> None: ...

    message = str(info.value)
    assert "unknown by parameter 'acount_id'; did you mean 'account_id'?" in message
    assert message.endswith("(known: account_id)")


def test_a_decorator_message_keeps_the_function_name_and_the_value_as_written() -> None:
    with pytest.raises(LockConfigError) as info:

        @single_instance(name="lock_by{x}")
        def lock_rate(account_id: int) -> None: ...

    message = str(info.value)
    assert message.startswith(f"task function {__name__}.")
    assert ".lock_rate: @single_instance keyword name='lock_by{x}' is invalid" in message


def test_the_decorator_keyword_on_a_locked_task_is_refused_naming_the_task_option(
    app: Celery,
) -> None:
    with pytest.raises(LockConfigError) as info:
        declare(app, by=["account_id"])
    message = str(info.value)
    assert "task bad.task: option by=['account_id'] is not a LockedTask option" in message
    assert "lock_by=" in message


def test_a_lock_prefixed_decorator_keyword_says_to_drop_the_prefix() -> None:
    def work(account_id: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        single_instance(lock_by=["account_id"])(work)  # type: ignore[call-overload]
    assert "drop the lock_ prefix: by=" in str(info.value)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"limit": 0}, "@single_instance keyword limit=0 is invalid; expected an integer"),
        ({"ttl": "abc"}, "@single_instance keyword ttl='abc' is invalid; expected a number"),
        ({"limit": None}, "keyword limit=None (no exclusion) is invalid without rate"),
    ],
)
def test_a_bad_decorator_keyword_is_named_as_the_user_wrote_it(
    keywords: dict[str, object], named: str
) -> None:
    def work(account_id: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        single_instance(**keywords)(work)  # type: ignore[call-overload]
    message = str(info.value)
    assert named in message
    assert "lock_" not in message  # the task options' names are not what was written


def test_both_apis_on_one_task_are_refused_when_the_class_is_built(app: Celery) -> None:
    with pytest.raises(LockConfigError) as info:

        @app.task(base=LockedTask, lazy=False)
        @single_instance(by=["account_id"])
        def twice(account_id: int) -> None: ...

    message = str(info.value)
    assert "base=LockedTask and @single_instance on one task" in message
    assert "twice" in message and "contend with itself" in message


def test_a_base_call_that_skips_the_lock_is_refused_when_the_class_is_built() -> None:
    """Helper probe, round 3: a ``LockedTask`` base whose ``__call__`` ends with
    ``self.run(...)``, as Celery's guide shows for a plain ``Task``, ran every execution
    unlocked: two pool children ran ``sync_account(42)`` at once, with no warning."""

    class Session(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.run(*args, **kwargs)

    with pytest.raises(LockConfigError) as info:

        class DBTask(LockedTask):  # type: ignore[misc]
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return self.run(*args, **kwargs)

    message = str(info.value)
    assert "DBTask.__call__ does not call super().__call__" in message
    assert "every execution would run unlocked" in message
    assert "`return super().__call__(*args, **kwargs)`" in message
    with pytest.raises(LockConfigError, match=r"TaskCall.__call__ does not call super"):

        class TaskCall(LockedTask):  # type: ignore[misc]
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return Task.__call__(self, *args, **kwargs)  # past LockedTask's

    with pytest.raises(LockConfigError, match=r"Session.__call__ does not call super"):

        class Before(Session, LockedTask):  # type: ignore[misc]
            pass

    class Calls(LockedTask):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    # Review, round 3: forms that reach the lock and were refused at first.
    def logged(method: Any) -> Any:  # a decorator without functools.wraps
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return wrapper

    class Decorated(LockedTask):  # type: ignore[misc]
        @logged
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    class Explicit(Calls):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return Calls.__call__(self, *args, **kwargs)

    with pytest.raises(LockConfigError, match=r"Undecorated.__call__ does not call super"):

        class Undecorated(LockedTask):  # type: ignore[misc]
            @logged
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return self.run(*args, **kwargs)

    class After(LockedTask, Session):  # type: ignore[misc]
        pass

    assert Calls.__call__ is not LockedTask.__call__ and After.__call__ is LockedTask.__call__
    assert Decorated.__call__ is not Explicit.__call__


def test_single_instance_under_a_locked_task_cls_names_the_app_wide_base() -> None:
    """Probe: with ``Celery(task_cls=LockedTask)`` the refusal said "base=LockedTask", which
    the user never wrote, and named no way out for that one task."""
    app = Celery("task-cls", task_cls=LockedTask, set_as_current=False)
    try:
        with pytest.raises(LockConfigError) as info:

            @app.task(lazy=False)
            @single_instance(by=["account_id"])
            def once(account_id: int) -> None: ...

        assert "under Celery(task_cls=LockedTask), which makes every task a LockedTask: " in (
            str(info.value)
        )
        assert "@app.task(base=celery.Task)" in str(info.value)
    finally:
        app.close()


def test_lock_options_on_a_task_without_lockedtask_are_refused_at_start_and_first_call(
    app: Celery,
) -> None:
    @app.task(name="bad.plain", lock_by=["account_id"], lock_on_contention="wait")
    def plain(account_id: int) -> None: ...

    expected = (
        "task bad.plain: option lock_by=['account_id'] is ignored: the task is not locked; "
        "expected @app.task(base=LockedTask, lock_by=...), or @single_instance(by=...)"
    )
    with pytest.raises(LockConfigError) as info:
        check_app(app)  # what a worker runs at start
    assert expected in str(info.value)
    app.conf.broker_url = "memory://"
    with pytest.raises(LockConfigError) as info:
        plain.delay(7)  # the caller, before anything is published
    assert expected in str(info.value)


def test_a_task_option_over_single_instance_is_refused_naming_the_keyword(app: Celery) -> None:
    @app.task(name="bad.mixed", lock_on_contention="fail")
    @single_instance(by=["account_id"])
    def mixed(account_id: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        check_app(app)
    assert (
        "task bad.mixed: option lock_on_contention='fail' is given to @app.task, and "
        "@single_instance reads only its own keywords; expected @single_instance(on_contention="
    ) in str(info.value)


@pytest.mark.parametrize(
    ("option", "one", "other", "shown"),
    [
        ("limit", 1, 3, "lock_limit (1 and 3)"),
        ("rate", "3/m", "1/s", "lock_rate (3/m and 1/s)"),
    ],
)
def test_tasks_sharing_a_lock_name_must_agree_on_limit_and_rate(
    app: Celery, option: str, one: Any, other: Any, shown: str
) -> None:
    """Helper probe, round 3. A ``lock_limit=1`` task held slot 1 while a ``lock_limit=3``
    task of the same ``lock_name`` ran in slot 2; a ``1/s`` rate trimmed the shared start log
    of a ``3/m`` one. Both ran silently; the mix is now refused where options are checked."""
    extra: dict[str, Any] = {"lock_limit": None} if option == "rate" else {}

    @app.task(
        base=LockedTask, name="mix.one", lock_name="shared", **{f"lock_{option}": one}, **extra
    )
    def first() -> None: ...

    @app.task(
        base=LockedTask, name="mix.two", lock_name="shared", **{f"lock_{option}": other}, **extra
    )
    def second() -> None: ...

    @app.task(base=LockedTask, name="mix.own", **{f"lock_{option}": other}, **extra)
    def own() -> None: ...  # its own name: nothing shared

    with pytest.raises(LockConfigError) as info:
        check_app(app)  # what a worker runs at start
    assert str(info.value) == (
        f"tasks mix.one and mix.two share the lock name 'shared' but not {shown}: they would "
        f"not limit each other; give them the same lock_{option}, or each a lock_name of its own"
    )


def test_tasks_sharing_a_lock_name_but_no_key_may_differ(app: Celery) -> None:
    """The identity encodes the parameters' names: ``by_account(account_id)`` and
    ``by_order(order_id)`` under one ``lock_name`` never share a key, and may have their own
    ``lock_limit`` (the check refused them, and the worker would not start)."""

    @app.task(base=LockedTask, name="mix.account", lock_name="billing", lock_limit=3)
    def by_account(account_id: int) -> None: ...

    @app.task(base=LockedTask, name="mix.order", lock_name="billing")
    def by_order(order_id: int) -> None: ...

    check_app(app)
    assert lock_key(by_account, 7) != lock_key(by_order, 7)


@pytest.mark.parametrize(
    ("value", "hint"), [("60", "write lock_ttl=60"), ("0.5", "write lock_ttl=0.5")]
)
def test_a_number_given_as_text_says_to_write_the_number(
    app: Celery, value: str, hint: str
) -> None:
    @app.task(base=LockedTask, name="bad.text", lock_ttl=value)
    def text() -> None: ...

    with pytest.raises(LockConfigError, match=re.escape(f", not a string: {hint}")):
        check_app(app)


KEEP = {"lock_enqueue": True}
UNTIL_EXECUTED = {"lock_enqueue": "until_executed"}
REPLACE = {"lock_enqueue": "replace"}
DEBOUNCE = {"lock_debounce": 0.5}
QUEUED = "lock_enqueue"
NEWEST = "lock_enqueue='replace' or lock_debounce"


@pytest.mark.parametrize(
    ("one", "other", "kind"),
    [
        (KEEP, KEEP, QUEUED),
        (KEEP, UNTIL_EXECUTED, QUEUED),
        (REPLACE, REPLACE, NEWEST),
        (REPLACE, DEBOUNCE, NEWEST),
        (DEBOUNCE, DEBOUNCE, NEWEST),
    ],
)
def test_tasks_sharing_a_lock_name_may_not_both_mark_their_queued_calls(
    app: Celery, one: dict[str, Any], other: dict[str, Any], kind: str
) -> None:
    """Helper probe, round 3. Two ``lock_enqueue=True`` tasks under one ``lock_name``: a call
    of the second found the first's queued marker and returned the first's call, so its body
    never ran and its caller got the first's result; under ``replace`` the second's call
    superseded the first's. Such a pair is refused where options are checked."""

    @app.task(base=LockedTask, name="mark.one", lock_name="shared", **one)
    def first(k: int) -> None: ...

    @app.task(base=LockedTask, name="mark.two", lock_name="shared", **other)
    def second(k: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        check_app(app)  # what a worker runs at start
    assert str(info.value) == (
        f"tasks mark.one and mark.two share the lock name 'shared' and both use {kind}: a call "
        "of one would be taken for a call of the other (a queued call of the key is its "
        "marker's, whatever its task); give them each a lock_name of its own, or "
        f"{kind} to one of them only"
    )


@pytest.mark.parametrize(
    ("one", "other"), [(KEEP, REPLACE), (KEEP, {}), (DEBOUNCE, {}), (UNTIL_EXECUTED, DEBOUNCE)]
)
def test_tasks_sharing_a_lock_name_may_keep_markers_of_different_kinds(
    app: Celery, one: dict[str, Any], other: dict[str, Any]
) -> None:
    """The queued marker and the newest-call marker are different keys, and a task keeping
    neither reads neither: such pairs exclude each other and keep their markers apart."""

    @app.task(base=LockedTask, name="mark.one", lock_name="shared", **one)
    def first(k: int) -> None: ...

    @app.task(base=LockedTask, name="mark.two", lock_name="shared", **other)
    def second(k: int) -> None: ...

    @app.task(base=LockedTask, name="mark.own", lock_name="shared", **one)
    def own(other_key: int) -> None: ...  # another identity: never the same key

    check_app(app)


def test_lock_options_a_task_reads_are_not_refused(app: Celery) -> None:
    app.conf.task_annotations = {"*": {"lock_on_contention": "wait"}}

    class HandRolled(Task):  # type: ignore[misc]
        """A lock base of the user's own, whose option has one of our names."""

        lock_ttl = 30

    @app.task(base=HandRolled, name="bad.own", lock_ttl=60)
    def own() -> None: ...

    @app.task(name="bad.annotated")  # reached by the "*" annotation meant for locked tasks
    def annotated() -> None: ...

    declare(app, lock_by=["account_id"])
    check_app(app)
    assert app.tasks["bad.annotated"].lock_on_contention == "wait"


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (
            "plain",
            "task an.t: option lock_ttl=60 (from task_annotations['an.t']) is ignored: the task "
            "is not locked; expected @app.task(base=LockedTask, lock_ttl=...), or "
            "@single_instance(ttl=...) under @app.task",
        ),
        (
            "single_instance",
            "task an.t: option lock_ttl=60 is given to task_annotations['an.t'], and "
            "@single_instance reads only its own keywords; expected @single_instance(ttl=...)",
        ),
    ],
)
def test_a_task_annotation_naming_a_task_that_does_not_read_it_is_refused(
    app: Celery, api: str, expected: str
) -> None:
    """Helper probe, round 3: ``{"an.t": {"lock_ttl": 60}}`` on a plain task, and on an
    ``@single_instance`` one, was ignored without a word; only ``"*"``, which reaches every
    task, is left alone."""
    app.conf.task_annotations = {"an.t": {"lock_ttl": 60}, "*": {"lock_retry_countdown": 1}}

    def t() -> None: ...

    app.task(name="an.t")(single_instance(t) if api == "single_instance" else t)
    with pytest.raises(LockConfigError) as info:
        check_app(app)
    assert str(info.value) == expected


def test_a_task_annotation_of_a_hand_rolled_lock_base_s_option_is_left_alone(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Review, round 3: a base class of the user's own that reads ``lock_ttl`` itself, tuned
    per task by ``task_annotations``, stopped the worker (an option its base defines is a
    WARNING, as given to ``@app.task``)."""

    class MyLockBase(Task):  # type: ignore[misc]
        lock_ttl = 30

    app.conf.task_annotations = {"an.report": {"lock_ttl": 60}}

    @app.task(base=MyLockBase, name="an.report")
    def report() -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.config"):
        check_app(app)
    assert app.tasks["an.report"].lock_ttl == 60
    assert [r.getMessage() for r in caplog.records] == [
        "task an.report: option lock_ttl of its base class MyLockBase is not read: MyLockBase "
        "is not a LockedTask, and the task takes no lock; if MyLockBase is meant to lock, "
        "expected class MyLockBase(LockedTask)"
    ]


def test_lock_options_of_a_base_class_that_is_not_lockedtask_are_warned_about(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3: ``lock_by`` on a base class that forgot ``LockedTask`` made its
    tasks run unlocked, and nothing said so (a ``lock_*`` given to ``@app.task`` is refused).
    A warning, not a refusal: such a base may be a hand-rolled lock that reads them itself."""

    class PlainBase(Task):  # type: ignore[misc]
        lock_by = ("account_id",)
        lock_on_contention = "fail"

    @app.task(base=PlainBase, name="bad.base")
    def forgot(account_id: int) -> None: ...

    @app.task(base=PlainBase, name="bad.base_single")
    @single_instance(by=["account_id"])
    def single(account_id: int) -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.config"):
        check_app(app)  # what a worker runs at start
        check_app(app)  # once per task
    assert sorted(r.getMessage() for r in caplog.records) == [
        "task bad.base: option lock_by, lock_on_contention of its base class PlainBase is not "
        "read: PlainBase is not a LockedTask, and the task takes no lock; if PlainBase is meant "
        "to lock, expected class PlainBase(LockedTask)",
        "task bad.base_single: option lock_by, lock_on_contention of its base class PlainBase "
        "is not read: @single_instance reads only its own keywords",
    ]


def test_the_wrong_order_error_names_the_real_function(app: Celery) -> None:
    with pytest.raises(TypeError) as info:

        @single_instance
        @app.task  # the app is not finalized: a lazy proxy of the task
        def sync_account(account_id: int) -> None: ...

    assert "def sync_account(...)" in str(info.value)
    assert "my_task" not in str(info.value)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"lock_limit": None}, "without lock_rate"),
        ({"lock_limit": None, "lock_rate": "1/s", "lock_cooldown": 5}, "lock_cooldown=5"),
    ],
)
def test_no_exclusion_is_refused_without_a_rate_or_with_a_cooldown(
    app: Celery, options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(LockConfigError) as info:
        declare(app, **options)
    assert "option lock_limit=None (no exclusion) is invalid" in str(info.value)
    assert expected in str(info.value)


def test_a_setting_given_as_a_task_option_names_the_setting(app: Celery) -> None:
    """``lock_lease=5`` was "did you mean 'lock_rate'?": the lease is an app setting."""
    with pytest.raises(LockConfigError) as info:
        declare(app, lock_lease=5)
    assert "unknown option 'lock_lease': lease is an app setting" in str(info.value)
    assert "app.conf.redlock_lease" in str(info.value) and "lock_rate" not in str(info.value)


def test_lock_enqueue_names_every_accepted_value(app: Celery) -> None:
    with pytest.raises(LockConfigError) as info:
        declare(app, lock_enqueue="yes")
    assert "one of False, True ('keep'), 'until_executed' or 'replace'" in str(info.value)
    with pytest.raises(LockConfigError, match=r"did you mean 'replace'\?"):
        declare(app, lock_enqueue="replaced")


def test_a_lease_below_a_millisecond_is_refused_as_lock_ttl_is(app: Celery) -> None:
    """A lease of 0.0001 s was accepted: every lock was lost right after it was taken."""
    app.conf.redlock_lease = 0.0001
    with pytest.raises(LockConfigError, match=r"redlock_lease=0\.0001 is invalid.*at least 0\.001"):
        settings_for(app)


def test_lock_by_listing_a_parameter_twice_is_refused(app: Celery) -> None:
    """``lock_by=["account_id", "account_id"]`` was accepted: most likely a typo for another
    parameter, which the key then leaves out."""
    with pytest.raises(LockConfigError, match=r"'account_id' is listed twice") as info:
        declare(app, lock_by=["account_id", "account_id"])
    assert "bad.task" in str(info.value) and "lock_by" in str(info.value)


def test_a_beat_entry_with_a_refused_lock_option_is_logged_when_beat_starts(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3: ``"options": {"lock_cooldown": 50}`` (a task option) in a
    ``beat_schedule`` entry was refused only at the entry's first tick, and at every tick
    after, with nothing said when beat started."""
    task = declare(app)
    app.conf.beat_schedule = {
        "report": {"task": task.name, "schedule": 60.0, "options": {"lock_cooldown": 50}},
        "fine": {"task": task.name, "schedule": 60.0, "options": {"lock_ttl": 60}},
        "elsewhere": {"task": "other.app.task", "schedule": 60.0, "options": {"lock_ttl": "x"}},
    }
    with caplog.at_level(logging.ERROR, logger="celery_redlock.worker"):
        signals.beat_init.send(sender=Beat(app=app))  # as celery beat sends it, at its start
    assert [r.getMessage() for r in caplog.records] == [
        "beat_schedule entry 'report' is never sent until fixed: task bad.task: option "
        "lock_cooldown cannot be given per call; expected one of lock_on_contention, "
        "lock_wait_timeout, lock_ttl, lock_retry_countdown or lock_bypass"
    ]


def test_a_bad_setting_is_logged_when_beat_starts(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Beat probe, round 3: ``redlock_lease = -1`` with a ``lock_enqueue`` task in a beat
    entry: beat started without a word, and every tick was refused from then on."""
    declare(app, lock_enqueue=True)
    app.conf.redlock_lease = -1
    with caplog.at_level(logging.ERROR, logger="celery_redlock.worker"):
        signals.beat_init.send(sender=Beat(app=app))
    assert [r.getMessage() for r in caplog.records] == [
        "celery beat: app 'bad': setting redlock_lease=-1 is invalid; expected a number of "
        "seconds > 0 (at least 0.001: whole milliseconds) and <= 315360000; until fixed, the "
        "calls it sends with lock_enqueue or a lock_debounce are refused, and workers refuse to "
        "start"
    ]


def test_a_beat_whose_scheduler_keeps_its_entries_elsewhere_is_not_checked(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Probe, round 23: under django-celery-beat, which copies ``beat_schedule`` into its
    database without the options it does not know, the ERROR said an entry "is never sent"
    while it was sent every tick."""
    task = declare(app)
    app.conf.beat_schedule = {
        "report": {"task": task.name, "schedule": 60.0, "options": {"lock_cooldown": 50}},
    }
    with caplog.at_level(logging.ERROR, logger="celery_redlock.worker"):
        for scheduler in (
            "django_celery_beat.schedulers:DatabaseScheduler",
            f"{__name__}:Elsewhere",
        ):
            signals.beat_init.send(sender=Beat(app=app, scheduler=scheduler))
        assert caplog.records == []
        for ours in (
            "celery.beat.PersistentScheduler",
            "celery.beat:Scheduler",
            f"{__name__}:Mine",
        ):
            signals.beat_init.send(sender=Beat(app=app, scheduler=ours))
    assert len(caplog.records) == 3, [r.getMessage() for r in caplog.records]


class Elsewhere(beat.Scheduler):
    """A scheduler that keeps its entries elsewhere (as django-celery-beat's does)."""


class Mine(beat.PersistentScheduler):
    """A project's own ``PersistentScheduler``: it sends ``beat_schedule`` with its options."""


def test_a_lock_name_the_router_built_serves_only_the_call_it_was_built_for(app: Celery) -> None:
    """Review, round 3: the router notes the lock name it built so that the receiver does not
    call ``lock_by`` again. A publish that failed after routing left its name noted, and the
    next publish of that task in the thread, if not routed, would be numbered under it."""
    task = declare(app, lock_enqueue="replace", lock_by=["account_id"])
    routing.check_lock_options(task.name, (1,), {}, {}, task=task)
    assert routing.routed_lock_name(task, [2], {}) is None  # another call: built again
    routing.check_lock_options(task.name, (1,), {}, {}, task=task)
    assert routing.routed_lock_name(task, [1], {}) == lock_key(task, 1).split("{")[1][:-1]
    assert routing.routed_lock_name(task, [1], {}) is None  # taken once


def test_lock_bypass_as_a_task_option_says_it_is_given_per_call(app: Celery) -> None:
    """Helper probe, round 23: ``lock_bypass=True`` on the task got "did you mean 'lock_by'?"."""
    with pytest.raises(LockConfigError, match="it is given per call, not to the task") as info:

        @app.task(base=LockedTask, lock_bypass=True, lazy=False)
        def bypassed() -> None: ...

    assert "did you mean" not in str(info.value)
    with pytest.raises(LockConfigError, match="keyword 'bypass': it is given per call"):

        @app.task(lazy=False)
        @single_instance(bypass=True)
        def bypassed_too() -> None: ...


def test_a_per_call_typo_of_a_task_option_is_not_hinted_as_lock_bypass(app: Celery) -> None:
    """``apply_async(..., lock_byy=[...])`` got "did you mean 'lock_bypass'?": following the
    hint runs the call without its lock."""
    app.conf.update(broker_url="memory://")

    @app.task(base=LockedTask, lock_by=["a"], lazy=False)
    def keyed(a: int) -> None: ...

    with pytest.raises(LockConfigError) as info:
        keyed.apply_async((1,), lock_byy=["a"])
    message = str(info.value)
    assert "unknown per-call option 'lock_byy'; did you mean 'lock_by'?" in message
    assert "It cannot be given per call" in message
