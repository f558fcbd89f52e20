"""The history of a fault run, and the checker that judges it (pure: no I/O).

A run records one :class:`Event` per step of every call, all stamped with the wall clock of
this one machine (workers in network namespaces share its kernel clock; the Redis servers'
clocks are the ones a fault steps, never this one):

=============  ===================================================================
``submitted``  the harness published the call
``admitted``   the task acquired its lock; ``token`` is its fencing token, ``since`` when
               the worker began to run it (before its acquire was sent), if recorded
``body_start`` its body began; ``body_end``: it ended (normally or not)
``write``      a write through the token to the fenced store; ``accepted`` says how it went
``released``   the lock was released; ``lost``: the task saw its lock lost
``final``      the call's end state (``state``), read from the result backend after the
               run (stamped then: it says nothing of when the body ran)
=============  ===================================================================

Any other kind is an error of the recorder: :class:`Event` refuses it (a typo such as
``admited`` would otherwise drop a holder silently).

The store keeps its own log of every write, in the order it applied them, with its writer
(:class:`StoreWrite`, see :mod:`chaos.fenced_store`).

A **holding** is one admission: from an ``admitted`` event to the next ``body_end`` of the
same execution. Each execution stamps its events with its own ``run`` id, so a call admitted
twice (a redelivery, a retry) holds twice, and two admissions of one call running at once are
two holdings that overlap (a ``write`` without a ``run`` belongs to no admission: a write
outside one). A body that never recorded its end holds until its last event that proves it
ran (``admitted``, ``body_start``, ``write``, ``lost``), never until its ``released`` or
``final``. A holding
is half-open, ``[admitted, ended)``: a holder admitted at the instant another ended follows
it. It always holds its admission instant, though, so two admissions of one key at one
instant overlap even if one body took no time.

:func:`check` then judges:

1. **overlaps**: two holdings of one key that overlap in time. An overlap that *begins*
   inside a fault window (``start <= begin <= end``) whose fault is a documented limit
   (:class:`Window` with ``limit``) is *explained* and counted under that limit; it may last
   beyond the window (the stale holder runs on until its body ends), and the harness already
   ends each window a lease after the heal. An overlap that began before the window cannot
   have been caused by the fault, nor, for a limit whose stale holder held the lock before
   the fault (:attr:`Window.stale_before`), one between two holders both admitted after the
   fault was injected (a lock that deletes another's key would pass as the fault's doing),
   nor, for a fault on processes (:attr:`Window.holders`: the pids a pause stopped), one
   neither of whose holders ran in such a process, admitted before the fault (any key, any
   worker: the pause did not make it stale); any other is a violation;
2. **stale writes**: the store accepted a write whose token was lower than a token it had
   accepted before for that key (a violation). A rejected write is counted if a larger token
   was accepted before it; a rejection of a write whose token is at least every token
   accepted so far is a *wrong rejection* (the fence refused the newest holder: a violation).
   A fence knows only the tokens written to it, so it cannot refuse a stale write made
   before the newer holder's first write. Timeline: (1) A is admitted with token 10 and
   paused; (2) its lease runs out and B is admitted with 11; (3) A resumes and writes, and
   the store, whose largest token is 10, accepts it; (4) B writes with 11. Such a write (one
   the store accepted, by its own clock, after a holder admitted later than its writer, with
   a larger token, had recorded its admission) is counted
   (:attr:`Verdict.stale_before_newer`), not judged: it is the limit of fencing, and its
   writer, holding until that write, overlaps the newer holder, which check 1 judges;
3. **token order**: of two holdings of a key that do not overlap, the earlier one has the
   smaller token (a violation otherwise, also when either has none, unless the later one was
   admitted inside the window of a limit that loses the token state: counted under it); of
   two that overlap,
   the one admitted later has the larger token (else the fence would refuse the newer holder
   and let the older one write): a violation, or, inside the window of a documented limit,
   counted under that limit (:attr:`Verdict.inversions_explained`). A limit that loses the
   token state (:attr:`Window.tokens_go_back`: a server restarted empty, quorum nodes
   rejoining early, a failover) explains any such inversion. Any other explains only an
   order the records cannot tell: the newer holder's acquire began (``since``) before the
   older one was admitted, so its admission may have been recorded late (a holder paused
   between its acquire and its record). Timeline: (1) A's acquire is granted with token 6;
   (2) A is paused before it records its admission; (3) its lease runs out and B is
   admitted with 9; (4) A resumes and records its admission after B's. There, a newer
   holder whose acquire began after the older was admitted got its token later, and a
   smaller one is a violation;
4. **shared tokens**: two holdings of a key with one token, or two writers accepted with one
   token. Tokens are unique per acquisition (``docs/guide.md``, "Fencing tokens": they
   strictly increase), and the fence lets an equal token through, so a shared token would
   let a stale writer's writes in (a violation; counted under the limit when the later
   holding was admitted inside the window of a limit that loses the token state);
5. **writes outside an admission**: a ``write`` of a call that held no admission then, or a
   store write whose writer was never admitted for that key (a violation: nothing judged it);
   and **mistokened writes**: a store write whose token is none its writer was admitted with
   for that key (a violation: a body writes through its own token; this also catches a call
   admitted without a token that wrote after all); and **misreported writes**: a ``write``
   whose outcome (``accepted``) the store's log does not show for that key, writer and
   token, as often as it was recorded (a violation: the body was told a write was accepted
   that never committed, or refused when the store applied it). A store write with no
   ``write`` event is no violation: a worker killed between the two records it no further;
6. **lost calls**: a submitted call with no final state, or any call whose final state is
   outside :data:`FINAL_STATES` (of two ``final`` events, the later one counts); and
   **unsubmitted calls**: a call admitted, writing or ended that the harness never submitted
   (a violation: a run whose records lost their start would hide its calls from the rest);
7. **leftover keys**: lock keys present after the run (given by the harness);
8. **an empty history**: no call submitted at all proves nothing (:attr:`Verdict.empty`:
   the verdict is not ok, so the harness reports the phase failed and runs the next one);
   nor does a run in which no holder had a token or no write was accepted
   (:attr:`Verdict.untested`: every call unavailable or skipped, records lost, or workers
   pointed at the wrong lock server).

A call admitted without a token (``admitted`` with ``token`` None) is no holder if its body
stopped at once, without a write: its lock was lost before its body read the token
(``Lock.fencing_token`` is ``None`` once the lock is lost). Timeline, on a quorum behind a
slow link: (1) the acquire's replies come back late, just inside the lock's validity time, and
the task is admitted; (2) the lease runs out by the worker's clock before the body starts;
(3) the body reads no token and stops; (4) the key expires and the next holder is admitted.
Such calls are counted (:attr:`Verdict.admitted_lost`), not judged as holders, when the
records show the stop: its ``lost`` before any write, then its ``body_end``. A tokenless body
that did not say so may have acted beside the next holder, unfenced (its records say nothing
of what it did): it is judged as a holder (an overlap, a token inversion against each holder
of its key). The test is the records' order, not their times: a pause or a stalled machine
between the ``lost`` and the ``body_end`` is no act.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The documented end states of a call: it ran (``SUCCESS``), its lock was lost and the body
#: stopped (``LOST``), it was skipped because the key was held (``SKIPPED``), or the lock Redis
#: did not answer and ``redlock_on_unavailable`` refused it (``UNAVAILABLE``).
FINAL_STATES = frozenset({"SUCCESS", "LOST", "SKIPPED", "UNAVAILABLE"})

#: Every kind of event (see the module docstring).
KINDS = frozenset(
    {"submitted", "admitted", "body_start", "body_end", "write", "released", "lost", "final"}
)
#: The kinds a body records while it runs: each proves that it ran at that moment.
BODY_KINDS = frozenset({"admitted", "body_start", "write", "lost", "body_end"})


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
    #: The execution that recorded a body event (an id of its own per admission).
    run: str = ""
    #: On ``admitted``: when the worker began to run the call, before its acquire was sent.
    since: float | None = None
    #: The process that recorded a body event (a pool child), if recorded.
    pid: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown event kind {self.kind!r} (call {self.call!r});"
                f" the kinds are {', '.join(sorted(KINDS))}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """An event as the recorder wrote it. :class:`ValueError` naming the field for a
        record the checker would misjudge: a missing field, a time that is no finite number
        (a NaN breaks the sort: an overlap read as an inversion), a token or pid that is no
        whole number (``1.9`` was cut to 1), and a body event without its run id (two
        admissions of one call at once were one holding, and passed)."""
        missing = [name for name in ("at", "call", "kind") if name not in data]
        if missing:
            raise ValueError(f"event {data!r} lacks {', '.join(missing)}")
        kind, call = str(data["kind"]), str(data["call"])
        where = f"event {kind} of call {call!r}"
        return cls(
            at=_time(data["at"], f"{where}: at"),
            call=call,
            kind=kind,
            key=str(data.get("key", "")),
            token=_token(data.get("token"), where),
            accepted=_accepted(data.get("accepted"), kind, where),
            state=data.get("state"),
            run=_run(data.get("run"), kind, where),
            since=None if data.get("since") is None else _time(data["since"], f"{where}: since"),
            pid=_whole(data.get("pid"), f"{where}: pid"),
        )


def _time(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what}={value!r} is no finite number of seconds")
    return float(value)


def _token(value: Any, where: str) -> int | None:
    return _whole(value, f"{where}: token")


def _whole(value: Any, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{what}={value!r} is no whole number")
    return value


def _accepted(value: Any, kind: str, where: str) -> bool | None:
    if (kind == "write" or value is not None) and not isinstance(value, bool):
        raise ValueError(f"{where}: accepted={value!r} is neither true nor false")
    return value


def _run(value: Any, kind: str, where: str) -> str:
    if value in (None, "") and kind in BODY_KINDS - {"write"}:  # a write may be outside one
        raise ValueError(f"{where}: a body event needs the run id of its execution")
    return "" if value is None else str(value)


@dataclass(frozen=True)
class StoreWrite:
    """A write as the store applied it: in its own order (``seq``), with its verdict, the
    call that made it (``writer``) and when it applied it (``at``, by this machine's clock, as
    the events; ``None``: not logged)."""

    seq: int
    key: str
    token: int
    accepted: bool
    writer: str
    at: float | None = None


@dataclass(frozen=True)
class Window:
    """A fault from ``start`` to ``end``. ``limit``: the documented limit it exercises (an
    overlap that begins inside it, and that the fault can have caused, is explained), or
    ``None``: it explains no overlap."""

    fault: str
    start: float
    end: float
    limit: str | None = None
    #: The limit loses the tokens' state, so a later acquisition may get a smaller token
    #: (docs/guide.md, "Fencing tokens").
    tokens_go_back: bool = False
    #: For a limit whose stale holder held the lock before the fault (a paused holder, a
    #: clock step, a server restarted empty): when the fault's injection ended. An overlap
    #: is explained only if one of its holders was admitted before then; two holders both
    #: admitted after it have no such excuse. ``None``: any two (a failover's two primaries,
    #: quorum nodes rejoining one after the other).
    stale_before: float | None = None
    #: The processes (pids) the fault made stale holders of, if it acts on processes: an
    #: overlap is explained only if one of its holders ran in one of them, admitted before the
    #: fault (:func:`_began`: a pause landing between a child's acquire and its ``admitted``
    #: record makes that record the later one). A paused holder
    #: delays no other process's lock: (1) w1's child A holds k1 and is paused; (2) w2's B
    #: holds k2 and writes on; (3) C is admitted on k2 while B runs (a lock that let it in).
    #: The pause did not make B stale: C and B overlap unexplained. ``None``: any holder, as
    #: for a fault on a lock server (a clock step, a restart empty, a failover: every lease
    #: it holds, of every key and worker, may end early) or on a link (a slow or lossy link
    #: delays whichever holder's renewals cross it).
    holders: frozenset[int] | None = None


@dataclass
class Holding:
    """One admission of a call: when it was admitted, when its body ended (or last showed it
    ran), and how many writes it made."""

    call: str
    key: str
    token: int | None
    admitted: float
    ended: float
    writes: int = 0
    #: When the worker began to run the call (before its acquire), if recorded.
    since: float | None = None
    #: The process that ran it, if recorded.
    pid: int | None = None
    #: Its body recorded its end (``body_end``).
    closed: bool = False
    #: Its body recorded ``lost`` before any write: it said it stops without acting.
    stopped: bool = False


@dataclass
class Verdict:
    """What :func:`check` found; :attr:`ok` is False on any violation."""

    overlaps_explained: dict[str, int] = field(default_factory=dict)
    #: Per limit, the longest explained overlap, in seconds (the measured window).
    overlap_max_s: dict[str, float] = field(default_factory=dict)
    overlaps_unexplained: list[tuple[str, str, str]] = field(default_factory=list)
    stale_accepted: list[StoreWrite] = field(default_factory=list)
    #: Writes the store accepted after a holder with a larger token had been admitted, before
    #: that holder's first write: the fence cannot refuse them (counted, not a violation).
    stale_before_newer: list[StoreWrite] = field(default_factory=list)
    #: Stale writes the store rejected (a larger token had been accepted before).
    rejected: int = 0
    accepted: int = 0
    #: Writes the store rejected although no larger token had been accepted before them.
    wrong_rejections: list[StoreWrite] = field(default_factory=list)
    token_inversions: list[tuple[str, str, str]] = field(default_factory=list)
    #: ``(key, call, call)``: two holdings, or two accepted writers, with one token.
    shared_tokens: list[tuple[str, str, str]] = field(default_factory=list)
    #: ``(key, call)``: a write by a call outside its admissions, or never admitted.
    unadmitted_writes: list[tuple[str, str]] = field(default_factory=list)
    #: Store writes with a token none of their writer's admissions of that key had.
    mistokened_writes: list[StoreWrite] = field(default_factory=list)
    #: ``write`` events whose outcome the store's log does not show.
    misreported_writes: list[Event] = field(default_factory=list)
    lost_calls: list[str] = field(default_factory=list)
    #: Calls with events but no ``submitted`` one.
    unsubmitted_calls: list[str] = field(default_factory=list)
    leftover_keys: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    #: Calls admitted with their lock already lost (no token; ``lost``, then the body's end,
    #: and no write): no holders.
    admitted_lost: int = 0
    #: No call was submitted: the history proves nothing (a run that lost its records).
    empty: bool = False
    #: Calls were submitted, but no holder had a token or the store accepted no write.
    untested: bool = False
    #: Per limit, inversions (and repeated tokens) its window explains: between overlapping
    #: holders that began inside it, and, for a limit that loses the token state, of a later
    #: holder admitted inside it.
    inversions_explained: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.overlaps_unexplained
            or self.stale_accepted
            or self.wrong_rejections
            or self.token_inversions
            or self.shared_tokens
            or self.unadmitted_writes
            or self.mistokened_writes
            or self.misreported_writes
            or self.lost_calls
            or self.unsubmitted_calls
            or self.leftover_keys
            or self.empty
            or self.untested
        )

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "overlaps_explained": dict(self.overlaps_explained),
            "overlap_max_s": dict(self.overlap_max_s),
            "overlaps_unexplained": len(self.overlaps_unexplained),
            "stale_writes_accepted": len(self.stale_accepted),
            "stale_writes_before_newer": len(self.stale_before_newer),
            "stale_writes_rejected": self.rejected,
            "writes_accepted": self.accepted,
            "wrong_rejections": len(self.wrong_rejections),
            "token_inversions": len(self.token_inversions),
            "shared_tokens": len(self.shared_tokens),
            "unadmitted_writes": len(self.unadmitted_writes),
            "mistokened_writes": len(self.mistokened_writes),
            "misreported_writes": len(self.misreported_writes),
            "lost_calls": len(self.lost_calls),
            "unsubmitted_calls": len(self.unsubmitted_calls),
            "leftover_keys": len(self.leftover_keys),
            "admitted_lost": self.admitted_lost,
            "empty": self.empty,
            "untested": self.untested,
            "inversions_explained": dict(self.inversions_explained),
            "states": dict(self.states),
        }

    def details(self, most: int = 10) -> dict[str, list[Any]]:
        """The first ``most`` of each kind of violation found, for a report: the count alone
        does not say which write, key or call to look for."""
        found = {
            "overlaps": self.overlaps_unexplained,
            "stale_writes_accepted": self.stale_accepted,
            "wrong_rejections": self.wrong_rejections,
            "inversions": self.token_inversions,
            "shared_tokens": self.shared_tokens,
            "unadmitted_writes": self.unadmitted_writes,
            "mistokened_writes": self.mistokened_writes,
            "misreported_writes": self.misreported_writes,
            "lost": self.lost_calls,
            "unsubmitted": self.unsubmitted_calls,
            "leftover": self.leftover_keys,
        }
        return {kind: [_shown(v) for v in items[:most]] for kind, items in found.items() if items}


def _shown(value: Any) -> Any:
    """A violation as JSON can show it: a write or an event as its fields."""
    if isinstance(value, (StoreWrite, Event)):
        return {k: v for k, v in vars(value).items() if v not in (None, "")}
    return value


def holdings(events: Iterable[Event]) -> list[Holding]:
    """Every admission (see the module docstring), in the order of admission."""
    return _unfold(events)[0]


def _unfold(events: Iterable[Event]) -> tuple[list[Holding], list[Event]]:
    """The holdings, and the ``write`` events made outside any admission of their call."""
    found: list[Holding] = []
    unheld: list[Event] = []
    open_: dict[tuple[str, str], Holding] = {}
    # Stable: events of one instant keep the order they were recorded in.
    for event in sorted(events, key=lambda e: e.at):
        if event.kind not in BODY_KINDS:
            continue  # submitted, released, final: nothing about when the body ran
        if event.kind == "admitted":
            # A second admission is a holding of its own; the one before, if it recorded no
            # end, ends at its last body event.
            hold = Holding(
                event.call,
                event.key,
                event.token,
                event.at,
                event.at,
                since=event.since,
                pid=event.pid,
            )
            open_[(event.call, event.run)] = hold
            found.append(hold)
            continue
        current = open_.get((event.call, event.run))
        if current is None:
            if event.kind == "write":
                unheld.append(event)
            continue
        current.ended = event.at
        if event.kind == "write":
            current.writes += 1
        elif event.kind == "lost" and not current.writes:
            current.stopped = True
        elif event.kind == "body_end":
            current.closed = True
            del open_[(event.call, event.run)]
    return sorted(found, key=lambda h: h.admitted), unheld


def _stopped_unheld(hold: Holding) -> bool:
    """Whether ``hold`` was admitted with its lock already lost and its body stopped at once
    (see the module docstring)."""
    return hold.token is None and not hold.writes and hold.stopped and hold.closed


def _overlap(a: Holding, b: Holding) -> bool:
    """Whether two holdings overlap: half-open intervals, each holding its admission instant."""
    return a.admitted == b.admitted or (a.admitted < b.ended and b.admitted < a.ended)


def _explained(a: Holding, b: Holding, windows: Sequence[Window]) -> Window | None:
    """The fault window of a limit in which the overlap of ``a`` and ``b`` began, if any, and
    which can have caused it (:attr:`Window.stale_before`, :attr:`Window.holders`)."""
    begin = max(a.admitted, b.admitted)
    for w in windows:
        if w.limit is None or not w.start <= begin <= w.end:
            continue
        # A fault on processes made only its own holders stale, those whose acquire may
        # have been granted before it (_began).
        stale = (a, b) if w.holders is None else tuple(h for h in (a, b) if h.pid in w.holders)
        if any(w.stale_before is None or _began(h) < w.stale_before for h in stale):
            return w
    return None


def _began(hold: Holding) -> float:
    """When ``hold``'s acquire may have been granted at the earliest. Its admission may be
    recorded after the fault although its acquire ran before it (a busy worker): its task's
    start (``since``) says when it could be. The records cannot tell that holder from one
    whose acquire merely began before the fault and was granted after it, so such a pair is
    explained too: a limit of the check, which ``since`` narrows to the time its acquire was
    under way."""
    return hold.admitted if hold.since is None else min(hold.since, hold.admitted)


def _ordered(older: Holding, newer: Holding) -> bool:
    """Whether ``newer``'s acquire began after ``older`` was admitted (so it was granted
    later, whatever the order of their records)."""
    return newer.since is not None and newer.since >= older.admitted


def _tokens_lost(hold: Holding, windows: Sequence[Window]) -> Window | None:
    """The window of a limit that loses the tokens' state in which ``hold`` was admitted."""
    for w in windows:
        if w.limit is not None and w.tokens_go_back and w.start <= hold.admitted <= w.end:
            return w
    return None


def _newer_holders(holds: Sequence[Holding]) -> Callable[[StoreWrite, Holding | None], bool]:
    """Whether a holder admitted after ``writer`` with a larger token recorded its admission
    before the store applied the write ``w`` (``False`` when either time is unknown)."""
    by_key: dict[str, list[Holding]] = defaultdict(list)
    for hold in holds:  # in the order of admission
        by_key[hold.key].append(hold)
    starts = {key: [h.admitted for h in held] for key, held in by_key.items()}

    def newer(w: StoreWrite, writer: Holding | None) -> bool:
        if w.at is None or writer is None:
            return False
        held, at = by_key[w.key], starts[w.key]
        after = bisect.bisect_right(at, writer.admitted)
        until = bisect.bisect_right(at, w.at)
        return any(h.token is not None and h.token > w.token for h in held[after:until])

    return newer


def _explain_inversion(verdict: Verdict, window: Window) -> None:
    limit = str(window.limit)
    verdict.inversions_explained[limit] = verdict.inversions_explained.get(limit, 0) + 1


def _share(
    verdict: Verdict, seen: set[tuple[str, frozenset[str]]], key: str, a: str, b: str
) -> None:
    """Report that ``a`` and ``b`` shared a token on ``key``, once per pair (``seen``)."""
    if (key, frozenset((a, b))) not in seen:
        seen.add((key, frozenset((a, b))))
        verdict.shared_tokens.append((key, a, b))


def _judged_pairs(held: Sequence[Holding]) -> list[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, of one key's holdings (in the order of admission) that
    a check can find at fault, in that order: those that overlap, that share a token, where
    either has no token, or where the one that ended first has the larger token. Any other
    pair is two holders one after the other with increasing tokens, which no check faults.
    Judging every pair made the check quadratic; judging these, a clean history's check
    grows as n log n, a faulty one's with what it finds (98,000 events of 14,000 calls one
    after the other: 6.5 s before, 0.3 s after, on a 2-core VM)."""
    pairs: set[tuple[int, int]] = set()
    # Overlaps: a sweep in the order of admission, each holding against those admitted
    # before it ended (or at its own admission instant).
    for i, a in enumerate(held):
        for j in range(i + 1, len(held)):
            if held[j].admitted != a.admitted and held[j].admitted >= a.ended:
                break
            pairs.add((i, j))
    same: dict[int, list[int]] = defaultdict(list)
    for i, hold in enumerate(held):
        if hold.token is None:
            pairs.update((min(i, j), max(i, j)) for j in range(len(held)) if j != i)
        else:
            same[hold.token].append(i)
    for group in same.values():
        pairs.update(itertools.combinations(group, 2))
    # Inversions one after the other: each holding against those that ended by its admission
    # with a larger token (kept sorted by token as they end).
    by_end = sorted(range(len(held)), key=lambda i: held[i].ended)
    ended_tokens: list[int] = []
    ended_ids: list[int] = []
    done = 0
    for j, hold in enumerate(held):
        while done < len(by_end) and held[by_end[done]].ended <= hold.admitted:
            token = held[by_end[done]].token
            if token is not None:
                at = bisect.bisect_right(ended_tokens, token)
                ended_tokens.insert(at, token)
                ended_ids.insert(at, by_end[done])
            done += 1
        if hold.token is not None:
            larger = ended_ids[bisect.bisect_right(ended_tokens, hold.token) :]
            pairs.update((min(i, j), max(i, j)) for i in larger if i != j)
    return sorted(pairs)


def check(
    events: Iterable[Event],
    writes: Iterable[StoreWrite],
    windows: Sequence[Window] = (),
    leftover_keys: Sequence[str] = (),
) -> Verdict:
    """Judge a run (see the module docstring)."""
    events = list(events)
    submitted = {e.call for e in events if e.kind == "submitted"}
    verdict = Verdict(leftover_keys=list(leftover_keys), empty=not submitted)
    holds, unheld = _unfold(events)
    # Sets beside the verdict's lists, which keep the order found: a list's membership test
    # made a history with many faulty writes quadratic.
    shared: set[tuple[str, frozenset[str]]] = set()
    unadmitted: set[tuple[str, str]] = set()
    by_key: dict[str, list[Holding]] = defaultdict(list)
    for hold in holds:
        if _stopped_unheld(hold):
            verdict.admitted_lost += 1
        else:
            by_key[hold.key].append(hold)
    for key, held in by_key.items():
        for i, j in _judged_pairs(held):
            a, b = held[i], held[j]
            if a.token is not None and a.token == b.token:
                lost_state = _tokens_lost(max(a, b, key=lambda h: h.admitted), windows)
                if lost_state is None:
                    _share(verdict, shared, key, a.call, b.call)
                else:
                    _explain_inversion(verdict, lost_state)
            if _overlap(a, b):
                window = _explained(a, b, windows)
                limit = None if window is None else window.limit
                if limit is None:
                    verdict.overlaps_unexplained.append((key, a.call, b.call))
                else:
                    verdict.overlaps_explained[limit] = verdict.overlaps_explained.get(limit, 0) + 1
                    lasted = min(a.ended, b.ended) - max(a.admitted, b.admitted)
                    verdict.overlap_max_s[limit] = max(verdict.overlap_max_s.get(limit, 0), lasted)
                older, newer = (a, b) if a.admitted <= b.admitted else (b, a)
                if (
                    older.token is not None
                    and newer.token is not None
                    and older.token > newer.token
                ):
                    if (
                        window is None
                        or limit is None
                        or (_ordered(older, newer) and not window.tokens_go_back)
                    ):
                        verdict.token_inversions.append((key, older.call, newer.call))
                    else:
                        _explain_inversion(verdict, window)
                continue
            first, second = (a, b) if a.ended <= b.admitted else (b, a)
            if first.token is None or second.token is None:
                verdict.token_inversions.append((key, first.call, second.call))
            elif first.token > second.token:
                lost_state = _tokens_lost(second, windows)
                if lost_state is None:
                    verdict.token_inversions.append((key, first.call, second.call))
                else:
                    _explain_inversion(verdict, lost_state)
    admitted = {(h.key, h.call) for h in holds}
    tokens: dict[tuple[str, str], set[int | None]] = defaultdict(set)
    admission: dict[tuple[str, str, int | None], Holding] = {}
    for hold in holds:
        tokens[(hold.key, hold.call)].add(hold.token)
        admission[(hold.key, hold.call, hold.token)] = hold
    for event in unheld:
        if (event.key, event.call) not in unadmitted:
            unadmitted.add((event.key, event.call))
            verdict.unadmitted_writes.append((event.key, event.call))
    writes = sorted(writes, key=lambda w: w.seq)
    logged = Counter((w.key, w.writer, w.token, w.accepted) for w in writes)
    for event in sorted(events, key=lambda e: e.at):
        if event.kind == "write" and event.accepted is not None:
            told = (event.key, event.call, event.token, event.accepted)
            if logged[told]:
                logged[told] -= 1
            else:
                verdict.misreported_writes.append(event)
    best: dict[str, StoreWrite] = {}
    newer_admitted = _newer_holders(holds)
    for w in writes:
        if (w.key, w.writer) not in admitted and (w.key, w.writer) not in unadmitted:
            unadmitted.add((w.key, w.writer))
            verdict.unadmitted_writes.append((w.key, w.writer))
        elif (w.key, w.writer) in admitted and w.token not in tokens[(w.key, w.writer)]:
            verdict.mistokened_writes.append(w)
        top = best.get(w.key)
        if not w.accepted:
            if top is not None and w.token < top.token:
                verdict.rejected += 1
            else:
                verdict.wrong_rejections.append(w)
            continue
        verdict.accepted += 1
        if top is not None and w.token < top.token:
            verdict.stale_accepted.append(w)
            continue
        if newer_admitted(w, admission.get((w.key, w.writer, w.token))):
            verdict.stale_before_newer.append(w)
        if top is not None and w.token == top.token and w.writer != top.writer:
            hold = admission.get((w.key, w.writer, w.token))
            if hold is None or _tokens_lost(hold, windows) is None:  # else counted above
                _share(verdict, shared, w.key, top.writer, w.writer)
        best[w.key] = w
    finals: dict[str, Event] = {}
    for e in events:
        if e.kind == "final" and (e.call not in finals or e.at >= finals[e.call].at):
            finals[e.call] = e
    for call in sorted(submitted | set(finals)):
        state = finals[call].state if call in finals else None
        verdict.states[state or "none"] = verdict.states.get(state or "none", 0) + 1
        if state not in FINAL_STATES:
            verdict.lost_calls.append(call)
    recorded = {e.call for e in events if e.kind in BODY_KINDS or e.kind == "final"}
    verdict.unsubmitted_calls = sorted(recorded - submitted) if submitted else []
    tokened = any(h.token is not None for held in by_key.values() for h in held)
    verdict.untested = bool(submitted) and not (tokened and verdict.accepted)
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
