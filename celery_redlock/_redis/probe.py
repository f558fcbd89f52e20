"""What a lock Redis allows: reachability, ``INFO``, and a dry run of every command, per feature.

A feature (:data:`FEATURES`) is what a task may use: the lock itself, the queue of blocking
waiters, ``lock_enqueue="keep"``, ``replace``/``lock_debounce``, ``lock_rate``, and the
``celery redlock`` command line. Its commands are those its scripts declare
(:class:`~celery_redlock._redis.scripts.base.Script`, pinned against each script's source by a
test) plus those it sends directly. :func:`dry_run` sends each command once, directly, on
throwaway keys under the prefix: Redis checks a command that a script runs against the calling
user exactly as a direct call, and a direct call's refusal names the command (inside a script,
Redis 7 does not say which command was refused). So the startup check and the scripts cannot
disagree, and the check reports per feature (:mod:`celery_redlock._celery.checks`).

The keys live a second at most; nothing of a real lock is touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis as redis_py
from redis.cluster import RedisCluster

from . import scripts as _scripts
from .clients import UNAVAILABLE_ERRORS, as_text, client_for, refused
from .core import MOVED_HINT, Outcome, classify, password_missing, refusal_hints
from .keys import CHECK_NAME, glob_escape, keys_for, lock_pattern, stats_key, timeline_key
from .scripts.base import Script
from .subscriptions import pubsub_of


@dataclass(frozen=True)
class Feature:
    """The commands one feature needs: its scripts' and those it sends directly."""

    name: str
    scripts: tuple[Script, ...]
    direct: tuple[str, ...] = ()
    #: Its probes of :data:`KEY_PROBES`: keys outside the lock's ``<prefix>:{...}`` family.
    keys: tuple[str, ...] = ()

    @property
    def commands(self) -> tuple[str, ...]:
        """Every command the feature cannot work without (``redis.pcall`` ones aside)."""
        found = dict.fromkeys(["EVALSHA", "SCRIPT|LOAD"] if self.scripts else [])
        for script in self.scripts:
            found.update(dict.fromkeys(script.commands))
        found.update(dict.fromkeys(self.direct))
        return tuple(found)

    @property
    def checked(self) -> tuple[str, ...]:
        """The names of the :func:`dry_run` probes whose refusal the feature reports."""
        return (*self.commands, *self.keys)


def _named(scripts: tuple[Script, ...], *names: str) -> tuple[Script, ...]:
    return tuple(script for script in scripts if script.name in names)


#: The probes of key patterns, sent after :data:`ORDER`: the scripts also write keys outside the
#: lock's ``<prefix>:{...}`` family, which an ACL line may leave out (``~redlock:{*``): the
#: fencing tokens' high-water mark (``<prefix>:fence:{<tag>}``, probed on a throwaway tag) and
#: the ring of ``redlock_timeline`` (``<prefix>:timeline``, an ``LTRIM`` that keeps every
#: event). Each is reported only when its key is refused (a refused command has its own probe).
HIGH_WATER = "SET (the fencing tokens' high-water mark)"
RING = "LTRIM (the timeline ring)"
KEY_PROBES = (HIGH_WATER, RING)

#: The features, by name. ``lock``: every locked task (the acquire ``SET ... NX PX GET`` and
#: the holder's ``PTTL``, the release notification, ``SUBSCRIBE`` for blocking waits, ``PING``
#: for a quorum); ``counters``: every locked task's event counters (:mod:`celery_redlock.metrics`;
#: the tasks run without them); ``queue``: the queue of blocking waiters
#: (without it a release wakes every waiter); ``timeline``: an app's ``redlock_timeline`` ring
#: (every locked task pushes its events); ``cli``: ``celery redlock ls/inspect/stats``;
#: ``dashboard``: what ``celery redlock web`` adds to those (markers, waiters, the ring).
FEATURES: dict[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature(
            "lock",
            _named(
                _scripts.LOCK_SCRIPTS,
                "acquire",
                "release",
                "extend",
                "release_attempt",
                "fence",
                "raise_fence",
            ),
            ("SET", "GET", "PTTL", "PUBLISH", "SUBSCRIBE", "PING"),
            (HIGH_WATER,),
        ),
        Feature("counters", (), ("HINCRBY",)),
        # ZRANGE: a release, take or leave wakes the waiter queued next (read, not popped)
        Feature("queue", _scripts.QUEUE_SCRIPTS, ("EXISTS", "ZPOPMIN", "ZRANGE")),
        Feature(
            "enqueue",
            _named(_scripts.COMPANION_SCRIPTS, "mark_queued", "confirm_queued", "clear_queued"),
        ),
        Feature(
            "newest",
            _named(_scripts.COMPANION_SCRIPTS, "mark_newest", "confirm_newest", "check_newest"),
        ),
        Feature("rate", _named(_scripts.COMPANION_SCRIPTS, "rate")),
        Feature("timeline", _named(_scripts.COMPANION_SCRIPTS, "ring_push"), (), (RING,)),
        Feature(
            "cli",
            _named(_scripts.LOCK_SCRIPTS, "pttls", "release_unrenewed"),
            # ZPOPMIN: a release hands the lock to a queued waiter; ZRANGE, ZREM: and wakes the
            # next one (dropping those gone)
            ("SCAN", "GET", "MGET", "EXISTS", "HGETALL", "ZPOPMIN", "ZRANGE", "ZREM"),
        ),
        Feature(
            "dashboard",
            _named(_scripts.COMPANION_SCRIPTS, "clear_marker"),
            ("PTTL", "DUMP", "GET", "LLEN", "HGET", "ZCARD", "LRANGE"),
        ),
    )
}

#: The commands :func:`dry_run` sends, in the order it sends them (a key is written before the
#: command that removes it).
ORDER = (
    "PING",
    "TIME",
    "SET",
    "GET",
    "DUMP",
    "MGET",
    "PTTL",
    "PEXPIRE",
    "DEL",
    "EXISTS",
    "PUBLISH",
    "SUBSCRIBE",
    "HSET",
    "HGET",
    "HGETALL",
    "HDEL",
    "HINCRBY",
    "RPUSH",
    "LPUSH",
    "LINDEX",
    "LLEN",
    "LRANGE",
    "LTRIM",
    "ZADD",
    "ZCARD",
    "ZRANGE",
    "ZREM",
    "ZPOPMIN",
    "SCAN",
    "SCRIPT|LOAD",
    "EVALSHA",
)

#: What ends a check early: a node that stops answering, an unexpected error reply.
ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, redis_py.RedisError)


def connect(url: str, timeout: float) -> Any:
    """A client of ``url`` that has answered ``PING``, or refused it (an ACL user without
    ``+ping``: reachable; :func:`dry_run` names the refusal). Raises what the connection raised.
    """
    client = client_for(url, timeout)
    try:
        client.ping()
    except redis_py.exceptions.ResponseError as exc:
        if not (refused(exc) and "'ping'" in str(exc)):
            raise
    return client


_RUN = re.compile(r"run the '([^']+)' command")


def key_refused(reply: str) -> bool:
    """Whether a ``NOPERM`` refusal is of a key, as Redis 6.2 and 7.0 ("one of the keys") and
    7.2 and newer ("No permissions to access a key") word it."""
    text = reply.lower()
    return "of the keys" in text or "access a key" in text


def refused_command(reply: str) -> str | None:
    """The command that a ``NOPERM`` refusal names, lower-case; ``None`` when it names none
    (a refusal inside a script)."""
    named = _RUN.findall(reply)
    return named[0].lower() if named else None


def acl_rule(reply: str, prefix: str, command: str = "") -> str:
    """The ACL rule that grants what ``reply`` (a ``NOPERM`` refusal, direct or inside a
    script) refused: ``~<prefix>:*`` for a key, ``&<prefix>:*`` for a channel, else
    ``+<command>`` (``command``, or the one the reply names); ``""`` when it names none (a
    refusal inside a script does not say which command). Redis 6.2 to 7.4 wordings."""
    if key_refused(reply):
        return f"~{glob_escape(prefix)}:*"
    if "channel" in reply.lower():
        return f"&{glob_escape(prefix)}:*"
    named = command.lower() or refused_command(reply)
    return f"+{named}" if named else ""


def login_refusal(exc: BaseException) -> str | None:
    """What to fix in the URL when the server answered the connection with a refusal (what
    :func:`connect` raised), or ``None`` when it did not answer. A server that refuses the
    login or the database answers: it is reachable, and retrying will not help."""
    text = str(exc)
    missing = password_missing(exc)
    if missing is not None:
        return missing
    if any(cls.__name__ == "AuthenticationError" for cls in type(exc).__mro__):
        return "the user name or password is wrong (or the user is disabled)"
    if "DB index is out of range" in text:
        return "the database number is above the server's 'databases' setting"
    if refused(exc) and "'select'" in text:
        return "the ACL user lacks +select, which a database other than 0 needs"
    return None


#: The hash slots of a Redis Cluster.
CLUSTER_SLOTS = 16384

#: What to use instead of a plain URL naming a Sentinel (:class:`Misfit`).
SENTINEL_FIX = (
    "a Sentinel answers its own commands only (PING, INFO, SENTINEL...): name the Sentinels "
    "in a redis+sentinel://host:port/<service> URL"
)


class Misfit(NamedTuple):
    """A server that a plain URL reaches, through which not every lock can be reached."""

    #: What it is: "a Redis Sentinel", "a node of a Redis Cluster that serves 5461 of ...".
    what: str
    #: The URL to use instead, and why.
    fix: str
    #: Whether it is a Sentinel (no lock can be reached), not a Cluster's node (some can).
    sentinel: bool


def misfit(client: Any, info: Mapping[str, Any], listing: bool = False) -> Misfit | None:
    """What the server that a plain URL's ``client`` reaches is, and the URL to use instead,
    when that URL cannot reach every lock; ``None`` when it can. ``info`` is its ``INFO``.
    The one check of the worker's startup check and of the inventory (``celery redlock``).

    * A Redis Sentinel (``redis_mode:sentinel``): it knows none of the lock's commands.
    * A node of a Redis Cluster (``cluster_enabled:1``) that does not serve every slot itself
      (its ``CLUSTER NODES`` line; refused, not known): a key of another node's slot is
      refused with ``MOVED``, and a ``SCAN`` lists the node's own keys only. Timeline without
      the check: (1) ``redlock_url`` names one node of three; (2) ``celery redlock ls``
      lists the locks on that node, and exits 0; (3) ``release --dead`` keeps the dead
      workers' locks on the two others, and says it released them all. With ``listing``
      (the inventory) a node that serves every slot is refused too: a lock's commands work
      there, but a listing reads keys of several slots at once (``MGET``: ``CROSSSLOT``).
    """
    if as_text(info.get("redis_mode", "")) == "sentinel":
        return Misfit("a Redis Sentinel", SENTINEL_FIX, sentinel=True)
    if as_text(info.get("cluster_enabled", "")) != "1":
        return None
    served = _slots_served(client)
    if served == CLUSTER_SLOTS and not listing:  # a Cluster of one primary: a lock's commands
        return None  # work; a listing's reads of keys of several slots do not (CROSSSLOT)
    what = "an unknown part" if served is None else f"{served}"
    return Misfit(
        f"a node of a Redis Cluster that serves {what} of its {CLUSTER_SLOTS} slots",
        MOVED_HINT,
        sentinel=False,
    )


def _slots_served(client: Any) -> int | None:
    """How many slots the Cluster node ``client`` reaches serves as a primary; ``None`` when
    ``CLUSTER NODES`` is refused (an ACL without ``+cluster``) or not understood."""
    try:
        nodes = client.execute_command("CLUSTER NODES")
    except ERRORS:
        return None
    if isinstance(nodes, (bytes, str)):  # unparsed: one line per node
        lines = [line.split() for line in as_text(nodes).splitlines()]
        nodes = {
            words[1]: {"flags": words[2], "slots": [w.split("-") for w in words[8:]]}
            for words in lines
            if len(words) >= 8
        }
    if not isinstance(nodes, dict):
        return None
    for node in nodes.values():
        flags = as_text(node.get("flags", "")).split(",")
        if "myself" in flags:
            if "master" not in flags:
                return 0  # a replica serves no slot: its keys' commands are MOVED
            ranges = [r for r in node.get("slots", []) if not as_text(r[0]).startswith("[")]
            return sum(int(r[-1]) - int(r[0]) + 1 for r in ranges)
    return None


def infos(client: Any) -> list[tuple[str | None, dict[str, Any]]]:
    """``INFO`` of the server (named ``None``), or of every primary of a cluster, each named
    ``host:port``."""
    if isinstance(client, RedisCluster):
        return [
            (f"{node.host}:{node.port}", client.info(target_nodes=node))
            for node in client.get_primaries()
        ]
    return [(None, client.info())]


def _probes(client: Any, prefix: str, timeout: float) -> dict[str, Callable[[], Any]]:
    """One call per command of :data:`ORDER`, on throwaway keys (one hash tag), and one per
    key of :data:`KEY_PROBES`."""
    name = f"{CHECK_NAME}{os.getpid()}:{secrets.token_hex(4)}"
    keys = keys_for(prefix, name)
    string, hash_, list_, zset = keys.lock, keys.newest, keys.rate, keys.waiters
    counters = stats_key(prefix, f"{CHECK_NAME}{os.getpid()}")

    def subscribe() -> None:
        pubsub = pubsub_of(client)
        try:
            pubsub.subscribe(keys.channel)
            pubsub.get_message(timeout=timeout)
        finally:
            pubsub.close()

    def evalsha() -> Any:
        # Redis checks the ACL before it looks the script up: a user refused EVALSHA gets
        # NOPERM naming it, one allowed gets NOSCRIPT when the script is not loaded (SCRIPT
        # LOAD refused too, or flushed since). So one start names both grants, not one a start.
        try:
            return client.evalsha(_scripts.sha1(_scripts.PTTLS), 1, string)
        except redis_py.exceptions.ResponseError as exc:
            if classify(exc) is not Outcome.NOSCRIPT:
                raise
            return None

    sources = [script.source for feature in FEATURES.values() for script in feature.scripts]
    return {
        "PING": client.ping,
        "TIME": client.time,
        "SET": lambda: client.set(string, "check", px=1000),
        "GET": lambda: client.get(string),
        "DUMP": lambda: client.dump(string),
        "MGET": lambda: client.mget([string]),
        "PTTL": lambda: client.pttl(string),
        "PEXPIRE": lambda: client.pexpire(string, 1000),
        "DEL": lambda: client.delete(string),
        "EXISTS": lambda: client.exists(zset),
        "PUBLISH": lambda: client.publish(keys.channel, "0"),
        "SUBSCRIBE": subscribe,
        "HSET": lambda: client.hset(hash_, "check", "1"),
        "HGET": lambda: client.hget(hash_, "check"),
        "HGETALL": lambda: client.hgetall(hash_),
        "HDEL": lambda: client.hdel(hash_, "check"),
        "HINCRBY": lambda: client.hincrby(counters, "check", 0),
        "RPUSH": lambda: client.rpush(list_, "0"),
        "LPUSH": lambda: client.lpush(list_, "0"),
        "LINDEX": lambda: client.lindex(list_, 0),
        "LLEN": lambda: client.llen(list_),
        "LRANGE": lambda: client.lrange(list_, 0, 0),
        "LTRIM": lambda: client.ltrim(list_, 1, 0),  # empties the list: it is deleted
        "ZADD": lambda: client.zadd(zset, {"check": 0}),
        "ZCARD": lambda: client.zcard(zset),
        "ZRANGE": lambda: client.zrange(zset, 0, 0),
        "ZREM": lambda: client.zrem(zset, "check"),
        "ZPOPMIN": lambda: client.zpopmin(zset),
        "SCAN": lambda: client.scan(0, match=lock_pattern(prefix), count=10),
        "SCRIPT|LOAD": lambda: [client.script_load(source) for source in dict.fromkeys(sources)],
        "EVALSHA": evalsha,
        HIGH_WATER: lambda: client.set(f"{prefix}:fence:{{{name}}}", "0", px=1000),
        RING: lambda: client.ltrim(timeline_key(prefix), 0, -1),
        "": lambda: [client.pexpire(k, 1000) for k in (string, hash_, list_, zset, counters)],
    }


def dry_run(client: Any, prefix: str, timeout: float = 1.0) -> dict[str, str]:
    """Send every command of every feature once (:data:`ORDER`), then the key probes
    (:data:`KEY_PROBES`); the refused ones, ``{command or probe: error reply}``.

    A full ``noeviction`` node is reported under the name ``"OOM"``. Errors other than
    refusals propagate (a node that stops answering, an unexpected error reply).
    """
    probes = _probes(client, prefix, timeout)
    refusals: dict[str, str] = {}
    try:
        for name in (*ORDER, *KEY_PROBES):
            try:
                probes[name]()
            except redis_py.exceptions.OutOfMemoryError as exc:
                refusals.setdefault("OOM", _reply(exc))
            except redis_py.exceptions.ResponseError as exc:
                # A Cluster's node (MOVED), a Sentinel (unknown command): no ACL's doing
                if not refused(exc) or refusal_hints(exc)[1]:
                    raise
                if name == "EVALSHA" and "evalsha" not in str(exc).lower():
                    continue  # refused inside the script: that command's own probe names it
                if name in KEY_PROBES and not key_refused(str(exc)):
                    continue  # the command itself: its own probe names it
                refusals[name] = _reply(exc)
    finally:  # also when a command failed otherwise: no throwaway key may stay for good
        with contextlib.suppress(redis_py.RedisError):
            probes[""]()
    return refusals


def _reply(exc: BaseException) -> str:
    """A refusal's message without the script SHA and line Redis appends."""
    return str(exc).partition(" script: ")[0].strip()
