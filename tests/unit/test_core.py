"""The lock core's error classifier: by meaning, the same for redis-py and valkey errors."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable

import pytest
import redis as redis_py

from celery_redlock import LockUnavailable
from celery_redlock._redis import givebacks
from celery_redlock._redis.core import (
    GIVE_BACK_FOR,
    GiveBack,
    NotAsked,
    Outcome,
    classify,
    connect_hint,
    count_votes,
    describe,
    lost_reply,
    unavailable,
)

E = redis_py.exceptions

CASES = [
    (E.ConnectionError("Error 111 connecting"), Outcome.UNAVAILABLE),
    (E.TimeoutError("Timeout reading from socket"), Outcome.UNAVAILABLE),
    (E.BusyLoadingError("Redis is loading the dataset in memory"), Outcome.UNAVAILABLE),
    (E.ResponseError("LOADING Redis is loading the dataset in memory"), Outcome.UNAVAILABLE),
    (E.ResponseError("CLUSTERDOWN The cluster is down"), Outcome.UNAVAILABLE),
    (ConnectionResetError(104, "reset"), Outcome.UNAVAILABLE),
    (asyncio.TimeoutError(), Outcome.UNAVAILABLE),
    (LockUnavailable("no"), Outcome.UNAVAILABLE),
    (E.ResponseError("BUSY Redis is busy running a script"), Outcome.REFUSED),
    (E.ResponseError("MISCONF Errors writing to the AOF file"), Outcome.REFUSED),
    (E.ReadOnlyError("You can't write against a read only replica."), Outcome.REFUSED),
    (E.ResponseError("READONLY You can't write against a read only replica."), Outcome.REFUSED),
    (E.MovedError("14035 127.0.0.1:7002"), Outcome.REFUSED),  # a plain URL on a Cluster node
    (E.AskError("14035 127.0.0.1:7002"), Outcome.REFUSED),
    (E.ResponseError("MOVED 14035 127.0.0.1:7002"), Outcome.REFUSED),
    (E.ResponseError("MASTERDOWN Link with MASTER is down"), Outcome.REFUSED),
    (E.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"), Outcome.REFUSED),
    (E.NoPermissionError("this user has no permissions to run the 'set' command"), Outcome.REFUSED),
    (
        E.ResponseError("The user executing the script can't run this command or subcommand"),
        Outcome.REFUSED,
    ),
    # Redis 7.2 and newer, inside a script (measured on 7.4.1)
    (E.ResponseError("ACL failure in script: No permissions to access a key"), Outcome.REFUSED),
    (E.NoScriptError("No matching script. Please use EVAL."), Outcome.NOSCRIPT),
    (E.ResponseError("NOSCRIPT No matching script"), Outcome.NOSCRIPT),
    (E.ResponseError("DB index is out of range"), Outcome.REFUSED),
    (E.ResponseError("ERR syntax error"), Outcome.REPLY),
    (RuntimeError("a bug"), None),
    (KeyError("a bug"), None),
]


@pytest.mark.parametrize(("exc", "outcome"), CASES, ids=[repr(c[0])[:40] for c in CASES])
def test_redis_py_errors_are_classified_by_meaning(exc: BaseException, outcome: Outcome) -> None:
    assert classify(exc) is outcome


#: The cases raised by redis-py's own classes, which valkey has twins of.
REDIS_PY = [c for c in CASES if type(c[0]).__module__ == "redis.exceptions"]


@pytest.mark.skipif(importlib.util.find_spec("valkey") is None, reason="valkey not installed")
@pytest.mark.parametrize(("exc", "outcome"), REDIS_PY, ids=[repr(c[0])[:40] for c in REDIS_PY])
def test_valkey_errors_are_classified_as_redis_py_ones(
    exc: BaseException, outcome: Outcome
) -> None:
    import valkey.exceptions

    twin = getattr(valkey.exceptions, type(exc).__name__)
    assert twin is not type(exc)
    assert classify(twin(*exc.args)) is outcome


@pytest.mark.skipif(importlib.util.find_spec("valkey") is None, reason="valkey not installed")
def test_valkey_s_closed_buffer_is_no_answer() -> None:
    """Helper probe, round 3: valkey's asyncio parser raises its base error on a connection it
    closed (redis-py raises an OSError there), which escaped the lock as a raw error."""
    import valkey.exceptions

    assert classify(valkey.exceptions.ValkeyError("Buffer is closed.")) is Outcome.UNAVAILABLE
    assert classify(valkey.exceptions.ValkeyError("something else")) is None


def test_messages_name_an_exhausted_pool_and_never_end_empty() -> None:
    pool = unavailable(E.ConnectionError("Too many connections"), "k", ("h:1",))
    assert "connection pool for Redis at h:1 is exhausted for lock k" in str(pool)
    assert describe(asyncio.TimeoutError()) == "no reply in time"
    refused = unavailable(E.ResponseError("BUSY Redis is busy"), "k", ("h:1",))
    assert str(refused) == "Redis at h:1 refused lock k: BUSY Redis is busy"
    auth = unavailable(E.AuthenticationError("invalid username-password pair"), "k", ("h:1",))
    assert str(auth) == "Redis at h:1 refused lock k: invalid username-password pair"


def test_a_sentinel_s_no_master_found_names_each_sentinel_by_host_and_port() -> None:
    """Helper probe, round 3, session 22: redis-py's "No master found" quotes each Sentinel's
    client repr (1,000 characters each, the password's place included), and a task's WARNING
    and the startup ERROR carried it whole, the hint at their end; the command line already
    shortened it."""
    sentinel = redis_py.Redis(host="10.0.0.7", port=26379, password="pw", socket_timeout=0.1)
    error = E.ConnectionError(f"No master found for 'svc' : {sentinel!r} - ConnectionError: x")
    said = str(unavailable(error, "k", ("svc",)))
    assert said == "Redis at svc did not answer for lock k: No master found for 'svc' : " + (
        "10.0.0.7:26379 - ConnectionError: x"
    )
    sentinel.close()


def test_a_give_back_stops_after_two_answers_in_a_row() -> None:
    """The first answer shows the server ran after the lost command was in its buffer; the
    second release, sent after it, runs after that command. A refusal is an answer too."""
    plan = GiveBack("k", now=0.0)
    assert plan.after(E.TimeoutError("no answer"), 1.0) == 0.1
    assert plan.after(None, 2.0) == 0.0
    assert plan.after(LockUnavailable("x"), 2.1) is not None  # no answer: the count goes on
    assert plan.after(E.NoPermissionError("NOPERM"), 3.0) is None


def test_a_give_back_backs_off_to_one_second_and_gives_up_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Until it is answered, the key is held by nobody: backing off to 5 s let 288 calls of
    a key be skipped in the 3.5 s after the server answered again (probe, round 23)."""
    plan = GiveBack("k", now=0.0)
    delays = [plan.after(ConnectionRefusedError(), 1.0) for _ in range(7)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert plan.after(ConnectionRefusedError(), GIVE_BACK_FOR) is None
    assert "the key may stay until its TTL" in caplog.text


def test_a_give_back_that_hits_a_bug_stops_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    assert GiveBack("k", now=0.0).after(KeyError("bug"), 0.0) is None
    assert "giving back an acquisition failed" in caplog.text


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (E.TimeoutError("Timeout reading from socket"), True),
        (E.ConnectionError("Connection closed by server."), True),
        (LockUnavailable("no quorum for lock k: acquire failed"), True),
        (E.ConnectionError("Error 111 connecting to h:1. Connection refused."), False),
        (E.TimeoutError("Timeout connecting to server"), False),
        (E.ConnectionError("Too many connections"), False),  # the pool had none to give
        (E.ConnectionError("No connection available."), False),
        (NotAsked("not asked: it failed lately, and no time is left"), False),  # none sent
        (E.NoPermissionError("this user has no permissions to run the 'set' command"), False),
        # A refused login sent no command (redis-py raises it as a ConnectionError).
        (E.AuthenticationError("invalid username-password pair or user is disabled."), False),
        (E.AuthorizationError("NOAUTH Authentication required."), False),
        (KeyError("a bug"), False),
    ],
)
def test_a_reply_is_lost_only_when_a_sent_command_got_no_answer(
    error: BaseException, lost: bool
) -> None:
    """A node that is down (its connect fails) sent nothing, so it gets no give-back; nor
    did a call that found its client's pool out of connections."""
    wrapped = LockUnavailable("wrapped")
    wrapped.__cause__ = error
    assert lost_reply(error) is lost
    assert lost_reply(wrapped) is lost


def test_give_backs_past_the_cap_are_dropped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(givebacks, "MAX_PENDING", 1)
    sender = givebacks._Sender()
    calls: list[str] = []
    sender.add(lambda: calls.append("first"), GiveBack("k1", now=0.0), delay=3600)
    sender.add(lambda: calls.append("second"), GiveBack("k2", now=0.0), delay=3600)
    assert "lock k2: 1 give-backs wait for Redis already" in caplog.text
    assert len(sender._heap) == 1 and calls == []


def test_an_answered_give_back_makes_the_others_to_its_server_due_at_once() -> None:
    """A server that answers one give-back answers the others to it: each waited out its own
    backoff meanwhile, its key held by nobody. The answered one's second release goes first,
    and a give-back to another server (maybe still frozen, which would hold up the thread for
    its socket timeout) keeps its delay."""
    sender = givebacks._Sender()
    here, frozen = object(), object()
    calls: list[str] = []
    done = threading.Event()

    def one(name: str) -> Callable[[], None]:
        def release() -> None:
            calls.append(name)
            if name == "k1":
                done.set()

        return release

    sender.add(one("k3"), GiveBack("k3", now=0.0), delay=3600, node=frozen)
    sender.add(one("k1"), GiveBack("k1", now=0.0), delay=3600, node=here)
    sender.add(one("k2"), GiveBack("k2", now=0.0), delay=0.0, node=here)
    assert done.wait(30), "the give-back of k1 waited out its backoff"
    assert calls[:3] == ["k2", "k2", "k1"] and "k3" not in calls


@pytest.mark.parametrize(
    ("text", "client_cert", "hinted"),
    [
        ("Error 8 while writing to socket. EOF occurred in violation of protocol", False, True),
        ("Error 8 while writing to socket. EOF occurred in violation of protocol", None, True),
        ("Error while reading from h:1 : (104, 'Connection reset by peer')", False, True),
        ("Error while reading from h:1 : (104, 'Connection reset by peer')", None, False),
        ("Error while reading from h:1 : (104, 'Connection reset by peer')", True, False),
    ],
)
def test_a_tls_reset_hints_at_a_client_certificate_only_when_the_url_gives_none(
    text: str, client_cert: bool | None, hinted: bool
) -> None:
    """Review, round 3: every TLS reset (a failover, a load balancer's idle cut) said to give
    ssl_certfile, also to a URL that gives one. A reset is the missing certificate's sign (on
    older OpenSSL) only when the URL gives none; the server's own replies say it anyway."""
    hint = connect_hint(True, ConnectionError(text), client_cert)
    assert ("ssl_certfile" in hint) is hinted, hint


def test_a_failed_vote_says_whether_the_holder_held_every_node_that_answered() -> None:
    """What a quorum waiter compares between two tries (core's ``_again_soon``): the holder on
    every node that answered, then on fewer: its release is under way."""
    held = [0, b"h-token", 9000]
    everywhere = count_votes([(held, None)] * 3, 10_000, 1.0, 2)
    assert everywhere.refusal.whole and everywhere.taken
    freed = count_votes([([1, 7, 1], None), (held, None), (held, None)], 10_000, 1.0, 2)
    assert not freed.refusal.whole and freed.taken
    down = count_votes([(None, ConnectionError()), (held, None), (held, None)], 10_000, 1.0, 2)
    assert down.refusal.whole  # of the nodes that answered
