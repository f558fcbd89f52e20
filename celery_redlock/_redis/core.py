"""The decisions of a lock, shared by the thread and asyncio drivers; no I/O here.

:class:`LockCore` holds a lock's state and makes every decision about it: the lease arithmetic
on the injected clock, :attr:`~LockCore.held` and :attr:`~LockCore.lost`, the renewal policy
(what is retried, when, and the delay), the blocking wait, and what a reply means.
:func:`classify` is the one place where a Redis error becomes an outcome; :func:`count_votes`
is the one Redlock rule. The thread lock (:mod:`~celery_redlock._redis.lock`) and the asyncio
lock (:mod:`~celery_redlock._redis.aiolock`) subclass :class:`LockCore` and only send what it
asks for, in the manner of h11's protocol core, so the two cannot drift apart. The wait
(:meth:`LockCore._wait`) is a generator of requests (:class:`Op`: attempt, subscribe, receive
with a timeout, leave the queue...); each driver performs them, one by one, and sends back
the results (:class:`Run`).

Errors are classified by meaning, not by a client library's classes: by the class names along
the exception's MRO and by the reply's prefix, so redis-py and its forks (``valkey``) land on
the same outcome:

* :attr:`Outcome.UNAVAILABLE`: no answer (connection, timeout, a server still ``LOADING``,
  ``CLUSTERDOWN``, an exhausted client pool); the lock state there is unknown;
* :attr:`Outcome.REFUSED`: an error reply by which the node refuses for now (``BUSY``,
  ``MISCONF``, ``READONLY``, ``MASTERDOWN``, ``NOREPLICAS``, ``OOM``, ``NOPERM``), or for
  good because the URL names the wrong server (``MOVED``, ``ASK``, ``CROSSSLOT``: a Cluster's
  node; ``unknown command``: a Sentinel; a missing password or database): unknown too;
* :attr:`Outcome.NOSCRIPT`: the script cache lacks a script (load it and run it again);
* :attr:`Outcome.REPLY`: any other error reply (a bug: a script's own error).

The first two become :class:`~celery_redlock.LockUnavailable` (:func:`unavailable`), so a task
follows ``redlock_on_unavailable`` and renewal retries.

This module never imports Celery, nor a Redis client.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import os
import re
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from ..exceptions import LockContended, LockLost, LockNotOwned, LockUnavailable
from . import keys as _keys
from . import owner as _owner
from .forks import Guard
from .scripts import (
    EXTENDED_SHORTER,
    RELEASED_LISTENED,
    RELEASED_NOT_NOTIFIED,
    SCRIPTS,
    AcquireResult,
    decode_acquire,
    queue_member,
)

__all__ = [
    "Clock",
    "Extended",
    "GiveBack",
    "LockCore",
    "Outcome",
    "Vote",
    "classify",
    "connect_hint",
    "count_votes",
    "describe",
    "majority",
    "refusal_hints",
    "tls_mismatch",
    "unavailable",
]

logger = logging.getLogger("celery_redlock.lock")

#: A monotonic clock in seconds; injectable so expiry paths can be tested without sleeping.
Clock = Callable[[], float]


class Outcome(enum.Enum):
    """What a Redis error means for a lock (:func:`classify`)."""

    UNAVAILABLE = "did not answer"
    REFUSED = "refused"
    NOSCRIPT = "noscript"
    REPLY = "error reply"


#: Exception class names (anywhere in the MRO) that mean "no answer" in redis-py and valkey.
_UNAVAILABLE_CLASSES = frozenset(
    {
        "ConnectionError",
        "TimeoutError",
        "BusyLoadingError",
        "ClusterError",
        "RedisClusterException",
        "ValkeyClusterException",
        "MaxConnectionsError",
        # Not the Redis protocol: another service holds the URL's port (no Redis answers).
        "InvalidResponse",
    }
)

#: Class names of the refusals whose reply prefix the client strips from the message.
_REFUSED_CLASSES = frozenset(
    {
        "OutOfMemoryError",
        "ReadOnlyError",
        "NoPermissionError",
        "MovedError",
        "AskError",
        "ClusterCrossSlotError",
    }
)

#: Error replies by which a node refuses lock operations for now, by prefix: a script runs too
#: long (``BUSY``), the disk is failing (``MISCONF``), the node is a replica after a failover
#: (``READONLY``) or has lost its replicas (``MASTERDOWN``, ``NOREPLICAS``), memory is full
#: under ``noeviction`` (``OOM``), the ACL user lacks a permission (``NOPERM``, and inside a
#: script: :func:`denied_by_acl`), or a Cluster node does not serve the key's slot (``MOVED``,
#: ``ASK``: a plain URL names one node of a Cluster, or a Cluster client gave up redirecting;
#: ``CROSSSLOT`` is refused too, by :func:`classify`). Texts refused anywhere in a reply, such
#: as a Sentinel's ``unknown command``, are in ``_REFUSED_TEXTS``.
REFUSED_REPLIES = (
    "BUSY",
    "MISCONF",
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "OOM",
    "NOPERM",
    "MOVED",
    "ASK",
)

MOVED_HINT = (
    "a Redis Cluster node serves its own slots only: for a Cluster, use a redis+cluster:// URL"
)


#: How redis-py annotates the error of a pipeline's command: ``Command # 1 (MGET k) of
#: pipeline caused error: <the reply>``.
_PIPELINE_ERROR = re.compile(r"^(Command # \d+ \(.*\) of pipeline caused error: )(.*)$", re.S)


def _piped(text: str) -> tuple[str, str]:
    """``text`` of an error as redis-py's annotation of a pipeline's command, and the reply
    (``("", text)`` when it is none)."""
    piped = _PIPELINE_ERROR.match(text)
    return (piped[1], piped[2]) if piped else ("", text)


def redirect_text(exc: BaseException) -> str:
    """``MOVED <slot> <node>`` or ``ASK ...`` for a Cluster's redirection (redis-py keeps the
    reply's address but not its first word), else ``""``. Of a pipeline's command, the word
    goes after redis-py's ``Command # 1 (MGET ...) of pipeline caused error:`` (it read
    "caused error: 15169 127.0.0.1:7002", which names neither MOVED nor the fix)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    head, reply = _piped(text)
    if "MovedError" in names or "AskError" in names:
        return f"{head}{'MOVED' if 'MovedError' in names else 'ASK'} {reply}"
    return text if reply.startswith(("MOVED ", "ASK ")) else ""


_NO_PASSWORD = "the server wants a password (or an ACL user) that the URL does not give"

#: Error replies that refuse the connection itself, by their text, with what to do about each;
#: no retry changes them.
_REFUSED_TEXTS = {
    "DB index is out of range": (
        "the URL names a database number the server does not have: see its `databases` "
        "setting, 16 by default"
    ),
    # Redis's answers to a client that did not log in: to a long command (a script's), to
    # any other command, and to redis-py 6+'s HELLO handshake.
    "unauthenticated multibulk length": _NO_PASSWORD,
    "Authentication required": _NO_PASSWORD,
    "HELLO must be called with the client already authenticated": _NO_PASSWORD,
    # A Sentinel answers its own commands only (PING, INFO, SENTINEL...); every server this
    # package supports knows each command it sends.
    "unknown command": (
        "the server does not know that command: if that port is a Redis Sentinel's (26379 by "
        "default), name the Sentinels in a redis+sentinel://host:port/<service> URL; else the "
        "server renamed the command (rename-command) or is not Redis"
    ),
}

#: A node of a Redis Cluster refuses keys of several slots in one command (the command line
#: reads a page of locks with one ``MGET``): the same plain URL as ``MOVED``'s.
_CROSSSLOT = "CROSSSLOT"

#: What a Sentinel URL naming a port that is no Sentinel's fails with (redis-py's "No master
#: found for 'service' : host:port - ResponseError: unknown command 'SENTINEL' ...").
NOT_A_SENTINEL = (
    "that port is not a Redis Sentinel's (it does not know the SENTINEL command): a "
    "redis+sentinel:// URL names the Sentinels (port 26379 by default); the Redis server's "
    "own port takes a redis:// URL"
)

#: How a Redis server that is no Sentinel refuses a Sentinel client's query (Redis 7 quotes
#: the command as 'SENTINEL', 6.2 as `SENTINEL`).
_UNKNOWN_SENTINEL = re.compile(r"unknown command ['`]sentinel['`]", re.I)

#: Reply prefixes that mean "no answer" even when a client reports them as a plain error reply.
_UNAVAILABLE_REPLIES = ("LOADING", "CLUSTERDOWN", "TRYAGAIN")

#: The reply a command gave inside a script, as Redis 6.2 wraps it: ``ERR Error running script
#: (call to f_...): @user_script:15: @user_script: 15: -OOM command not allowed ...`` (Redis 7
#: passes the command's own reply through).
_SCRIPT_REPLY = re.compile(r"@user_script: ?\d+: -([A-Z]+) ")


def denied_by_acl(text: str) -> bool:
    """Whether an error reply's ``text`` is the ACL's refusal: ``NOPERM``, or inside a script
    "The user executing the script can't ..." (Redis 7.0) or "ACL failure in script: ..."
    (Redis 7.2 and newer)."""
    return "NOPERM" in text or "user executing the script" in text or "ACL failure in" in text


def refused_by_acl(exc: BaseException) -> bool:
    """Whether ``exc`` is the ACL's refusal of a command (redis-py and valkey strip the
    ``NOPERM`` prefix off the message of the error class they raise for it)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "NoPermissionError" in names or denied_by_acl(str(exc))


def classify(exc: BaseException) -> Outcome | None:
    """What ``exc`` means for a lock, or ``None`` when it is no Redis error at all (a bug)."""
    if isinstance(exc, LockUnavailable):
        return Outcome.UNAVAILABLE
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _UNAVAILABLE_CLASSES or isinstance(exc, OSError):
        return Outcome.UNAVAILABLE
    if "ResponseError" not in names:
        # valkey's asyncio parser raises its base error on a connection it closed (redis-py
        # raises an OSError there): no answer.
        if names & {"RedisError", "ValkeyError"} and str(exc).startswith("Buffer is closed"):
            return Outcome.UNAVAILABLE
        return None
    if "NoScriptError" in names:
        return Outcome.NOSCRIPT
    if names & _REFUSED_CLASSES:
        return Outcome.REFUSED
    text = str(exc)
    inner = _SCRIPT_REPLY.search(text)
    # redis-py before 5.1 raises a MOVED in a plain client's pipeline as a ResponseError, its
    # text after "Command # 1 (MGET ...) of pipeline caused error: ".
    prefix = inner.group(1) if inner else _piped(text)[1].split(" ", 1)[0]
    if prefix == "NOSCRIPT":
        return Outcome.NOSCRIPT
    if prefix in _UNAVAILABLE_REPLIES:
        return Outcome.UNAVAILABLE
    if prefix in REFUSED_REPLIES or prefix == _CROSSSLOT or denied_by_acl(text):
        return Outcome.REFUSED
    if any(refusal in text for refusal in _REFUSED_TEXTS):
        return Outcome.REFUSED
    return Outcome.REPLY


def password_missing(exc: BaseException) -> str | None:
    """What to fix when the server refused ``exc``'s command because the client did not log
    in (the URL gives no password), as opposed to refusing the credentials it gave; else
    ``None``. redis-py raises ``AuthenticationError`` for both."""
    text = str(exc)
    missing = any(hint == _NO_PASSWORD and reply in text for reply, hint in _REFUSED_TEXTS.items())
    return _NO_PASSWORD if missing else None


#: A client's repr in a redis-py message (a Sentinel's "No master found" names each Sentinel
#: so, some 1,000 characters each, with the hint after them): shown as its ``host:port``.
#: redis-py 5.0 writes ``Redis<ConnectionPool<Connection<host=h,port=p,db=0>>>``.
_CLIENT_REPR = re.compile(
    r"<redis\.client\.Redis\(<.*?\bhost=([^,]+),port=(\d+),.*?\)>\)>\)>"
    r"|Redis<ConnectionPool<Connection<host=([^,>]+),port=(\d+)[^>]*>>>"
)


def describe(exc: BaseException) -> str:
    """``exc`` as text for a message, each client repr in it shortened to ``host:port``; never
    empty (``asyncio.TimeoutError()`` has no text)."""
    text = str(exc) or {"TimeoutError": "no reply in time"}.get(type(exc).__name__, repr(exc))
    return _CLIENT_REPR.sub(lambda m: f"{m[1] or m[3]}:{m[2] or m[4]}", text)


def refusal_hints(exc: BaseException) -> tuple[str, list[str]]:
    """The text to show of a refusal ``exc`` (with ``MOVED`` or ``ASK`` put back by
    :func:`redirect_text`), and what to do about it when the URL is the cause (empty for
    others, such as an ACL's): a wrong database number, a missing password, a command the
    server does not know (a Sentinel's port), a Cluster node reached by a plain URL
    (``MOVED``, ``ASK``, ``CROSSSLOT``)."""
    moved = redirect_text(exc)
    text = moved or describe(exc)
    if _UNKNOWN_SENTINEL.search(text):  # redis-py < 8.2 raises it unwrapped: the URL is a
        return text, [NOT_A_SENTINEL]  # Sentinel URL already, and its port no Sentinel's
    hints = [hint for refusal, hint in _REFUSED_TEXTS.items() if refusal in text]
    crossslot = _CROSSSLOT in text or any(
        cls.__name__ == "ClusterCrossSlotError" for cls in type(exc).__mro__
    )
    if moved or crossslot:
        hints.append(MOVED_HINT)
    return text, list(dict.fromkeys(hints))


def connect_hint(tls: bool | None, exc: BaseException, client_cert: bool | None = None) -> str:
    """What to check when a connection failed with ``exc`` because the URL may name the
    wrong kind of port or certificates, or ``""``: a Sentinel URL naming a Redis server's port
    (:data:`NOT_A_SENTINEL`), a server certificate that does not verify (a self-signed one,
    without ``ssl_ca_certs``), or TLS that does not match (:func:`tls_mismatch`). ``tls``:
    whether the client uses TLS (``None``: unknown, as for a Cluster); ``client_cert``:
    whether the URL gives a client certificate (``None``: unknown)."""
    text = str(exc)
    if _UNKNOWN_SENTINEL.search(text):
        return NOT_A_SENTINEL
    if text.startswith("No master found") and _RESET in text:
        return (
            "if the Sentinels take TLS only, they reset plain connections: add "
            "sentinel_ssl=true to a rediss+sentinel URL (its certificates are used)"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:  # not an outage: it fails until the URL changes
        return (
            "the server's certificate does not verify: give the CA that signed it in the URL "
            "(ssl_ca_certs=/path/ca.pem); a host name it does not hold is refused too: use "
            "one it holds, or ssl_check_hostname=false"
        )
    return "" if tls is None else tls_mismatch(tls, exc, client_cert)


def tls_mismatch(tls: bool, exc: BaseException, client_cert: bool | None = None) -> str:
    """What to check when ``exc`` is how a connection fails whose TLS may not match the
    server's port, or ``""``. Neither failure names TLS, and both also have other causes:

    * ``rediss://`` to a plain port: the client sends its TLS hello; the server reads it as
      the start of a command and waits for the rest; the client's connect timeout passes
      ("Timeout connecting to server").
    * ``redis://`` to a TLS-only port: the client sends a command; the server finds no TLS
      hello and resets the connection ("Connection reset by peer"; a restarting server says
      "Connection closed by server", which gets no hint). Another service resets it too
      (RabbitMQ's port, when a broker URL was copied into the lock URL), so the hint names
      both.
    * ``rediss://`` without a client certificate the server trusts, to a server that wants
      one (``tls-auth-clients yes``): the handshake completes, then the server closes the
      connection; the client's first write fails ("EOF occurred in violation of protocol"),
      or its first read gets the server's alert ("certificate required") or, on older
      OpenSSL, a reset (hinted only when the URL gives no certificate: a reset has other
      causes). ``client_cert``: whether the URL gives one (``None``: not known).
    """
    text = str(exc)
    # A reset has other causes (a failover, an idle connection cut by a load balancer): it
    # gets the hint only when the URL gives no certificate.
    if tls and (_NO_CLIENT_CERT.search(text) or (client_cert is False and _RESET in text)):
        return _CLIENT_CERT_HINTS[client_cert]
    if tls and "Timeout connecting" in text:
        return "if that port does not take TLS, a rediss URL waits like this: use the redis scheme"
    if not tls and "Connection reset by peer" in text:
        return (
            "if that port takes TLS only, it resets plain connections: use the rediss scheme; "
            "a service that is not Redis (RabbitMQ, say) resets them too: check the port"
        )
    return ""


#: How a TLS server that wants a client certificate ends a connection that gave none.
_NO_CLIENT_CERT = re.compile(r"EOF occurred in violation of protocol|certificate required", re.I)
#: How an older OpenSSL sees it: the server resets the connection.
_RESET = "Connection reset by peer"

#: What :func:`tls_mismatch` says of it, by whether the URL gives a client certificate.
_CLIENT_CERT_HINTS = {
    False: "the server may want a client certificate (tls-auth-clients yes): give ssl_certfile "
    "and ssl_keyfile in the URL",
    None: "the server may want a client certificate it trusts (tls-auth-clients yes): give "
    "ssl_certfile and ssl_keyfile in the URL",
    True: "the server may not trust the client certificate the URL gives (ssl_certfile): it "
    "must be signed by a CA of the server's tls-ca-cert-file",
}


def unavailable(
    exc: BaseException,
    key: str,
    names: tuple[str, ...],
    tls: bool | None = None,
    client_cert: bool | None = None,
    missing: Sequence[str] = (),
) -> LockUnavailable:
    """The :class:`LockUnavailable` for ``exc`` (no answer, or a refusal) from node ``names``,
    whose client uses TLS or not (``tls``; ``None`` when unknown, as for a Cluster) and gives
    a TLS client certificate or not (``client_cert``; ``None`` when unknown). ``missing``: the
    TLS files given to the client that do not exist, as ``name=path`` (named: redis-py's
    "No such file or directory" names none).

    A client pool that ran out of connections is named as such: the server may be fine.
    """
    text = describe(exc)
    if _pool_ran_out(exc):
        what = (
            f"the client's connection pool for Redis at {names[0]} is exhausted for lock {key} "
            f"({text}): raise its max_connections, or use a BlockingConnectionPool"
        )
    elif "No connection available" in text:  # a BlockingConnectionPool's timeout
        what = (
            f"the client's connection pool for Redis at {names[0]} had no free connection for "
            f"lock {key} within its timeout ({text}): raise its max_connections or timeout (for a "
            "lock built from a URL, ?max_connections= in the URL), or pass a client of your own"
        )
    elif classify(exc) is Outcome.REFUSED or refused_at_login(exc):
        text, hints = refusal_hints(exc)
        what = f"Redis at {names[0]} refused lock {key}: {text}"
        what += "".join(f" ({hint})" for hint in hints)
    else:
        verb = "could not be trusted" if "CERTIFICATE_VERIFY_FAILED" in text else "did not answer"
        what = f"Redis at {names[0]} {verb} for lock {key}: {text}"
        hint = connect_hint(tls, exc, client_cert)
        what += f" ({hint})" if hint else ""
        if missing:
            what += f" (a file the client was given does not exist: {', '.join(missing)})"
    return LockUnavailable(what, key=key, nodes=names)


#: The declared scripts by source (:class:`~celery_redlock._redis.scripts.base.Script`).
_DECLARED = {script.source: script for script in SCRIPTS}


def script_refused(exc: LockUnavailable, source: str) -> LockUnavailable:
    """``exc`` naming the commands of the script ``source`` when the ACL refused one of them
    (Redis names the script's SHA, not the command), else ``exc`` itself."""
    text = str(exc)
    script = _DECLARED.get(source)
    if script is None or not denied_by_acl(text):
        return exc
    return LockUnavailable(
        f"{text} (the {script.name} script runs {', '.join(script.commands)}: the ACL user "
        "needs each of them, as the guide's ACL line grants)",
        key=exc.key,
        nodes=exc.nodes,
    )


class QueueRules:
    """Whether blocking waiters queue on a single node, for the thread and the asyncio node."""

    #: Blocking waiters queue here; False once the user was refused the queue's commands.
    queue_allowed = True
    #: A release whose reply was lost is not given back again by the node itself: an
    #: interrupted acquire's give-back goes on as :class:`GiveBack` plans (hazard 5).
    gives_back_per_node = False
    #: A failed attempt's reply may lack the holder's TTL (the thread lock's ``SET ... GET``):
    #: ``PTTL`` is asked on first read.
    ttl_in_reply = False
    #: A release frees the lock in one script: a woken waiter that finds the holder still
    #: there was woken by an extend that shortened its TTL, and sleeps on that TTL.
    releases_node_by_node = False

    def queues(self, keys: _keys.LockKeys) -> bool:
        """Whether blocking waiters of this lock queue (:data:`~._scripts.WAIT`), so that a
        release wakes one of them: a lock (one slot) whose user may run the queue commands."""
        return self.queue_allowed and len(keys.slots) == 1

    def queue_refused(self, exc: BaseException) -> bool:
        """Whether a queued try's error means the user may not run the queue's commands (an
        ACL written before the queue existed); then waiters stop queueing here."""
        cause = exc.__cause__ if isinstance(exc, LockUnavailable) else exc
        text = str(cause)
        refused = denied_by_acl(text) or (
            cause is not None and "NoPermissionError" in type(cause).__name__
        )
        if refused:
            self.queue_allowed = False
        return refused


def warn_not_notified(key: str, nodes: Sequence[str], done: str = "released") -> None:
    """WARNING for a release (or an extend that shortened the TTL: ``done``) whose
    ``PUBLISH`` was refused (:data:`RELEASED_NOT_NOTIFIED`). The script does not say which
    rule was missing, so the warning names each: the commands, and the release channels,
    which Redis 7 denies by default (``acl-pubsub-default resetchannels``) to a user given
    every command (``+@all ~*``) and no ``&`` pattern."""
    prefix = key.partition(":{")[0]
    logger.warning(
        "lock %s %s on %s, but waiters were not notified (PUBLISH, or ZPOPMIN for the "
        "queued ones, was refused: does the ACL user lack +publish, +zpopmin or the "
        "channels &%s:*?); they try again when the old lease would have ended",
        key,
        done,
        ", ".join(nodes),
        _keys.glob_escape(prefix),
    )


def released(reply: Any, key: str, nodes: Sequence[str]) -> bool:
    """Decode one node's release reply; WARNING when its ``PUBLISH`` was refused."""
    if reply is not None and int(reply) == RELEASED_NOT_NOTIFIED:
        warn_not_notified(key, nodes)
    return bool(reply)


# -- the quorum vote -----------------------------------------------------------------------------

Replies = list[tuple[Any, BaseException | None]]


def majority(nodes: int) -> int:
    """How many of ``nodes`` independent nodes make a majority (1 for a single node)."""
    return nodes // 2 + 1


class Extended(NamedTuple):
    """What an extend found: whether the lock is still ours, and whether every node has it."""

    #: The owner token was found (on the node, or on a majority of a quorum's nodes).
    held: bool
    #: Every node holds the lock now. Always equal to ``held`` for a single node; False for a
    #: quorum with a node that is down or that had to get the lock back (repair).
    complete: bool


class Vote(NamedTuple):
    """What a quorum's acquisition replies decide (:func:`count_votes`)."""

    #: The fencing token when a majority granted the lock within its validity time, else None.
    fencing: int | None
    #: How many nodes granted it, and those whose counter is below ``fencing`` (write-back).
    won: int
    lagging: list[int]
    #: What a failed attempt reports: a holder seen by a node, or a bare refusal (no holder
    #: seen: enough votes, but the validity time ran out).
    refusal: AcquireResult
    #: One other owner holds the lock on a majority (``quorum`` nodes): a failed
    #: attempt gives back what it won without waking the waiters (nothing is free for them).
    taken: bool = False


def count_votes(
    replies: Sequence[tuple[Any, BaseException | None]], ttl_ms: int, elapsed_ms: float, quorum: int
) -> Vote:
    """The Redlock rule, in one place for both drivers.

    The lock is held when at least ``quorum`` nodes granted it and the validity time, ``ttl``
    minus the elapsed time minus a clock-drift allowance (1 % of ttl + 2 ms), is positive; its
    fencing token is the largest one granted.
    """
    results = {i: decode_acquire(rep) for i, (rep, err) in enumerate(replies) if err is None}
    won = [i for i, res in results.items() if res.acquired]
    held = [res for res in results.values() if not res.acquired]
    refusal = held[0] if held else AcquireResult(False)
    validity_ms = ttl_ms - elapsed_ms - (ttl_ms * 0.01 + 2)
    if len(won) < quorum or validity_ms <= 0:
        holders = collections.Counter(res.holder for res in held if res.holder)
        owner, seen = holders.most_common(1)[0] if holders else (None, 0)
        if seen < quorum:
            # No owner holds a majority: a split vote of contenders, each giving back what it
            # won at once. A minority key's TTL says nothing of when the lock frees, so it is
            # not reported: a waiter tries again within a second (core's wait) instead of
            # sleeping that TTL on a wake it may miss. Timeline without it, measured with 6
            # thread waiters on a 3-node quorum (3 runs of 48): (1) the holder releases; (2)
            # three waiters split the nodes, and each reads another's 30 s key; (3) one of them
            # slept out its whole timeout while the lock was free.
            return Vote(None, len(won), [], AcquireResult(False, holder=refusal.holder))
        # Its TTL, not that of a node's other value (a failed attempt's, given back without
        # waking anyone): until fewer than a majority of its nodes hold it.
        ttls = sorted((res.pttl_ms or 0 for res in held if res.holder == owner), reverse=True)
        whole = seen == len(results)
        refusal = AcquireResult(False, holder=owner, pttl_ms=ttls[quorum - 1], whole=whole)
        return Vote(None, len(won), [], refusal, True)
    fencing = max(results[i].fencing_token or 0 for i in won)
    lagging = [i for i in won if results[i].fencing_token != fencing]
    return Vote(fencing, len(won), lagging, refusal)


class QuorumRules:
    """What a quorum's replies mean, for the thread and the asyncio quorum alike."""

    names: tuple[str, ...]
    quorum: int
    #: A release gives back again to each node whose reply was lost: an interrupted acquire's
    #: give-back needs no plan of its own around it.
    gives_back_per_node = True
    #: A failed attempt's vote gives the holder's TTL whenever one is known; a split vote gives
    #: none on purpose (:func:`count_votes`). Never asked of the nodes afterwards: their
    #: ``PTTL`` counts any owner's keys, and a split vote's minority keys read as the TTL of a
    #: lock held on a majority. Timeline: (1) X and Y each hold one node of three, 30 s; (2) a
    #: waiter's try wins the third and gives it back; (3) its ``PTTL`` read gives 30 s, and it
    #: slept that long (to its deadline), though X and Y gave back a moment later.
    ttl_in_reply = True
    #: The nodes answer one by one: a waiter may find the holder on fewer nodes than its try
    #: before (a release under way when it subscribed, too late for the release to see it),
    #: or, woken, still on a majority (another process's release, under way): it tries again
    #: soon (:func:`_again_soon`).
    releases_node_by_node = True

    def failed(self, replies: Replies) -> list[str]:
        return [self.names[i] for i, (_, err) in enumerate(replies) if err is not None]

    def to_give_back(self, replies: Replies) -> tuple[list[int], list[int]]:
        """Where a failed acquisition may hold its token: the nodes that granted it (released
        at once) and those whose reply was lost (given back in the background, as a release's
        lost replies are). The nodes that answered otherwise hold none of it. Timeline with a
        release to every node: (1) node A hangs; (2) an acquisition finds B and C held by
        another, and A gives no answer within the node timeout; (3) its give-back waited for A
        once more: each failed acquire took two node timeouts (1 s) instead of one."""
        granted, lost = [], []
        for i, (reply, error) in enumerate(replies):
            if error is None and decode_acquire(reply).acquired:
                granted.append(i)
            elif error is not None and lost_reply(error):
                lost.append(i)
        return granted, lost

    def no_quorum(
        self,
        key: str,
        failed: list[str],
        what: str,
        replies: Sequence[tuple[Any, BaseException | None]] = (),
    ) -> LockUnavailable:
        errors = [err for _, err in replies if err is not None]
        return LockUnavailable(
            f"no quorum for lock {key}: {what}; {len(failed)} of {len(self.names)} nodes "
            f"failed ({', '.join(failed)}), {self.quorum} needed"
            + (f"; first error: {describe(errors[0])}" if errors else ""),
            key=key,
            nodes=tuple(failed),
        )

    def no_listener(self, key: str, errors: Replies) -> LockUnavailable:
        """No node can carry a blocking wait's subscription: each failed its ``PING``. Says
        whether they refused it (an ACL user without ``+ping``) or did not answer."""
        refusals = [e for _, e in errors if e is not None and classify(e) is Outcome.REFUSED]
        if any(refused_by_acl(e) for e in refusals):
            what = "a node refused PING, which a quorum's blocking wait sends first (grant +ping)"
        elif refusals:
            what = "the nodes refused PING, which a quorum's blocking wait sends first"
        else:
            what = "no node answers"
        return self.no_quorum(key, list(self.names), what, errors)

    def check_answered(self, key: str, replies: Replies, what: str) -> list[str]:
        """The failed nodes; :class:`LockUnavailable` when too few answered for a majority."""
        failed = self.failed(replies)
        if len(self.names) - len(failed) < self.quorum:
            raise self.no_quorum(key, failed, what, replies)
        return failed

    def to_wake(self, replies: Replies) -> list[int]:
        """After a quorum release that freed the lock, each node waking nobody itself: the
        nodes to send a ``PUBLISH`` on its channel, every node that answered (the waiters
        listen on one node, which the holder may lack)."""
        answered = [i for i, (rep, _) in enumerate(replies) if rep is not None]
        if not any(int(replies[i][0]) > 0 for i in answered):
            return []
        return answered

    def release_wakes(self, replies: Replies, quiet: bool) -> list[int]:
        """After a quorum release that woke nobody itself: the nodes to send the waiters a
        ``PUBLISH``. None unless a node found someone listening on the release channel (or
        could not tell), or, for the holder's own release, a node lacked the lock; then every
        node that answered (:meth:`to_wake`), or, for a give-back (``quiet``), those it freed
        (the others may be another owner's). Timeline of the lacking node, were it left out:
        (1) the holder lacks node 0, where the waiters listen; the release's script there finds
        no subscriber; (2) a waiter subscribes there, and its try finds the holder still on
        nodes 1 and 2, as its try before did; (3) the release frees them: nobody wakes it, and
        it sleeps on the released holder's TTL."""
        wanted = (RELEASED_LISTENED,) if quiet else (RELEASED_LISTENED, 0)
        if not any(rep is not None and int(rep) in wanted for rep, _ in replies):
            return []
        if quiet:
            return [i for i, (rep, _) in enumerate(replies) if rep is not None and int(rep) > 0]
        return self.to_wake(replies)

    def woken(self, key: str, errors: dict[int, BaseException], done: str = "released") -> None:
        """After the wake's ``PUBLISH`` to each node: WARNING naming those that refused it."""
        refused = [self.names[i] for i, exc in errors.items() if classify(exc) is Outcome.REFUSED]
        if refused:
            warn_not_notified(key, refused, done)

    def released(self, key: str, replies: Replies) -> bool:
        """Whether no majority contradicts a release (a silent node is no evidence of loss);
        WARNING naming the nodes whose ``PUBLISH`` was refused."""
        refused_publish = [
            self.names[i]
            for i, (rep, err) in enumerate(replies)
            if err is None and rep is not None and int(rep) == RELEASED_NOT_NOTIFIED
        ]
        if refused_publish:
            warn_not_notified(key, refused_publish)
        failed = self.check_answered(key, replies, "release failed")
        ok = sum(1 for rep, err in replies if err is None and rep is not None and int(rep) > 0)
        return ok + len(failed) >= self.quorum

    def extended(self, key: str, replies: Replies, elapsed_ms: float, ttl_ms: int) -> Extended:
        """What a quorum extend found: only nodes that still held our token count."""
        if elapsed_ms >= ttl_ms:
            return Extended(False, False)
        self.check_answered(key, replies, "extend failed")
        held = sum(1 for rep, err in replies if err is None and int(rep) in (1, EXTENDED_SHORTER))
        return Extended(held >= self.quorum, held == len(self.names))

    def to_wake_extended(self, replies: Replies) -> list[int]:
        """After a quorum extend that shortened the TTL somewhere (each node woke nobody
        itself): every node that answered, to be sent a ``PUBLISH`` once all have the new TTL.
        The waiters listen on one node, which the holder may lack (re-asserted now); and woken
        by the first node to shorten, a waiter could read the old TTL from the others and
        sleep on it (a node that had to load the script is sent it after the others)."""
        if not any(err is None and int(rep) == EXTENDED_SHORTER for rep, err in replies):
            return []
        return [i for i, (rep, err) in enumerate(replies) if err is None and rep is not None]

    def fence_raised(self, replies: Replies, lagging: list[int], won: int) -> bool:
        raised_failed = sum(1 for i in lagging if replies[i][1] is not None)
        return won - raised_failed >= self.quorum

    def pttl(self, key: str, replies: Replies) -> int:
        """Time until fewer than a majority of nodes hold ``key`` (negative: not held), from
        each node's ``PTTL``; :class:`LockUnavailable` when too few answered for a majority
        (a silent node may hold it: "not held" would be a guess)."""
        self.check_answered(key, replies, "PTTL failed")
        values = [-2 if err is not None else int(rep) for rep, err in replies]
        return sorted(values, reverse=True)[self.quorum - 1]

    def queues(self, keys: _keys.LockKeys) -> bool:
        """Blocking waiters of a quorum never queue: they wait on the release channel."""
        return False


# -- the lock's state and its decisions ----------------------------------------------------------


#: The longest ttl a lock takes, in seconds (ten years): finite, and whole milliseconds of it
#: fit any Redis expiry.
MAX_TTL = 10 * 365 * 24 * 3600.0


#: The shortest ttl a lock takes, in seconds: Redis counts expiries in whole milliseconds
#: (``ttl=1e-9`` was taken: the acquire returned True for a lock that was already lost), as the
#: task option ``lock_ttl`` counts them.
MIN_TTL = 0.001


#: The most slots a semaphore has (as the task option ``lock_limit``): each acquisition may try
#: them all in one script.
MAX_LIMIT = 1000


def seconds(value: Any, *, zero: bool = False) -> bool:
    """Whether ``value`` is a number of seconds a lock takes: an int or a finite float (not a
    bool, not a string), > 0 (>= 0 with ``zero``) and at most :data:`MAX_TTL`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (value >= 0 if zero else value > 0) and value <= MAX_TTL


def check_arguments(ttl: Any, max_hold: Any, timeout: Any, limit: Any, blocking: Any) -> None:
    """Raise :class:`ValueError` for lock arguments of the wrong kind or out of range (``ttl``
    checked inline: a lock is built per task execution)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(
            f"Lock ttl must be seconds >= {MIN_TTL} (whole milliseconds) and <= {MAX_TTL:.0f}, "
            f"got {ttl!r}"
        )
    if max_hold is not None and (not seconds(max_hold) or max_hold < MIN_TTL):
        raise ValueError(
            f"Lock max_hold must be seconds >= {MIN_TTL} (whole milliseconds) and <= "
            f"{MAX_TTL:.0f}, or None, got {max_hold!r}"
        )
    if timeout is not None and not seconds(timeout, zero=True):
        raise ValueError(
            f"Lock timeout must be seconds >= 0 and <= {MAX_TTL:.0f}, or None, got {timeout!r}"
        )
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"Lock limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if not isinstance(blocking, bool):
        raise ValueError(f"Lock blocking must be True or False, got {blocking!r}")


def check_given(prefix: Any, name: Any, owner: Any, host: Any, auto_renew: Any, clock: Any) -> None:
    """Raise :class:`ValueError` for the other arguments of a lock built by its user (the
    engine's come from validated settings and from Celery: :attr:`LockCore.checked_by_caller`).
    Each was taken and misread: ``auto_renew="no"`` renewed, ``prefix=None`` made the key
    ``None:{name}``, ``owner=None`` was stored as the text ``None``, a name with a line break
    split the rows of ``celery redlock ls``, and ``host=5`` or ``clock=None`` failed at the first
    ``acquire()`` naming no argument."""
    _keys.validate_prefix(prefix)
    if isinstance(name, str) and not name.isprintable():
        raise ValueError(
            f"lock name {name!r} must not contain control or other non-printable characters"
        )
    if not isinstance(auto_renew, bool):
        raise ValueError(f"Lock auto_renew must be True or False, got {auto_renew!r}")
    if not isinstance(owner, str):
        raise ValueError(f"Lock owner must be a string, got {owner!r}")
    if host is not None and not isinstance(host, str):
        raise ValueError(f"Lock host must be a string or None, got {host!r}")
    if not callable(clock):
        raise ValueError(f"Lock clock must be a function giving seconds, got {clock!r}")


def check_limit(limit: int, nodes: tuple[str, ...]) -> None:
    """Raise :class:`ValueError` for ``limit`` > 1 over a quorum of independent nodes."""
    if limit > 1 and len(nodes) > 1:
        raise ValueError(
            "a Lock with limit > 1 needs a single Redis deployment (a node, Sentinel or "
            "Cluster): over a quorum of independent nodes, more than `limit` owners could "
            "each win a majority of slots"
        )


def ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds for Redis, at least 1."""
    return max(1, int(seconds * 1000))


#: Shortest delay between two renewal attempts after a failure (unless the lease ends sooner).
MIN_RETRY = 0.05

#: Shortest delay until the next renewal after an acquisition or renewal that a quorum node
#: lacked (the delay is lease/30, at least this).
DEGRADED_RENEWAL = 0.1

#: A waiter's first delay before it tries again when a wake found the releasing holder still
#: there (:func:`_again_soon`); it doubles while it finds that holder.
AGAIN_SOON = 0.01


def _again_soon(
    before: _owner.Owner | None, after: _owner.Owner | None, woken: bool, backoff: float | None
) -> float | None:
    """The delay before a quorum waiter's next try, when it should not sleep on the holder's TTL.

    A try of a waiter that a message woke (``woken``), or that was trying again soon, found
    the same holder as its last try (``before`` and ``after``): the release has not yet
    reached every node. Timeline it closes, seen under load on a quorum while a release woke
    the waiters from each node as it freed it (a task's release now wakes them once every node
    answered): (1) the holder's release frees node 0, where the waiters listen, and publishes
    there; (2) its thread is
    descheduled before the release reaches nodes 1 and 2; (3) the woken waiter tries, finds the
    holder on a majority, and slept on its TTL while the lock was free a moment later. Also
    ``woken``: a try that found the holder on fewer nodes than the try before it, which found
    it on all (the release under way, its message published before the waiter's subscription
    took effect: 4 stalls of a whole TTL in 1,000 handoffs on a 3-node TLS quorum under load
    without this). It now tries again after :data:`AGAIN_SOON`, the delay doubling while it
    finds that holder, up to the holder's TTL. A holder that shortened its TTL by an extend
    (which wakes the waiters too) costs each waiter a try per doubling. ``None``: sleep on the
    TTL. A single node frees the lock in one script: its waiters never ask.
    """
    if not (woken or backoff is not None) or before is None or after is None:
        return None
    if before.token != after.token:
        return None
    return AGAIN_SOON if backoff is None else backoff * 2


#: How long the give-back of an acquisition whose reply was lost keeps trying (seconds), and
#: its first and longest delay between tries: short, since until it is answered its key is
#: held by nobody, and a call of that key finds it held (5 s let 288 calls be skipped).
GIVE_BACK_FOR = 600.0
GIVE_BACK_DELAYS = (0.1, 1.0)


class GiveBack:
    """When to release the token of an acquisition whose reply was lost, and when to stop.

    The timeline it closes: (a) A sends its acquisition (``SET NX PX``, or the script); (b)
    the server stops answering (``SIGSTOP``, a paused VM, a long fork) past A's socket
    timeout, with A's command in its socket buffer; A gets :class:`LockUnavailable`; (c) the
    server resumes and runs A's command: the key is held by nobody for its whole TTL, and A's
    retry, which carries the same task id, finds it held by itself. So the token is released
    (owner-checked: only a key holding this token is deleted; by the thread lock's nodes, and
    by the asyncio lock) until **two releases in a row were answered**. The first answer
    shows the server ran again after A's command was in its buffer, so the second release,
    sent after that answer, runs after A's command if it ran at all. A refusal (``NOPERM``,
    ``OOM``...) is an answer too.

    What it does not close: a network partition, where the kernel may still resend A's
    command after both releases went through; and a server silent for longer than
    :data:`GIVE_BACK_FOR` (a WARNING then says the key may stay until its TTL).
    """

    __slots__ = ("answers", "delay", "key", "until", "what")

    def __init__(self, key: str, now: float, what: str = "an acquisition") -> None:
        self.key = key
        self.until = now + GIVE_BACK_FOR
        self.answers = 0
        self.delay = GIVE_BACK_DELAYS[0]
        #: What lost its reply: an acquisition, or a queued waiter's try (then left).
        self.what = what

    def after(self, error: BaseException | None, now: float) -> float | None:
        """Seconds until the next release, given how the last one ended (``error`` is
        ``None`` when it was answered); ``None`` to stop."""
        outcome = None if error is None else classify(cause(error))
        if outcome is None and error is not None:  # a bug: not retried
            logger.error("lock %s: giving back %s failed", self.key, self.what, exc_info=error)
            return None
        if outcome in (None, Outcome.REFUSED, Outcome.REPLY):
            self.answers += 1
            return None if self.answers >= 2 else 0.0
        if now >= self.until:
            logger.warning(
                "lock %s: %s lost its reply and Redis has not answered its give-back for "
                "%.0f s; the key may stay until its TTL",
                self.key,
                self.what,
                GIVE_BACK_FOR,
            )
            return None
        delay, self.delay = self.delay, min(self.delay * 2, GIVE_BACK_DELAYS[1])
        return delay


def cause(error: BaseException) -> BaseException:
    """The Redis error behind ``error`` (a :class:`LockUnavailable` wraps one)."""
    if isinstance(error, LockUnavailable) and error.__cause__ is not None:
        return error.__cause__
    return error


class NotAsked(TimeoutError):
    """The reply of a quorum node a round did not send to (it failed lately, and the round's
    time was up): nothing was sent, so nothing is to give back."""


def lost_reply(error: BaseException) -> bool:
    """Whether a command that raised ``error`` may still run on Redis: no answer came, after
    the connection was made (a refusal was an answer, and a failed connect sent nothing: a
    node that is down gets no give-backs; nor does a client whose pool had no connection to
    give)."""
    error = cause(error)
    return (
        not isinstance(error, NotAsked)
        and classify(error) is Outcome.UNAVAILABLE
        and "connecting" not in str(error)
        and not refused_at_login(error)
        and not _pool_ran_out(error)
        and "No connection available" not in str(error)
    )


def refused_at_login(exc: BaseException) -> bool:
    """Whether the server refused the connection's login (a wrong password, a disabled ACL
    user): redis-py and valkey raise it as a ``ConnectionError``, but the command was never
    sent. Timeline if it counted as a lost reply: (1) every acquire with a wrong password
    raises, as it should; (2) each also starts a give-back, which logs in again every second
    for ten minutes (20 failed acquires: 160 logins in 5 s), and the asyncio lock warns at
    loop shutdown of a give-back "unanswered" that sent nothing."""
    return bool(_LOGIN_REFUSALS & {cls.__name__ for cls in type(exc).__mro__})


#: Exception class names (anywhere in the MRO) of a refused login, in redis-py and valkey.
_LOGIN_REFUSALS = frozenset({"AuthenticationError", "AuthorizationError"})


def _pool_ran_out(exc: BaseException) -> bool:
    """Whether ``exc`` says a client's connection pool had no connection left to give."""
    return "Too many connections" in describe(exc) or "MaxConnectionsError" in type(exc).__name__


class LockCore:
    """A lock's state and decisions; a driver adds the I/O (see the module docstring).

    The constructor's arguments are those of :class:`celery_redlock.Lock`. Everything
    time-related is judged by ``clock``.
    """

    #: Where the lock lives (:meth:`_connect`): a driver's nodes.
    nodes: Any
    #: An owner label (a task id) holds at most one slot of a semaphore: an attempt that finds
    #: a slot held under its label is refused, naming that holder. True for the lock of a
    #: task execution, where two slots under one task id mean a duplicate delivery (a
    #: redelivered message) running beside its own run; False for a plain :class:`Lock`,
    #: whose label several holders may share.
    one_slot_per_owner = False
    #: The caller checked ``prefix``, ``name``, ``owner``, ``host``, ``auto_renew`` and
    #: ``clock`` itself (:func:`check_given`): the lock of a task execution, whose are built
    #: from validated settings and Celery's request, once per execution.
    checked_by_caller = False
    #: What ``repr()`` calls it.
    _kind = "Lock"

    # The state of a lock never acquired: class attributes, set on the instance once they
    # change (a lock is built per task execution; this spares the constructor eight stores).
    _token: str | None = None
    _slot: str | None = None
    _fencing_token: int | None = None
    _acquired_at = 0.0
    _expires_at = 0.0
    #: The process that took the lock (a fork of it does not hold it), and an acquire running.
    _pid = 0
    _acquiring = False
    #: The owner label an attempt passes as the one that may hold one slot only, or ``""``
    #: (:attr:`one_slot_per_owner`, on a semaphore).
    _sole = ""
    _lost = False
    #: The token the last release took (the one :meth:`on_lost` names once it is taken).
    _released_token: str | None = None
    #: When the last release was sent (by :attr:`clock`).
    _release_began = 0.0
    #: Renewed past ``max_hold`` (:meth:`_past_cap`): said once, in an ERROR.
    _overran = False
    #: The holder seen by the last failed attempt (``None`` if it was not contended).
    last_holder: _owner.Owner | None = None
    #: The last failed try found its holder on every node (:attr:`~._scripts.AcquireResult.whole`).
    _whole = False
    _holder_ttl: float | None = None
    #: How many acquisition tries this object has sent: each non-blocking try, and each try of
    #: a blocking wait, answered or not (a try the server never answered counts: it may have run
    #: there); a lock handed over to a waiter costs none.
    attempts = 0

    def __init__(
        self,
        redis: Any,
        name: str,
        ttl: float = 30.0,
        *,
        prefix: str = "redlock",
        owner: str = "",
        host: str | None = None,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_hold: float | None = None,
        limit: int = 1,
        clock: Clock = time.monotonic,
    ) -> None:
        check_arguments(ttl, max_hold, timeout, limit, blocking)
        if not self.checked_by_caller:
            check_given(prefix, name, owner, host, auto_renew, clock)
        self.nodes = self._connect(redis)
        if limit > 1:  # the node names are read only here (building them costs a URL parse)
            check_limit(limit, self.nodes.names)
            if self.one_slot_per_owner and owner:
                self._sole = owner
        self.name = name
        self.limit = limit
        self.keys = _keys.keys_for(prefix, name, limit)
        self.ttl = float(ttl)
        self.owner = owner
        self.host = host
        self.blocking = blocking
        self.timeout = timeout
        self.auto_renew = auto_renew
        self.max_hold = max_hold
        self.clock = clock
        self._state = Guard()  # free in a forked child that inherits the object

    @property
    def key(self) -> str:
        """The Redis key of this lock: the slot held, or the first slot when not held."""
        return self._slot or self.keys.lock

    @property
    def _observed(self) -> tuple[str, ...]:
        """The keys :meth:`locked` and :meth:`remaining_ttl` read: the slot held, or every slot
        (a semaphore not held by this object is locked while any of its slots is)."""
        return (self._slot,) if self._slot is not None and self._token else self.keys.slots

    @property
    def token(self) -> str | None:
        """The owner token stored in Redis while held."""
        return self._token

    @property
    def held(self) -> bool:
        """True between a successful acquire and release, unless the lock was lost; never in a
        process forked from the holder (it inherits the object, not the lock)."""
        return self._token is not None and not self.lost and not self._forked()

    @property
    def lost(self) -> bool:
        """True once the lock was found expired or owned by someone else while held, and from
        the end of the last confirmed lease on (by :attr:`clock`), even while Redis does not
        answer, or nobody renews (a fixed TTL, a renewal whose event loop ended): from then on
        another owner may exist. The second kind can end: a renewal sent within the lease and
        confirmed after its end (the process did not run in time) shows that Redis held the
        key throughout, and the lock is held again (a WARNING says so)."""
        if self._lost:
            return True
        return self._token is not None and self.clock() >= self._expires_at

    def on_lost(self, reason: str) -> None:
        """Called once when the lock is found lost; logs an ERROR naming the holder's task id
        (a worker runs several calls of one task: which one lost it). Override to react."""
        token = self._token or self._released_token or ""
        owner = _owner.parse(token)
        fence = self._fencing_token
        logger.error(
            "lock %s lost (token %s…, %s%s): %s",
            self.key,
            token[:8],
            # A single node's token is read on first use only: "None" read as a token.
            "no fencing token read" if fence is None else f"fencing token {fence}",
            f", task {owner.task_id}" if owner is not None and owner.task_id else "",
            reason,
        )

    def __getstate__(self) -> Any:
        """Refuse pickling and copying (``copy.copy`` included): the owner token is the
        ownership. Timeline this stops: (a) a copy is made while the lock is held; (b) the
        original releases; (c) the copy still says it is held and extends or releases as the
        owner, and in another process two objects would each act as the one holder."""
        raise TypeError(
            f"{self._kind} {self.name!r} cannot be pickled or copied: its owner token is its "
            "ownership; build a new lock of that name where it is needed"
        )

    def __repr__(self) -> str:
        """The state :attr:`held` and :attr:`lost` say (by the clock too), without I/O: a held
        lock's token that :attr:`fencing_token` has not read yet is shown ``(not read)``."""
        state = "lost" if self.lost else "held" if self.held else "free"
        token = self._fencing_token if state == "held" else None
        shown = "(not read)" if state == "held" and token is None else token
        return f"<{self._kind} {self.key} {state} fencing_token={shown}>"

    # -- what the public methods check ------------------------------------------------------------

    def _acquire_mode(self, blocking: bool | None, timeout: float | None) -> float | None:
        """The timeout of a blocking acquire, or ``-1.0`` for a single attempt; the object is
        then acquiring until the driver's ``acquire`` ends (it resets ``_acquiring``).

        One object holds once: a second ``acquire()`` while it holds, or while another thread
        or task is acquiring with it, is a :class:`RuntimeError`. Timeline this stops: (a) two
        threads call ``acquire()`` on one semaphore object; (b) both take a slot; (c) the
        object remembers one token, and the other slot stays taken until its TTL.
        """
        if blocking is not None and not isinstance(blocking, bool):
            raise ValueError(f"acquire blocking must be True, False or None, got {blocking!r}")
        if timeout is not None and not seconds(timeout, zero=True):
            raise ValueError(
                f"acquire timeout must be seconds >= 0 and <= {MAX_TTL:.0f}, or None, "
                f"got {timeout!r}"
            )
        with self._state:
            if self._token is not None and self._forked():  # the parent's: not this process's
                self._token = self._slot = self._fencing_token = None
            if self._token is not None:
                if self.lost:
                    raise RuntimeError(
                        f"lock {self.key} was lost while held by this object; release() it "
                        "first (which raises LockLost), or use a new Lock"
                    )
                raise RuntimeError(f"lock {self.key} is already acquired by this object")
            if self._acquiring:
                raise RuntimeError(
                    f"lock {self.key} is being acquired by this object in another thread or "
                    "task; a Lock object is one holder: use one per thread or task"
                )
            self._acquiring = True
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        return -1.0 if not blocking or timeout == 0 else timeout

    def _forked(self) -> bool:
        """Whether this process is a fork of the one that took the lock."""
        return self._pid != _owner.process_id

    def _not_ours(self, what: str) -> LockNotOwned:
        """:class:`LockNotOwned` for ``what`` (release, extend) in a forked child of the holder.

        Timeline: (a) a process holds the lock in ``with lock:``; (b) it forks; (c) the child
        leaves the ``with`` block and would release the parent's lock while the parent runs
        on. The child inherits the object, not the lock, as it inherits no renewal.
        """
        return LockNotOwned(
            f"cannot {what} {self.key}: process {self._pid} holds it, and this process "
            f"({_owner.current_pid()}) is a fork of that one; only the holder may {what} it",
            key=self.key,
        )

    def _release_token(self, keep: float) -> str:
        """The token to release, taken from this object: a second ``release()`` that starts
        while the first is under way (another thread, another task) raises
        :class:`LockNotOwned`, as after it. Without taking it, (1) two releases read the token;
        (2) the first deletes the key; (3) the second finds the key gone and reports the lock
        lost (:class:`LockLost`, an ERROR), though nothing expired or changed owner."""
        if self._token is None:
            raise self._not_acquired()
        if (keep != 0 or isinstance(keep, bool)) and not seconds(keep, zero=True):
            raise ValueError(
                f"release keep must be seconds >= 0 and <= {MAX_TTL:.0f}, got {keep!r}"
            )
        if self._pid != _owner.process_id:
            raise self._not_ours("release")
        if self.auto_renew:  # before the token is given up: see _released
            self._stop_renewal()
        with self._state:
            token, self._token = self._token, None
        if token is None:
            raise self._not_acquired()
        self._released_token = token  # what a release that finds the lock lost logs
        self._release_began = self.clock()  # _released: did the lease end on its way?
        return token

    @contextlib.contextmanager
    def _leaving(self, raised: bool) -> Iterator[None]:
        """The release on the way out of a ``with`` block: an expired lock is no error
        (:meth:`on_lost` logs it), and when the block raised, a Redis that does not answer
        is a WARNING, and the block's exception goes on. Timeline otherwise: (1) the body
        raises ``KeyError``, or its task is cancelled; (2) Redis does not answer the release;
        (3) the caller gets :class:`LockUnavailable`, with the ``KeyError`` only in its
        context, and a cancelled task ends not cancelled. The lock ends with its lease (its
        renewal stopped at the release)."""
        try:
            yield
        except LockLost:
            pass
        except LockUnavailable as exc:
            if not raised:
                raise
            logger.warning(
                "lock %s not released on the way out of a block that raised (it ends with its "
                "lease): %s",
                self.key,
                exc,
            )

    def _not_acquired(self) -> LockNotOwned:
        return LockNotOwned(f"cannot release {self.key}: not acquired", key=self.key)

    def _released(self, released: bool) -> None:
        """After the release call: :class:`LockLost` if the key was not ours any more.

        The token was taken from this object when the release began (:meth:`_release_token`).
        If the object took the lock again meanwhile (another thread or task), the new holding
        is left alone. Timeline otherwise: (1) task A's release takes the token and waits for
        Redis; (2) task B acquires with the same object; (3) A's release returns and forgets
        the token: B's acquire returned True, but ``held`` is False, its release raises
        :class:`LockNotOwned`, and the key stays held, unrenewed, until its TTL. The release
        stops the renewal before it gives the token up, so it never stops B's (a semaphore's
        B may take another slot while A's is being deleted).
        """
        with self._state:
            again = self._token is not None
            if released and not again:
                self._fencing_token = None  # the number of an acquisition that ended
        if not released:
            if not (again or self._lost) and self._release_began < self._expires_at <= self.clock():
                self._expired_on_the_way()
            elif not again:
                self._mark_lost("it was no longer held by this owner at release")
            raise LockLost(f"lock {self.key} expired or changed owner before release", key=self.key)

    def _expired_on_the_way(self) -> None:
        """A release sent within the lease, answered after its end, found the key gone: it
        expired while the release was on its way (Redis, or the network to it, stalled).
        Nothing ran beside the holder, whose work had ended within the lease: a WARNING, not
        a loss. Timeline it closes: (1) the lease ends at 6 s; (2) the body returns at 4 s
        and the release is sent; (3) Redis is stalled (a fork, SIGSTOP, a VM pause) until
        8 s, then answers that the key is gone; (4) the holder was reported lost (ERROR,
        ``lock_lost``), a false alarm to whoever undoes writes on that signal. A key
        released by force, or lost with Redis's data, before the body ended is reported so
        too when the answer comes that late: the stall hides which."""
        logger.warning(
            "lock %s expired while its release was on its way: Redis answered %.1fs after the "
            "lease's end, and the release was sent %.1fs before it; the holder's work ended "
            "within the lease",
            self.key,
            self.clock() - self._expires_at,
            self._expires_at - self._release_began,
        )

    def _extend_args(self, ttl: float | None) -> tuple[str, float]:
        """The token and TTL of an extend: ``ttl`` (default: the lock's), capped so that the
        lock never lives past acquisition + ``max_hold``, as renewal is."""
        token = self._token
        if token is not None and self._lost:  # as an extend that finds it gone raises
            raise LockLost(f"cannot extend {self.key}: it was lost", key=self.key)
        if token is None:
            raise LockNotOwned(f"cannot extend {self.key}: not held", key=self.key)
        ttl = self.ttl if ttl is None else ttl
        if not seconds(ttl) or ttl < MIN_TTL:
            raise ValueError(
                f"extend ttl must be seconds >= {MIN_TTL} (whole milliseconds) and <= "
                f"{MAX_TTL:.0f}, got {ttl!r}"
            )
        if self._pid != _owner.process_id:
            raise self._not_ours("extend")
        if self.max_hold is not None:
            to_cap = self._acquired_at + self.max_hold - self.clock()
            beyond = self._beyond_cap(to_cap)  # a task's lock still running at its cap
            ttl = min(ttl, to_cap if beyond is None else beyond)
            if ttl <= 0.001:  # its key expired there (every TTL is capped so): lost
                raise LockLost(
                    f"cannot extend {self.key}: it reached max_hold={self.max_hold:g}s",
                    key=self.key,
                )
        return token, ttl

    def _extended(self, token: str, extended: Extended, start: float, ttl: float) -> None:
        """An extend's reply for the holding of ``token``: :class:`LockLost` if it was gone;
        a holding taken since by this object is left alone (see :meth:`_mark_lost`), and one
        this object released meanwhile is :class:`LockNotOwned`, as after the release.
        Timeline otherwise: (1) thread A's extend reads the token; (2) thread B releases, and
        the key is deleted; (3) A's extend finds it gone, and raised :class:`LockLost`,
        though nothing expired or changed owner."""
        if not extended.held:
            with self._state:
                released = self._token != token
            if released:
                raise LockNotOwned(
                    f"cannot extend {self.key}: it was released while the extend was on its way",
                    key=self.key,
                )
            self._mark_lost("extend found it expired or owned by someone else", token)
            raise LockLost(f"lock {self.key} was lost before extend", key=self.key)
        with self._state:
            if self._token == token:
                self._expires_at = start + ttl

    def _contended(self, ttl: float | None) -> LockContended:
        """What the context manager raises when it could not acquire in time (``ttl``: the
        holder's, :attr:`last_holder_ttl`)."""
        holder = self.last_holder.task_id if self.last_holder else None
        if self.blocking and self.timeout is not None:
            message = f"could not acquire {self.key} within {self.timeout}s"
        else:
            message = f"could not acquire {self.key}: it is held (blocking=False)"
        return LockContended(message, key=self.key, holder=holder, ttl=ttl)

    # -- acquisition ------------------------------------------------------------------------------

    def _lease(self) -> float:
        """The ttl of one acquisition: the lock's, capped by ``max_hold``."""
        return self.ttl if self.max_hold is None else min(self.ttl, self.max_hold)

    def _new_token(self) -> str:
        cap = 0 if self.max_hold is None else ms(self.max_hold)
        # ms(self.ttl) inline (a ttl is >= MIN_TTL): one call fewer per acquisition try.
        lease = int(self.ttl * 1000) if self.auto_renew else 0
        return _owner.new_token(self.owner, self.host, None, cap, lease)

    def _try_token(self) -> str:
        """The owner token of one acquisition try, counted in :attr:`attempts` as it is sent."""
        self.attempts += 1
        return self._new_token()

    def _result(self, token: str, start: float, ttl: float, result: AcquireResult) -> bool:
        """Take in an acquisition's reply; whether it holds the lock now."""
        if not result.acquired:
            self._saw(result.holder, result.pttl_ms)
            self._whole = result.whole
            return False
        self._hold(token, start, ttl, result.slot or 1, result.fencing_token, result.complete)
        return True

    def _saw(self, holder: str | None, pttl: int | None) -> None:
        """A failed attempt saw ``holder`` (and its PTTL in ms, if the reply had one)."""
        self.last_holder = _owner.parse(holder)
        self._holder_ttl = None if pttl is None or pttl < 0 else pttl / 1000.0

    def _hold(
        self,
        token: str,
        start: float,
        ttl: float,
        slot: int = 1,
        fencing: int | None = None,
        complete: bool = True,
    ) -> None:
        with self._state:
            self._pid = _owner.process_id
            self._acquired_at = start
            self._expires_at = start + ttl  # before the token: `lost` reads both unlocked
            self._lost = False
            self._token = token
            self._slot = self.keys.slots[slot - 1]
            self._fencing_token = fencing
            self.last_holder = None
            self._holder_ttl = None
        if self.auto_renew:
            self._start_renewal(self._renewal_delay(complete, start))

    def _fenced(self, token: str, value: int | None) -> None:
        """Take in the fencing token read for ``token`` (``None``: not held any more: lost).
        Either finding is about that holding only (see :meth:`_mark_lost`)."""
        if value is None:
            self._mark_lost("its fencing token was read after it expired or changed owner", token)
        with self._state:
            if value is not None and self._token == token and self._fencing_token is None:
                self._fencing_token = value

    # -- the blocking wait: what to ask the driver for, and what its replies mean ---------------

    def _wait(self, timeout: float | None) -> Steps[bool]:
        """Blocking acquire: retry on each release notification or holder expiry (hazard 4 of
        :mod:`~celery_redlock._redis.lock`); a generator of the driver's requests (:class:`Op`).

        The waiter subscribes to a release channel and waits for the server's confirmation
        before it tries, so a release after that try is never missed. Then it blocks, never
        polling, until a notification arrives, the holder's TTL ends (a holder that dies
        without releasing publishes nothing) or the deadline passes.

        On a single node, the waiters of a lock queue (:data:`~._scripts.WAIT`), each on a
        channel of its own, and a release hands the lock straight to the first of them: the
        key goes from the old holder's token to the waiter's in one script, never free, and the
        waiter learns it from its channel, with no round trip of its own. The waiter queued
        next is woken to try once more, and sleeps on the new holder's TTL: it slept on the old
        one's, and a new holder that dies within its shorter lease would otherwise leave the
        key free while it sleeps (so is the next one when a waiter takes the lock free, or
        leaves the queue). The other waiters sleep on. (On a Cluster the first waiter is only
        woken, and tries.) A handoff is never lost to a waiter that gives up:

        1. W1 and W2 are queued; A releases, which hands the lock to W1 and publishes it;
        2. W1's deadline passes before it reads the message;
        3. W1 leaves (:data:`~._scripts.LEAVE`), which finds it holding the lock: W1 returns
           True, holding it (and W2's turn comes with W1's release).

        A waiter handed the lock counts its lease from before its last try, the latest moment
        it knows the handoff had not yet happened; if that was more than half a lease ago, it
        extends the lock first. A waiter that dies after being handed the lock holds it until
        the lease ends, like any holder that dies. A semaphore, a quorum, or an ACL user
        without the queue's commands waits on the lock's shared release channel instead: a
        release wakes every waiter, each tries once, one wins. If the node carrying the
        notifications stops answering, the waiter leaves the queue (taking a handoff that came
        meanwhile) and subscribes again (to another node of a quorum); a single node that is
        down raises :class:`LockUnavailable` from the next attempt, and so do two subscriptions
        in a row that fail before they are confirmed (a server at ``maxclients``, whose pooled
        connections still answer the attempts: without this, a busy loop). An interrupted wait
        (``SystemExit`` from a revoke or time limit, a soft time limit or any exception a
        signal handler raises, ``KeyboardInterrupt``, a cancelled task) leaves the queue and
        gives back a lock handed over meanwhile. Without that, (1) W1 is interrupted and its
        entry stays first; (2) A's release hands the lock to W1's entry; (3) W2, alive behind
        it, waits for that lock's whole lease, held by nobody.
        """
        deadline = None if timeout is None else self.clock() + timeout
        unconfirmed = 0  # subscriptions in a row that failed before they were confirmed
        while True:
            if (yield Op.ATTEMPT, None):
                return True
            if deadline is not None and deadline <= self.clock():
                return False
            wait = None
            if self.nodes.queues(self.keys):  # on a channel of its own
                wait = Wait(self.keys, self._new_token(), self._lease())
            yield Op.SUBSCRIBE, self.keys.channel if wait is None else wait.channel
            # How the subscription ends (Op.CLOSE); None: the driver closes the wait itself.
            closing: Closing | None = Closing.REUSE if wait is not None else Closing.CLOSE
            try:
                subscribed = False
                woken = False  # a message came since the last try
                backoff: float | None = None  # trying again soon (see `_again_soon`)
                while True:
                    sleep = 1.0  # until the subscription is confirmed, or a key without expiry
                    if subscribed:
                        before, was_whole = self.last_holder, self._whole
                        if wait is None:
                            won = yield Op.ATTEMPT, None
                        else:
                            won = yield from self._queued_attempt(wait)
                        if won is None:  # the queue was refused: use the release channel
                            break
                        if won:
                            return True
                        holder_ttl = yield Op.HOLDER_TTL, None
                        if holder_ttl is not None:
                            sleep = holder_ttl
                        if self.nodes.releases_node_by_node:
                            # The try before found the holder on every node, this one does
                            # not: a release under way, whose message may have come before
                            # the subscription did.
                            changed = was_whole and not self._whole
                            backoff = _again_soon(
                                before, self.last_holder, woken or changed, backoff
                            )
                        if backoff is not None:
                            sleep = min(sleep, backoff)
                    if deadline is not None:
                        left = deadline - self.clock()
                        if left <= 0:
                            return wait is not None and (yield from self._leave(wait))
                        sleep = min(sleep, left)
                    data = yield Op.RECEIVE, max(sleep, 0.001)
                    woken = data is not None and data is not SUBSCRIBED
                    if data is SUBSCRIBED:
                        subscribed = True
                    elif wait is not None and (yield from self._handed(wait, data)):
                        return True
            except LockUnavailable:  # the node is down: leaving the queue would wait again
                closing = Closing.CLOSE if wait is None else Closing.STRANDED
                raise
            except GeneratorExit:  # closed by its driver, which performs nothing more
                closing = None
                raise
            except BaseException as exc:
                closing = Closing.CLOSE
                if isinstance(exc, Exception) and classify(exc) is Outcome.UNAVAILABLE:
                    # The channel is gone; a handoff may have come before: take it, or wait anew.
                    if wait is not None and (yield from self._leave(wait, quietly=True)):
                        return True
                    if wait is not None:  # the leave may have failed too
                        closing = Closing.STRANDED
                    unconfirmed = 0 if subscribed else unconfirmed + 1
                    if unconfirmed > 1:  # no channel can be had (maxclients): no busy loop
                        raise unavailable(exc, self.key, tuple(self.nodes.names)) from exc
                    continue
                if wait is not None:  # leave the queue, giving back a lock handed over meanwhile
                    yield Op.ABANDON, (wait.member, wait.secret)
                if isinstance(exc, Exception) and classify(exc) is Outcome.REFUSED:
                    # SUBSCRIBE refused (an ACL user without +subscribe): as any refusal
                    raise unavailable(exc, self.key, tuple(self.nodes.names)) from exc
                raise
            finally:
                if closing is not None:
                    yield Op.CLOSE, closing

    def _queued_attempt(self, wait: Wait) -> Steps[bool | None]:
        """A queued waiter's try (``None``: the queue was refused)."""
        token = self._try_token()
        start = self.clock()
        reply = yield Op.QUEUED, (token, ms(wait.ttl), wait.member, wait.secret)
        if reply is None:
            return None
        if reply.held is None:
            wait.tried_at = start
            self._saw(reply.holder, reply.pttl_ms)
            return False
        if reply.held == token:  # taken now
            self._hold(token, start, wait.ttl)
            yield Op.FENCE, token
            return True
        return (yield from self._handed(wait, reply.held))  # handed over before this try

    def _handed(self, wait: Wait, data: Any) -> Steps[bool]:
        """Whether ``data``, a message on the waiter's channel (``None``: none came), handed
        the lock to it (then held). Its lease counts from its last try, which began before the
        handoff; after more than half a lease it extends first, and a lock no longer ours once
        extended (the lease ended before the waiter read the message) waits on."""
        token = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if data is None or not token.startswith(wait.secret + _owner.SEPARATOR):
            return False
        since = wait.tried_at
        if self.clock() - since > wait.ttl / 2:
            since = self.clock()
            if not (yield Op.EXTEND, (token, wait.ttl)).held:
                return False
        self._hold(token, since, wait.ttl)
        yield Op.FENCE, token
        return True

    def _leave(self, wait: Wait, quietly: bool = False) -> Steps[bool]:
        """Leave the queue (the deadline passed, or the channel broke); True if the lock was
        handed over meanwhile (then held). ``quietly``: Redis errors mean False."""
        try:
            held = yield Op.LEAVE, (wait.member, wait.secret)
        except Exception as exc:
            if not quietly or classify(exc) is None:
                raise
            return False
        return held is not None and (yield from self._handed(wait, held))

    def _mark_lost(self, reason: str, token: str | None = None) -> None:
        """Mark the holding lost and stop its renewal; with ``token``, only if that is still
        the holding. A reply about an earlier holding of this object arrives late, timeline:
        (1) thread A reads ``fencing_token`` (or extends), and the reply is on its way; (2)
        thread B releases and acquires again with the same object; (3) A's reply says the
        old token is not held, and the new holding, valid, was marked lost, its renewal
        stopped and its key left to expire while B runs on."""
        with self._state:
            if self._lost or (token is not None and self._token != token):
                return
            self._lost = True
        self._stop_renewal()
        self.on_lost(reason)

    def _connect(self, redis: Any) -> Any:
        raise NotImplementedError  # each driver builds its own nodes

    def _start_renewal(self, delay: float) -> None:
        raise NotImplementedError  # each driver schedules its own renewal, first in ``delay`` s

    def _stop_renewal(self) -> None:
        raise NotImplementedError

    # -- the renewal policy -----------------------------------------------------------------------

    def _past_cap(self) -> float | None:
        """The TTL with which a holder still running near its ``max_hold`` renews past it, or
        ``None``: it stops at the cap, and the key expires on its own then (a ``Lock``'s
        ``max_hold`` is a promise). A task's lock overrides it: there the cap is the hard time
        limit's, which the worker's main process enforces by killing the holder."""
        return None

    def _beyond_cap(self, to_cap: float) -> float | None:
        """The TTL with which a holder ``to_cap`` seconds before its ``max_hold`` cap (or past
        it) renews, and extends, past the cap (:meth:`_past_cap`); ``None``: not yet, or never
        (it stops at the cap)."""
        keep = self._past_cap()
        return keep if keep is not None and to_cap <= keep / 2 else None

    def _renewal(self) -> tuple[str, float, float, float] | None:
        """What one renewal sends: ``(token, ttl, start, wait)``, the reply awaited for at most
        ``wait`` seconds (a reply after the lease's end is no use); ``None``: stop (released,
        lost, or the ``max_hold`` cap reached: the key then expires on its own at the cap)."""
        token = self._token
        if token is None or self._lost:
            return None
        now = self.clock()
        ttl = self.ttl
        if self.max_hold is not None:
            to_cap = self._acquired_at + self.max_hold - now
            keep = self._beyond_cap(to_cap)
            if keep is not None:
                ttl = keep  # still running at the cap: renewed past it (_past_cap)
                if not self._overran:
                    self._overran = True
                    logger.error(
                        "lock %s: its holder still runs %.1fs before max_hold=%gs, by which "
                        "it should have been stopped (a task's hard time limit + "
                        "redlock_ttl_margin: the worker's main process did not kill it); the "
                        "lock is kept while it runs, renewed %gs at a time",
                        self.key,
                        max(to_cap, 0.0),
                        self.max_hold,
                        keep,
                    )
            else:
                ttl = min(ttl, to_cap)
                if ttl <= 0.001:  # the cap, planned: no ERROR (`lost` says it at the lease's end)
                    return None
        left = self._expires_at - now
        if left <= 0:
            self._mark_lost("the lease ran out before a renewal was confirmed", token)
            return None
        return token, ttl, now, left

    def _renewal_failed(self, token: str, exc: BaseException) -> float | None:
        """A renewal failed (no answer, an error reply, no reply in time, or a bug): the delay
        until the next try, or ``None`` (released meanwhile, or lost: the lease ran out).

        Every failure is retried: half the time left, so that a retry still fits in the lease,
        at most ``ttl / 3`` and 1 s; the last one at the lease's end, which then marks the
        lock lost (no retries in a tight loop).
        """
        if self._token != token:
            return None
        left = self._expires_at - self.clock()
        if left <= 0:
            self._mark_lost(
                f"no renewal was confirmed before the lease ran out ({describe(exc)})", token
            )
            return None
        logger.warning(
            "lock %s: renewal failed, retrying (lease ends in %.1fs): %s",
            self.key,
            left,
            describe(exc),
            exc_info=classify(exc) is None,
        )
        delay = min(self.ttl / 3, 1.0, left / 2)
        return delay if delay >= MIN_RETRY else left

    def _renewed(self, token: str, start: float, ttl: float, extended: Extended) -> float | None:
        """A renewal's reply: the delay until the next one, or ``None`` to stop."""
        if self._token != token:  # released while the extend was in flight
            return None
        if not extended.held:
            self._mark_lost("renewal found it expired or owned by someone else", token)
            return None
        late = self.clock() - self._expires_at
        if late > 0:  # Redis held the key throughout: the extend ran before it expired
            logger.warning(
                "lock %s: a renewal was confirmed %.1fs after the lease it extended had ended "
                "(this process did not run in time: a starved CPU, a pause); `lost` said True "
                "meanwhile, though Redis held the key; raise redlock_lease (or the lock's ttl)",
                self.key,
                late,
            )
        self._expires_at = start + ttl
        return self._renewal_delay(extended.complete, start)

    def _renewal_delay(self, complete: bool, start: float) -> float:
        """Seconds until the next renewal: ``ttl / 3``; lease/30 (at least
        :data:`DEGRADED_RENEWAL`) after an acquisition or renewal that a quorum node lacked
        (down, late, or rejoined empty). So a node that comes back gets the lock again before
        another node can fail, and a renewal that waits for a silent node's timeout still
        fits in the lease: the first renewal at ``ttl / 3`` of a 1.5 s lock acquired in the
        0.5 s a frozen node took would have had 0.5 s left for another 0.5 s round.

        Counted from ``start``, when the confirmed call was sent (its lease counts from then),
        not from its reply. Timeline otherwise, on a starved CPU: (1) an acquire is sent; (2)
        its reply is handled 2.7 s later; (3) the first renewal was due ``ttl / 3`` after that,
        past the 3 s lease: the lock read as lost 0.3 s into the body."""
        delay = (
            self.ttl / 3 if complete else min(self.ttl / 3, max(DEGRADED_RENEWAL, self.ttl / 30))
        )
        delay = max(0.0, delay - (self.clock() - start))
        keep = self._past_cap()
        if keep is None or self.max_hold is None:
            return delay
        # A holder that renews past its cap is asked at keep / 2 before it (while the key still
        # lives), then every keep / 3.
        to_cap = self._acquired_at + self.max_hold - self.clock()
        return min(delay, to_cap - keep / 2 if to_cap > keep / 2 else keep / 3)


class Op(enum.Enum):
    """A request of the blocking wait (:meth:`LockCore._wait`) to its driver, with an argument;
    the driver sends back the result, or throws in the error it raised (:class:`Run`).
    Each value says what the driver does: the argument, then the result."""

    ATTEMPT = "one try (the driver's _attempt()): whether it holds the lock now"
    QUEUED = "(token, ttl_ms, member, secret): the node's wait_attempt reply"
    HOLDER_TTL = "the TTL in seconds of the holder the last try saw (None: unknown)"
    SUBSCRIBE = "channel: open a subscription to it (RECEIVE returns its confirmation)"
    RECEIVE = "timeout: SUBSCRIBED, a message's data on the channel, or None after timeout s"
    EXTEND = "(token, ttl): the driver's do_extend"
    FENCE = "token: the lock was taken without a fencing token; read it (now, or on first use)"
    LEAVE = "(member, secret): the node's leave; the token of a lock handed over, or None"
    ABANDON = "(member, secret): leave, errors aside, and release a lock handed over meanwhile"
    CLOSE = "a Closing: the wait on the subscription ended; keep it, close it, or strand it"


class Closing(enum.Enum):
    """How a wait's subscription ends (the argument of :attr:`Op.CLOSE`).

    A queued wait that ends normally left the queue (a script removed the waiter, or never
    queued it): nothing is published on its own channel again (``REUSE``). An interrupted one
    leaves it as :attr:`Op.ABANDON` asks. One whose leave got no answer may still be queued
    (``STRANDED``): the thread driver closes its connection, so that a release finds no
    subscriber on its channel and passes the entry over; the asyncio driver, whose connection
    carries the loop's other waits, leaves in the background until Redis answers (and gives
    back a lock handed over meanwhile). Timeline without it: (1) W1 is queued; (2) Redis stalls
    past W1's deadline and its LEAVE gets no reply; (3) A's release hands the lock to W1's
    entry, whose channel still counts a subscriber; (4) W2 waits out that lock's whole lease,
    held by nobody.
    """

    REUSE = "the channel is dead: the connection may serve the next wait"
    CLOSE = "the channel is the lock's shared one, or the wait failed on it: close it"
    STRANDED = "the waiter may still be queued: close the connection, or leave in the background"


#: What :attr:`Op.RECEIVE` returns once the server confirmed the subscription.
SUBSCRIBED: Any = object()

T = TypeVar("T")

#: A decision that asks its driver for I/O: ``(op, argument)`` requests, returning a ``T``.
Steps = Generator[tuple[Op, Any], Any, T]


class Run(Generic[T]):
    """A driver's view of ``steps``: iterate for its requests, set :attr:`reply` (or
    :attr:`error`, thrown into ``steps``) before the next; :attr:`result` once it is done."""

    result: T
    reply: Any = None
    error: BaseException | None = None

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps

    def __iter__(self) -> Iterator[tuple[Op, Any]]:
        while True:
            reply, error, self.reply, self.error = self.reply, self.error, None, None
            try:
                request = self.steps.throw(error) if error is not None else self.steps.send(reply)
            except StopIteration as stop:
                self.result = stop.value
                return
            yield request


class Wait:
    """One blocking wait in a lock's waiter queue: its channel, and the owner token and ttl a
    release hands the lock over with (:func:`~celery_redlock._redis.scripts.queue_member`)."""

    def __init__(self, keys: _keys.LockKeys, token: str, ttl: float) -> None:
        self.channel = channel = _keys.waiter_channel(keys, os.urandom(8).hex())
        self.ttl = ttl
        self.secret = token.partition(_owner.SEPARATOR)[0]
        self.member = queue_member(channel, token, ms(ttl))
        #: When the last try began (it found the lock held): a handoff came after it.
        self.tried_at = 0.0
