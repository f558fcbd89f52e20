"""The history of a fault run, and the checker that judges it (pure: no I/O).

A run records one :class:`Event` per step of every call, all stamped with the wall clock of
this one machine (workers in network namespaces share its kernel clock; the Redis servers'
clocks are the ones a fault steps, never this one):

=============  ===================================================================
``submitted``  the harness published the call
``admitted``   the task acquired its lock; ``token`` is its fencing token
``body_start`` its body began; ``body_end``: it ended (normally or not)
``write``      a write through the token to the fenced store; ``accepted`` says how it went
``released``   the lock was released; ``lost``: the task saw its lock lost
``final``      the call's end state (``state``), read from the result backend
=============  ===================================================================

The store keeps its own log of every write, in the order it applied them
(:class:`StoreWrite`, see :mod:`chaos.fenced_store`).

:func:`check` then judges:

1. **overlaps**: two holders of one key whose bodies overlap in time. An overlap that lies
   inside a fault window whose fault is a documented limit (:class:`Window` with ``limit``)
   is *explained* and counted under that limit; any other is a violation;
2. **stale writes**: the store accepted a write whose token was lower than a token it had
   accepted before for that key (a violation; an equal token is the same holder writing
   again); rejected writes are counted;
3. **token order**: of two holders of a key, the one whose body ended before the other was
   admitted has the smaller token (a violation otherwise, also when either has none);
4. **lost calls**: a submitted call with no final state, or one outside :data:`FINAL_STATES`;
5. **leftover keys**: lock keys present after the run (given by the harness).

A call admitted without a token (``admitted`` with ``token`` None) and without a write is no
holder: its lock was lost before its body read the token (``Lock.fencing_token`` is ``None``
once the lock is lost) and the body stopped before its first write. Timeline, on a quorum
behind a slow link: (1) the acquire's replies come back late, just inside the lock's validity
time, and the task is admitted; (2) the lease runs out by the worker's clock before the body
starts; (3) the body reads no token and stops; (4) the key expires and the next holder is
admitted. Such calls are counted (:attr:`Verdict.admitted_lost`), not judged as holders.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The documented end states of a call: it ran (``SUCCESS``), its lock was lost and the body
#: stopped (``LOST``), it was skipped because the key was held (``SKIPPED``), or the lock Redis
#: did not answer and ``redlock_on_unavailable`` refused it (``UNAVAILABLE``).
FINAL_STATES = frozenset({"SUCCESS", "LOST", "SKIPPED", "UNAVAILABLE"})


@dataclass(frozen=True)
class Event:
    """One step of one call (see the module docstring for the kinds)."""

    at: float
    call: str
    kind: str
    key: str = ""
    token: int | None = None
    accepted: bool | None = None
    state: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(
            at=float(data["at"]),
            call=str(data["call"]),
            kind=str(data["kind"]),
            key=str(data.get("key", "")),
            token=None if data.get("token") is None else int(data["token"]),
            accepted=data.get("accepted"),
            state=data.get("state"),
        )


@dataclass(frozen=True)
class StoreWrite:
    """A write as the store applied it: in its own order (``seq``), with its verdict."""

    seq: int
    key: str
    token: int
    accepted: bool


@dataclass(frozen=True)
class Window:
    """A fault from ``start`` to ``end``. ``limit``: the documented limit it exercises (an
    overlap inside it is explained), or ``None``: no overlap is allowed during it."""

    fault: str
    start: float
    end: float
    limit: str | None = None


@dataclass
class Holding:
    """One admitted holder of a key: when it was admitted and when its body ended."""

    call: str
    key: str
    token: int | None
    admitted: float
    ended: float


@dataclass
class Verdict:
    """What :func:`check` found; :attr:`ok` is False on any violation."""

    overlaps_explained: dict[str, int] = field(default_factory=dict)
    #: Per limit, the longest explained overlap, in seconds (the measured window).
    overlap_max_s: dict[str, float] = field(default_factory=dict)
    overlaps_unexplained: list[tuple[str, str, str]] = field(default_factory=list)
    stale_accepted: list[StoreWrite] = field(default_factory=list)
    rejected: int = 0
    accepted: int = 0
    token_inversions: list[tuple[str, str, str]] = field(default_factory=list)
    lost_calls: list[str] = field(default_factory=list)
    leftover_keys: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    #: Calls admitted with their lock already lost (no token, no write): no holders.
    admitted_lost: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.overlaps_unexplained
            or self.stale_accepted
            or self.token_inversions
            or self.lost_calls
            or self.leftover_keys
        )

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "overlaps_explained": dict(self.overlaps_explained),
            "overlap_max_s": dict(self.overlap_max_s),
            "overlaps_unexplained": len(self.overlaps_unexplained),
            "stale_writes_accepted": len(self.stale_accepted),
            "stale_writes_rejected": self.rejected,
            "writes_accepted": self.accepted,
            "token_inversions": len(self.token_inversions),
            "lost_calls": len(self.lost_calls),
            "leftover_keys": len(self.leftover_keys),
            "admitted_lost": self.admitted_lost,
            "states": dict(self.states),
        }


def holdings(events: Iterable[Event]) -> list[Holding]:
    """Every admitted holder, from its ``admitted`` event to its ``body_end`` (or, for a body
    that never recorded its end, the last event of the call: the last moment we know of)."""
    found: dict[str, Holding] = {}
    body_end: dict[str, float] = {}
    last_seen: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.at):
        last_seen[event.call] = event.at
        if event.kind == "admitted":
            found[event.call] = Holding(event.call, event.key, event.token, event.at, event.at)
        elif event.kind == "body_end":
            body_end[event.call] = event.at
    for call, hold in found.items():
        hold.ended = body_end.get(call, last_seen[call])
    return sorted(found.values(), key=lambda h: h.admitted)


def _explained(a: Holding, b: Holding, windows: Sequence[Window]) -> str | None:
    """The limit of a fault window that covers the overlap of ``a`` and ``b``, if any."""
    start, end = max(a.admitted, b.admitted), min(a.ended, b.ended)
    for w in windows:
        if w.limit is not None and w.start <= end and start <= w.end:
            return w.limit
    return None


def check(
    events: Iterable[Event],
    writes: Iterable[StoreWrite],
    windows: Sequence[Window] = (),
    leftover_keys: Sequence[str] = (),
) -> Verdict:
    """Judge a run (see the module docstring)."""
    events = list(events)
    verdict = Verdict(leftover_keys=list(leftover_keys))
    by_key: dict[str, list[Holding]] = defaultdict(list)
    wrote = {e.call for e in events if e.kind == "write"}
    for hold in holdings(events):
        if hold.token is None and hold.call not in wrote:
            verdict.admitted_lost += 1
        else:
            by_key[hold.key].append(hold)
    for key, holds in by_key.items():
        for a, b in itertools.combinations(holds, 2):
            if a.admitted < b.ended and b.admitted < a.ended:
                limit = _explained(a, b, windows)
                if limit is None:
                    verdict.overlaps_unexplained.append((key, a.call, b.call))
                else:
                    verdict.overlaps_explained[limit] = verdict.overlaps_explained.get(limit, 0) + 1
                    lasted = min(a.ended, b.ended) - max(a.admitted, b.admitted)
                    verdict.overlap_max_s[limit] = max(verdict.overlap_max_s.get(limit, 0), lasted)
            first, second = (a, b) if a.ended <= b.admitted else (b, a)
            if first.ended <= second.admitted and (
                first.token is None or second.token is None or first.token >= second.token
            ):
                verdict.token_inversions.append((key, first.call, second.call))
    best: dict[str, int] = {}
    for w in sorted(writes, key=lambda w: w.seq):
        if not w.accepted:
            verdict.rejected += 1
            continue
        verdict.accepted += 1
        if w.key in best and w.token < best[w.key]:
            verdict.stale_accepted.append(w)
        best[w.key] = max(best.get(w.key, w.token), w.token)
    submitted = {e.call for e in events if e.kind == "submitted"}
    finals = {e.call: e.state or "" for e in events if e.kind == "final"}
    for call in sorted(submitted):
        state = finals.get(call)
        verdict.states[state or "none"] = verdict.states.get(state or "none", 0) + 1
        if state not in FINAL_STATES:
            verdict.lost_calls.append(call)
    return verdict


def takeover_times(events: Iterable[Event], windows: Sequence[Window]) -> list[float]:
    """For each fault window, per key held when it started, the seconds from the window's
    start to the next admission of that key by another call."""
    holds = holdings(events)
    out = []
    for w in windows:
        for hold in holds:
            if hold.admitted <= w.start < hold.ended:
                later = [
                    h.admitted
                    for h in holds
                    if h.key == hold.key and h.call != hold.call and h.admitted > w.start
                ]
                if later:
                    out.append(min(later) - w.start)
    return out
