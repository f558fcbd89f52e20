"""The only place where Redis key names are built.

Every key of one lock shares a ``{hash tag}`` so that a script touching several of them runs in
one Redis Cluster slot::

    <prefix>:{<name>}            the lock (slot 1) (string: owner token), TTL = lease
    <prefix>:{<name>}:<i>        slot i = 2..lock_limit of a semaphore, like slot 1
    <prefix>:{<name>}:fence      fencing counter (string: integer), TTL = FENCE_TTL_MS
    <prefix>:fence:{<tag>}       high-water mark of the fencing tokens of every lock in one
                                 Cluster hash slot (string: integer), no TTL; ``<tag>`` is 14
                                 characters '0'/'1' chosen to hash to that slot (16384 at most)
    <prefix>:{<name>}:queued     task id of the queued call (lock_enqueue), TTL = its own
    <prefix>:{<name>}:publishing task id of the queued call while it is being published (string),
                                 TTL = 30 s at most
    <prefix>:{<name>}:newest     newest call published (lock_enqueue='replace', lock_debounce):
                                 hash of id and first (debounce window start, server ms), TTL =
                                 the call's delay + lock_enqueue_ttl
    <prefix>:{<name>}:rate       server times of the last lock_rate starts (list), TTL = period
    <prefix>:{<name>}:rate:next  next slot promised to a call over the rate (string), TTL = until
                                 that slot has passed
    <prefix>:{<name>}:waiters    blocking waiters queued for the lock (sorted set: each waiter's
                                 channel, by arrival), only while some wait; TTL = the holder's
                                 remaining TTL + 5 s
    <prefix>:{<name>}:released   pub/sub channel a release publishes on (not a stored key)
    <prefix>:{<name>}:released:<id>  one queued waiter's channel: a release wakes only the first
                                 waiter of the queue (not a stored key)
    <slot key>:call              per-call overrides the holder of a slot took it with (JSON
                                 string, written only when there are some), TTL = the lock's
    <prefix>:stats:<task name>   event counters of a task (hash), no TTL
    <prefix>:timeline            the last lock events (list of JSON, newest first), only with
                                 redlock_timeline > 0: at most that many, TTL = 1 h after the last

For a task, ``<name>`` is ``<lock_name>:<digest>`` where the digest is a fixed-length hash of the
task's canonical arguments: argument values never appear in a key.

The digest is unsalted by default, so anyone who can read the keys can test guesses of
low-entropy arguments (an account number is found by enumeration in under a second). With a
secret (``redlock_key_secret``) it is a keyed BLAKE2b MAC instead, which cannot be tested
without the secret. The trade-off: the key of a call then depends on the secret, so apps (and
deployments during a rotation) with different secrets compute different keys for the same
call and do not exclude each other.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
from dataclasses import dataclass

#: How long a fencing counter outlives the last acquisition of its lock. After that the next
#: token is still above every token of the name: the high-water mark of its slot
#: (:func:`high_water_of`, no TTL) remembers them, whatever the server's clock did meanwhile.
FENCE_TTL_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class LockKeys:
    """The Redis names belonging to one lock.

    Only the slot keys are stored; the other names are derived from :attr:`lock` when read
    (a lock built per task execution reads two or three of them).
    """

    lock: str
    #: Slot keys: ``(lock,)`` for a lock, ``lock_limit`` keys for a semaphore.
    slots: tuple[str, ...]

    @property
    def fence(self) -> str:
        """The fencing counter (an integer)."""
        return f"{self.lock}:fence"

    @property
    def high_water(self) -> str:
        """The high-water mark of fencing tokens in this lock's Cluster slot (see
        :func:`high_water_of`)."""
        return high_water_of(self.lock)

    @property
    def channel(self) -> str:
        """The pub/sub channel a release publishes on."""
        return f"{self.lock}:released"

    @property
    def waiters(self) -> str:
        """Blocking waiters queued for the lock (a sorted set of their channels)."""
        return f"{self.lock}:waiters"

    @property
    def queued(self) -> str:
        """``lock_enqueue``: the task id of the queued call."""
        return f"{self.lock}:queued"

    @property
    def publishing(self) -> str:
        """``lock_enqueue``: the task id of the queued call while it is being published."""
        return f"{self.lock}:publishing"

    @property
    def newest(self) -> str:
        """``lock_enqueue='replace'`` and ``lock_debounce``: the newest call published."""
        return f"{self.lock}:newest"

    @property
    def rate(self) -> str:
        """``lock_rate``: the start times (a list)."""
        return f"{self.lock}:rate"

    @property
    def rate_next(self) -> str:
        """``lock_rate``: the next promised slot (a string)."""
        return f"{self.lock}:rate:next"


def validate_name(name: str) -> None:
    """Reject names that would break the hash tag (``{`` or ``}``) or are empty. (The readers
    of keys take a name with a control character, which an older version or another program
    may have written; a new lock refuses one: :func:`~celery_redlock._redis.core.LockCore`.)"""
    if not isinstance(name, str) or not name:
        raise ValueError(f"lock name must be a non-empty string, got {name!r}")
    if "{" in name or "}" in name:
        raise ValueError(f"lock name {name!r} must not contain '{{' or '}}'")


def validate_prefix(prefix: str) -> None:
    """Reject a key prefix that is not a non-empty string, or holds ``{``, ``}`` or a control
    character (the rule of the ``redlock_prefix`` setting)."""
    if (
        not isinstance(prefix, str)
        or not prefix
        or "{" in prefix
        or "}" in prefix
        or not prefix.isprintable()
    ):
        raise ValueError(
            "Lock prefix must be a non-empty string without '{', '}' or control characters, "
            f"got {prefix!r}"
        )


def keys_for(prefix: str, name: str, limit: int = 1) -> LockKeys:
    """Return the keys of the lock called ``name`` under ``prefix`` (``limit`` slots)."""
    validate_name(name)
    base = f"{prefix}:{{{name}}}"
    if limit == 1:
        return LockKeys(base, (base,))
    return LockKeys(base, (base, *(f"{base}:{i}" for i in range(2, limit + 1))))


def waiter_channel(keys: LockKeys, waiter: str) -> str:
    """The channel of one queued waiter (``waiter``: a fresh random id per wait)."""
    return f"{keys.channel}:{waiter}"


#: The start of the name the startup check's throwaway keys use (a counter hash among them):
#: never a task's (a task name holds no ``celery-redlock-check:`` prefix of its own, and the
#: readers of the counters leave such keys out).
CHECK_NAME = "celery-redlock-check:"


def stats_key(prefix: str, task_name: str) -> str:
    """The hash of event counters of the task called ``task_name``."""
    return f"{prefix}:stats:{task_name}"


def timeline_key(prefix: str) -> str:
    """The bounded ring of recent lock events that the dashboard draws (opt-in)."""
    return f"{prefix}:timeline"


def secret_key(secret: str | bytes) -> bytes:
    """The BLAKE2b key for ``secret``: its UTF-8 bytes, hashed to 64 bytes when longer."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) > hashlib.blake2b.MAX_KEY_SIZE:
        raw = hashlib.blake2b(raw, person=b"redlock-secret").digest()
    return raw


def digest(canonical: bytes, secret: str | bytes | None = None) -> str:
    """Fixed-length (32 hex characters, 128 bits) digest of a canonical argument encoding;
    keyed (a MAC) with ``secret``.

    Each call copies a BLAKE2b state made once per secret (:data:`_hashers`), keyed already:
    the same digest as a new ``blake2b(canonical, digest_size=16, key=...)``, without parsing
    the keywords and deriving the key on every execution (about 40% of the digest's cost)."""
    hasher = _hashers.get(secret)
    if hasher is None:
        hasher = _hasher(secret)
    hasher = hasher.copy()
    hasher.update(canonical)
    return hasher.hexdigest()


#: :func:`digest`'s BLAKE2b states per secret, nothing hashed yet (at most :data:`HASHERS_MAX`).
_hashers: dict[str | bytes | None, hashlib.blake2b] = {}
HASHERS_MAX = 16


def _hasher(secret: str | bytes | None) -> hashlib.blake2b:
    if secret is None:
        hasher = hashlib.blake2b(digest_size=16)
    else:
        hasher = hashlib.blake2b(digest_size=16, key=secret_key(secret))
    if len(_hashers) < HASHERS_MAX:
        _hashers[secret] = hasher
    return hasher


def task_lock_name(lock_name: str, canonical: bytes, secret: str | bytes | None = None) -> str:
    """The lock name of one task call: its ``lock_name`` and the digest of its arguments."""
    return f"{lock_name}:{digest(canonical, secret)}"


def glob_escape(text: str) -> str:
    """``text`` matched literally in a ``SCAN``/``KEYS`` pattern: ``*?[]\\`` escaped.

    (Unescaped, ``redlock_prefix="red[lock"`` opened a character class and matched no key.)
    """
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lock_pattern(prefix: str, name_prefix: str = "") -> str:
    """A ``SCAN`` pattern matching every key of every lock under ``prefix`` (whose name starts
    with ``name_prefix``), both matched literally.

    It matches slot keys and also fences and queued markers: :func:`is_slot` tells them apart.
    """
    return f"{glob_escape(prefix)}:{{{glob_escape(name_prefix)}*}}*"


def stats_pattern(prefix: str) -> str:
    """A ``SCAN`` pattern matching the counters of every task under ``prefix`` (literally)."""
    return glob_escape(stats_key(prefix, "")) + "*"


def is_slot(key: str | bytes) -> bool:
    """Whether a key matched by :func:`lock_pattern` is a slot (a held lock), not a companion."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "replace")
    tail = key.rpartition("}")[2]
    return tail == "" or (tail.startswith(":") and tail[1:].isdigit())


def fence_of(slot: str) -> str:
    """The fencing counter key of the lock whose slot key is ``slot`` (any slot of it)."""
    return f"{slot[: slot.rindex('}') + 1]}:fence"


def call_key(slot: str) -> str:
    """The record of the per-call overrides the holder of the slot key ``slot`` took it with."""
    return f"{slot}:call"


#: Redis Cluster's number of hash slots, and the characters of a high-water mark's tag.
CLUSTER_SLOTS = 16384
_TAG_WIDTH = 14


def key_slot(key: str) -> int:
    """The Redis Cluster hash slot of ``key``: CRC16 (XMODEM) of its hash tag (the text
    between the first ``{`` and the next ``}``, if not empty), else of the whole key."""
    raw = key.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % CLUSTER_SLOTS


@functools.cache
def _tag_basis() -> tuple[int, dict[int, tuple[int, int]]]:
    """CRC16 with a zero start value is linear over GF(2) for messages of one length, so the
    slot of a tag of '0'/'1' characters is the slot of all-'0' XOR the slots of the flipped
    positions. Returns that base slot and an echelon basis: pivot bit -> (slot bits, flips)."""
    base = binascii.crc_hqx(b"0" * _TAG_WIDTH, 0) % CLUSTER_SLOTS
    pivots: dict[int, tuple[int, int]] = {}
    for i in range(_TAG_WIDTH):
        unit = bytearray(_TAG_WIDTH)
        unit[i] = 1
        bits, flips = binascii.crc_hqx(bytes(unit), 0) % CLUSTER_SLOTS, 1 << i
        for bit in sorted(pivots, reverse=True):
            if bits >> bit & 1:
                bits, flips = bits ^ pivots[bit][0], flips ^ pivots[bit][1]
        if bits:
            pivots[bits.bit_length() - 1] = (bits, flips)
    return base, pivots


def slot_tag(slot: int) -> str:
    """A hash tag of 14 '0'/'1' characters whose Cluster slot is ``slot``: solved, not
    searched (:func:`_tag_basis`), so no table is built."""
    base, pivots = _tag_basis()
    want, flips = (slot % CLUSTER_SLOTS) ^ base, 0
    for bit in sorted(pivots, reverse=True):
        if want >> bit & 1:
            want, flips = want ^ pivots[bit][0], flips ^ pivots[bit][1]
    return "".join("1" if flips >> i & 1 else "0" for i in range(_TAG_WIDTH))


def high_water_of(lock: str) -> str:
    """The high-water mark of the fencing tokens handed out in the Cluster slot of the lock
    key ``lock``: ``<prefix>:fence:{<tag>}``, in the same slot, so a script touching both
    stays single-slot. One key per slot used: at most 16384 per deployment, whatever the
    number of names, and none for a deployment that never hands out a token."""
    prefix = lock[: lock.rindex("{") - 1]
    return f"{prefix}:fence:{{{slot_tag(key_slot(lock))}}}"
