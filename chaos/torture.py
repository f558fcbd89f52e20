"""Fault injection: locked tasks on prefork workers under SIGKILLs, revokes, time limits and
Redis outages, with a checker for mutual exclusion, fencing order, lost work and leftover locks.

Run from the repository root::

    python -m chaos.torture                     # short: 2 workers, 25 s of chaos
    python -m chaos.torture --long              # 3 workers, 480 s: thousands of tasks
    python -m chaos.torture --quorum            # locks on 3 nodes that chaos restarts
    python -m chaos.torture --seconds 60 --json torture.json

It prints one summary line and exits non-zero on any violation. Everything runs on private
``redis-server`` processes on free ports (:class:`celery_redlock.testing.RedisServer`): the lock
server (or 3 or 5 quorum nodes), a broker (db 1, results in db 2), and a separate *record
server* that chaos never touches. The workers are ``celery -A chaos.torture_app worker
-P prefork -c 2`` (:class:`support.workers.WorkerProcess`), each in its own process group; see
:mod:`chaos.torture_app` for the tasks.

**Load.** A producer keeps a backlog of tasks on 8 keys (random key, random duration: mostly
short, some close to the lease, some longer than it or several leases long, and some submitted
with a 1 s hard ``time_limit`` that they overrun). Tasks use ``acks_late`` with
``task_reject_on_worker_lost``, and ``lock_on_contention`` ``retry`` or ``wait`` (a timed-out
wait retries), so that no task is ever dropped by design.

**Chaos**, one action every 0.3-0.9 s: SIGKILL a random pool child; SIGKILL a pool child that
is in a kill window (tasks announce the moments right after acquiring and right before
releasing, and the flawed patterns the moment between two steps); SIGKILL a whole worker
(process group) and restart it; ``revoke(terminate=True)`` a task that is inside its critical
section, with SIGTERM or SIGKILL; and with ``--quorum``, stop a lock node and restart it empty
after ``lease + 1 s`` (the delayed-restart rule of ``celery_redlock/_nodes.py``), never more
than a minority down at once (``--rejoin-grace S``: nor within S seconds of another node's
rejoin). Hard time limits come from the task mix.

**Records.** Each critical section, while holding its lock, records itself on the record
server: ``inside:<pattern>:<key>`` is a hash of the *attempts* inside the section now (attempt
id: pid, process start time, fencing token), and the stream ``events`` gets one ``enter`` and
one ``exit`` per attempt, with the fencing token.

**The checker, and why a killed holder causes no false overlap.** A counter incremented at
entry and decremented at exit would be enough if every holder exited; but a SIGKILLed holder
never writes its exit, and the counter would stay up forever. So entry is done in three steps,
while the new holder N holds its lock:

1. read the attempts inside the section of the key;
2. judge each one's process from ``/proc`` (every process runs on this machine): *dead* if it
   is gone, is a zombie, has SIGKILL pending, or if its pid now belongs to another process
   (the start time differs); *alive* otherwise;
3. in one atomic script: re-read the attempts inside; each one judged dead is removed
   ("reaped"); each one judged alive, or not judged at all (it entered after step 1), is an
   **overlap**; then add N and append N's ``enter`` event, listing the overlaps.

This is exact in both directions. An attempt H still inside at step 3 has not written its exit
(exit removes it atomically), and H writes its exit in its body's ``finally``, before its lock
is released. So if H's process was alive at step 2, which happens after N acquired, H was
executing its critical section while N held the lock: a true overlap, whatever happens to H
later. If H's process was dead at step 2, it can never execute again, so it cannot overlap with
N (it is removed and never counted again). The only gap is an H that dies between steps 2 and
3: it was alive after N acquired, so it is a true overlap too. A holder that is killed is thus
"exited" at the moment it died; a SIGTERM that interrupts the exit record is caught and the
record retried. Had a process been judged dead wrongly, its later exit would find it removed
and be recorded as ``exit-orphan``, which also counts as an overlap.

The checker then reads the stream and results and reports:

* **overlaps**: the pairs reported at entry, plus orphaned exits;
* **token inversions**: per key, an ``enter`` whose fencing token is not larger than that of the
  previous ``enter`` (tokens must strictly increase in entry order);
* **lost**: a submitted task that is not SUCCESS, REVOKED (by the chaos) or FAILURE by its hard
  time limit (for the tasks submitted with one) when every queue drained, or that failed for
  another reason, or a SUCCESS with no recorded section (a retried or redelivered task must
  eventually run). A task that no worker ever received is reported apart, as lost by the
  broker: kombu's Redis transport pops a message before it records it as unacked, and a
  worker SIGKILLed in between loses it (:func:`check_tasks`);
* **locks left**: after the workers stopped and every lease ran out, any lock key (on any
  node).

After a failing run the worker logs and a dump of both streams (``records.jsonl``) stay in the
temporary directory named at the start (``--keep-logs`` keeps them after any run).

The same run can host the flawed patterns of :mod:`chaos.flawed` beside ours (each on its
own keys): that is what ``python -m chaos.flawed`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu.utils.uuid import uuid

from celery_redlock._redis import keys as _keys
from celery_redlock.testing import RedisServer, wait_until
from chaos import flawed
from support.procfs import start_time
from support.workers import WorkerProcess

#: Seconds between two looks at something the run waits for (results, logs, windows).
POLL = 0.05


@dataclass(frozen=True)
class Kind:
    """A kind of task in the mix: duration ``low``-``high`` seconds, or times ``time_limit``
    when ``limited`` (submitted with that hard limit, which it overruns)."""

    name: str
    weight: float
    low: float
    high: float
    limited: bool = False


def default_mix(lease: float, longest: float = 4.0) -> tuple[Kind, ...]:
    """The task mix; the longest tasks last 3 to ``longest`` leases."""
    return (
        Kind("short", 0.78, 0.0, 0.1),
        Kind("near-lease", 0.05, 0.7 * lease, 1.0 * lease),
        Kind("past-lease", 0.06, 1.2 * lease, 2.0 * lease),
        Kind("many-leases", 0.03, 3.0 * lease, longest * lease),
        Kind("time-limited", 0.08, 1.5, 2.5, limited=True),
    )


DEFAULT_MIX = default_mix(2.0)
#: More tasks near and past the TTL: what the flawed patterns trip on.
COMPARISON_MIX = (
    Kind("short", 0.55, 0.0, 0.1),
    Kind("near-lease", 0.20, 1.4, 2.0),
    Kind("past-lease", 0.15, 2.4, 4.0),
    Kind("time-limited", 0.10, 1.5, 2.5, limited=True),
)

CHAOS_WEIGHTS = {
    "child_kill": 3.0,
    "window_kill": 2.0,
    "step_kill": 2.0,  # only with patterns that have step windows (the flawed ones)
    "worker_kill": 1.0,
    "revoke": 2.0,
    "node_outage": 3.0,  # only with a quorum
}


@dataclass
class Config:
    seconds: float = 25.0
    workers: int = 2
    concurrency: int = 2
    keys: int = 8
    nodes: int = 1
    lease: float = 2.0
    margin: float = 1.5
    #: The broker's visibility timeout: a message unacked this long (a SIGKILLed worker's, or
    #: a task running longer) is redelivered. ``None``: the longest task of the mix plus 5 s.
    #: Shorter than a task, it re-runs that task forever: each run outlasts the timeout, so
    #: each copy is redelivered again (the lock keeps the copies apart, but the key starves).
    visibility: float | None = None
    time_limit: float = 1.0
    patterns: tuple[str, ...] = ("ours",)
    mix: tuple[Kind, ...] = DEFAULT_MIX
    #: Clock skew of worker i is ``skews[i % len(skews)]`` (seen by the GETSET pattern only).
    skews: tuple[float, ...] = (0.0,)
    chaos: dict[str, float] = field(default_factory=lambda: dict(CHAOS_WEIGHTS))
    chaos_interval: tuple[float, float] = (0.3, 0.9)
    #: Seconds between two whole-worker kills, at least.
    worker_kill_gap: float = 6.0
    #: Seconds after a lock node rejoined before another node may go down (0: the documented
    #: delayed-restart rule only).
    rejoin_grace: float = 0.0
    #: Seconds at the end of the chaos when only short tasks (the first kind of the mix) are
    #: submitted, so that the queues drain soon after the chaos.
    tail: float = 5.0
    #: Tasks not yet ended, kept per pool child.
    backlog: int = 3
    #: Seconds after the chaos for every task to end (then the rest are lost): a queue of
    #: several-lease tasks on one key, behind a redelivery after ``visibility``, takes a while.
    drain: float = 30.0
    seed: int | None = None
    json_path: str | None = None
    verbose: bool = False
    #: Keep the worker logs and the records dump after a run without violations too.
    keep_logs: bool = False


# -- processes ------------------------------------------------------------------------------------


def visibility(config: Config) -> float:
    """The visibility timeout: the configured one, or the longest task (its run plus a wait
    for the lock of up to 3 s) plus 2 s."""
    if config.visibility is not None:
        return config.visibility
    longest = max(k.high * (config.time_limit if k.limited else 1.0) for k in config.mix)
    return longest + 3.0 + 2.0


def _wall(at: float) -> str:
    """``HH:MM:SS.mmm`` of a ``time.time()`` value (worker logs use the same clock)."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def make_worker(index: int, concurrency: int, env: dict[str, str], logdir: Path) -> WorkerProcess:
    """``celery -A chaos.torture_app worker -P prefork`` logging to ``logdir``; launched later."""
    name = f"torture{index}"
    return WorkerProcess(
        None,
        name,
        concurrency,
        env=env,
        app="chaos.torture_app",
        log=logdir / f"{name}.log",
        stderr=logdir / f"{name}.stderr",
    )


# -- load -----------------------------------------------------------------------------------------


@dataclass
class Submitted:
    pattern: str
    key: str
    kind: str
    limited: bool


class Producer:
    """Submits tasks, keeping a backlog, and follows their states in the result backend."""

    def __init__(
        self,
        config: Config,
        rng: random.Random,
        app: Celery,
        results: redis.Redis,
        records: redis.Redis,
    ) -> None:
        self.config = config
        self.rng = rng
        self.app = app
        self.results = results
        self.records = records
        self.tasks: dict[str, Submitted] = {}
        self.outstanding: set[str] = set()
        self.states: dict[str, dict[str, Any]] = {}
        self._kinds = list(config.mix)
        self._weights = [k.weight for k in config.mix]
        #: Patterns whose first task is still to come: it is time-limited, so that even a
        #: short run ends at least one task by its hard time limit per pattern. Its id goes
        #: to the records' ``no-revoke`` set, which :meth:`Chaos.revoke` leaves alone.
        self._first = {p for p in config.patterns if any(k.limited for k in self._kinds)}

    def submit(self, pattern: str, short_only: bool = False) -> None:
        cfg, rng = self.config, self.rng
        key = f"k{rng.randrange(cfg.keys)}"
        first = pattern in self._first and not short_only
        if first:
            self._first.discard(pattern)
            kind = next(k for k in self._kinds if k.limited)
        else:
            kind = self._kinds[0] if short_only else rng.choices(self._kinds, self._weights)[0]
        scale = cfg.time_limit if kind.limited else 1.0
        duration = round(rng.uniform(kind.low, kind.high) * scale, 3)
        options: dict[str, Any] = {"time_limit": cfg.time_limit} if kind.limited else {}
        seq = len(self.tasks)
        if pattern == "ours":
            name = rng.choice(["torture.ours_retry", "torture.ours_wait"])
            args: tuple[Any, ...] = (key, duration, seq)
        else:
            name, args = "torture.flawed", (pattern, key, duration, seq)
        task_id = uuid()
        if first:
            self.records.sadd("no-revoke", task_id)
        self.app.send_task(name, args=args, task_id=task_id, **options)
        self.records.hset("published", message_id(task_id, 0, None), time.time())
        self.tasks[task_id] = Submitted(pattern, key, kind.name, kind.limited)
        self.outstanding.add(task_id)

    def top_up(self, target: int, short_only: bool = False) -> None:
        """Submit until each pattern has its share of ``target`` tasks not ended (a pattern
        whose tasks get stuck must not crowd the others out)."""
        share = max(1, target // len(self.config.patterns))
        pending = Counter(self.tasks[t].pattern for t in self.outstanding)
        for pattern in self.config.patterns:
            for _ in range(share - pending[pattern]):
                self.submit(pattern, short_only)

    def poll(self) -> None:
        """Move tasks that reached a final state out of ``outstanding``."""
        ids = list(self.outstanding)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            values = self.results.mget([f"celery-task-meta-{t}" for t in chunk])
            for task_id, raw in zip(chunk, values, strict=True):
                if raw is None:
                    continue
                meta = json.loads(raw)
                if meta.get("status") in ("SUCCESS", "FAILURE", "REVOKED"):
                    self.outstanding.discard(task_id)
                    self.states[task_id] = meta

    def describe(self, task_id: str) -> str:
        """``<kind> <key> <state>`` of a task, for progress lines."""
        sub = self.tasks[task_id]
        raw = self.results.get(f"celery-task-meta-{task_id}")
        state = json.loads(raw).get("status") if raw else "PENDING"
        return f"{sub.kind} {sub.pattern}:{sub.key} {state} {task_id[:8]}"

    def final_states(self) -> dict[str, dict[str, Any]]:
        """Every task's state now (final ones may have been overwritten by a duplicate)."""
        ids = list(self.tasks)
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            values = self.results.mget([f"celery-task-meta-{t}" for t in chunk])
            for task_id, raw in zip(chunk, values, strict=True):
                out[task_id] = json.loads(raw) if raw is not None else {"status": "PENDING"}
        return out


# -- chaos ----------------------------------------------------------------------------------------


class Chaos:
    """Picks and performs fault injections; restarts what it stopped when it is due."""

    def __init__(
        self,
        config: Config,
        rng: random.Random,
        workers: list[WorkerProcess],
        nodes: list[RedisServer],
        records: redis.Redis,
        app: Celery,
    ) -> None:
        self.config = config
        self.rng = rng
        self.workers = workers
        self.nodes = nodes
        self.records = records
        self.app = app
        self.counts: Counter[str] = Counter()
        self.revoked: set[str] = set()
        self.log: list[tuple[float, str, str, str]] = []
        self.t0 = time.monotonic()
        self.down_workers: dict[int, float] = {}  # worker index -> restart due
        self.down_nodes: dict[int, float] = {}  # node index -> restart due
        self.last_rejoin = -1e9
        self.last_worker_kill = -1e9
        has_steps = any(p in ("setnx_expire",) for p in config.patterns)
        self.weights = {
            action: weight
            for action, weight in config.chaos.items()
            if weight > 0
            and (action != "node_outage" or len(nodes) >= 3)
            and (action != "step_kill" or has_steps)
        }
        self.first_round = list(self.weights)
        rng.shuffle(self.first_round)

    def note(self, action: str, detail: str) -> None:
        self.counts[action] += 1
        self.log.append((round(time.monotonic() - self.t0, 3), _wall(time.time()), action, detail))
        self.records.xadd("chaos", {"action": action, "detail": detail})

    # -- actions ----------------------------------------------------------------------------

    def step(self) -> None:
        """One action: first each kind once (in random order, so that a short run has them
        all), then kinds drawn by weight. An action that finds nothing to act on is retried
        at the next step while it is in the first round."""
        if self.first_round:
            action = self.first_round[0]
            if getattr(self, action)():
                self.first_round.pop(0)
            return
        actions = list(self.weights)
        action = self.rng.choices(actions, [self.weights[a] for a in actions])[0]
        getattr(self, action)()

    def _ours(self, pid: int) -> bool:
        return any(pid in w.children() for w in self.workers)

    def child_kill(self) -> bool:
        candidates = [(w, pid) for w in self.workers if w.is_ready() for pid in w.children()]
        if not candidates:
            return False
        worker, pid = self.rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.note("child_kill", f"{worker.name} child {pid}")
        return True

    def _kill_in_window(self, prefix: str, action: str) -> bool:
        """SIGKILL a pool child inside a window named ``prefix...`` (wait up to 1 s for one)."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for marker in self.records.scan_iter(match="window:*", count=1000):
                value = self.records.get(marker)
                if value is None:
                    continue
                name, _, start = value.decode().partition("|")
                pid = int(marker.decode().partition(":")[2])
                if not name.startswith(prefix) or start_time(pid) != start or not self._ours(pid):
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.note(action, f"child {pid} in {name}")
                return True
            time.sleep(0.01)  # windows last WINDOW (30 ms): poll faster than that
        self.counts[f"{action}_missed"] += 1
        return False

    def window_kill(self) -> bool:
        return self._kill_in_window("gen:", "window_kill")

    def step_kill(self) -> bool:
        return self._kill_in_window("step:", "step_kill")

    def worker_kill(self) -> bool:
        now = time.monotonic()
        ready = [w for w in self.workers if w.is_ready()]
        if (
            self.down_workers
            or len(ready) < 2
            or now - self.last_worker_kill < self.config.worker_kill_gap
        ):
            return False
        worker = self.rng.choice(ready)
        worker.kill()
        self.last_worker_kill = now
        self.down_workers[self.workers.index(worker)] = now + self.rng.uniform(0.2, 1.0)
        self.note("worker_kill", worker.name)
        return True

    def revoke(self) -> bool:
        inside = []
        kept = self.records.smembers("no-revoke")  # each pattern's first, time-limited task
        for key in self.records.scan_iter(match="inside:*", count=1000):
            for proc in self.records.hvals(key):
                info = json.loads(proc)
                alive = start_time(int(info["pid"])) == info["start"]
                if alive and info["tid"].encode() not in kept:
                    inside.append(info["tid"])
        if not inside:
            return False
        task_id = self.rng.choice(inside)
        sig = self.rng.choice(["SIGTERM", "SIGKILL"])
        self.app.control.revoke(task_id, terminate=True, signal=sig)
        self.revoked.add(task_id)
        self.note(f"revoke_{sig.lower()}", task_id)
        return True

    def node_outage(self) -> bool:
        max_down = (len(self.nodes) - 1) // 2
        up = [i for i in range(len(self.nodes)) if i not in self.down_nodes]
        if (
            len(self.down_nodes) >= max_down
            or not up
            or time.monotonic() - self.last_rejoin < self.config.rejoin_grace
        ):
            return False
        index = self.rng.choice(up)
        self.nodes[index].stop()
        # The delayed-restart rule: down longer than the longest TTL (the lease), then empty.
        down_for = self.config.lease + 1.0 + self.rng.uniform(0.0, 0.5)
        self.down_nodes[index] = time.monotonic() + down_for
        self.note("node_outage", f"node {index} down for {down_for:.2f}s")
        return True

    # -- restarts -----------------------------------------------------------------------------

    def restart_due(self, force_workers: bool = False) -> None:
        now = time.monotonic()
        for index, due in list(self.down_workers.items()):
            if force_workers or now >= due:
                self.workers[index].launch()
                del self.down_workers[index]
        for index, due in list(self.down_nodes.items()):
            if now >= due:
                self.nodes[index].start()
                del self.down_nodes[index]
                self.last_rejoin = time.monotonic()
                self.counts["node_restarts"] += 1

    def heal(self, timeout: float = 30.0) -> None:
        """Restart every stopped worker and node (nodes when their rule allows)."""
        self.restart_due(force_workers=True)
        deadline = time.monotonic() + timeout
        while self.down_nodes and time.monotonic() < deadline:
            time.sleep(POLL)
            self.restart_due()


# -- checks ---------------------------------------------------------------------------------------


def read_stream(client: redis.Redis, name: str) -> Iterator[dict[str, str]]:
    last = "-"
    while True:
        batch = client.xrange(name, min=last, count=5000)
        if last != "-":
            batch = batch[1:]
        if not batch:
            return
        for _, fields in batch:
            yield {k.decode(): v.decode() for k, v in fields.items()}
        last = batch[-1][0].decode()


def check_sections(records: redis.Redis, config: Config) -> dict[str, dict[str, Any]]:
    """Overlaps and fencing order per pattern, from the ``events`` stream (see the docstring)."""
    stats: dict[str, dict[str, Any]] = {
        p: {
            "entries": 0,
            "exits": 0,
            "overlaps": 0,
            "overlaps_within_ttl": 0,
            "inversions": 0,
            "unlocked": 0,
            "ran": set(),
            "details": [],
        }
        for p in config.patterns
    }
    entered: dict[str, dict[str, str]] = {}
    previous: dict[tuple[str, str], int] = {}
    for ev in read_stream(records, "events"):
        s = stats[ev["p"]]
        if ev["ev"] == "enter":
            entered[ev["att"]] = ev
            s["entries"] += 1
            token = int(ev["tok"])
            if token < 0:
                s["unlocked"] += 1
            for item in ev["ovl"].split():
                att, _, why = item.partition("=")
                holder = entered.get(att, {})
                within = float(ev["t"]) < float(holder.get("acq", "inf")) + config.lease
                s["overlaps"] += 1
                s["overlaps_within_ttl"] += within
                s["details"].append(
                    f"{ev['p']} {ev['key']}: {ev['tid']} (token {token}) entered at {ev['t']} "
                    f"while {holder.get('tid')} (token {holder.get('tok')}, entered "
                    f"{holder.get('t')}) was inside: {why}"
                )
            last = previous.get((ev["p"], ev["key"]))
            if last is not None and token <= last:
                s["inversions"] += 1
                s["details"].append(
                    f"{ev['p']} {ev['key']}: token {token} of {ev['tid']} entered after "
                    f"token {last}"
                )
            previous[(ev["p"], ev["key"])] = token
        else:
            s["exits"] += 1
            s["ran"].add(ev["tid"])
            if ev["ev"] == "exit-orphan":
                s["overlaps"] += 1
                s["details"].append(
                    f"{ev['p']} {ev['key']}: {ev['tid']} exited after being judged dead"
                )
            elif ev["lost"] == "1":
                s["details"].append(f"{ev['p']} {ev['key']}: {ev['tid']} exited with lock lost")
    return stats


def message_id(task_id: str, retries: Any, eta: Any) -> str:
    """``<task id>|<retries>|<eta>``: one message of a call. A requeue by the lock keeps the
    call's ``retries`` (see :func:`celery_redlock._celery.engine.lock_retry`), so only its
    ``eta`` (the countdown's end) tells it from the message before it."""
    return f"{task_id}|{retries or 0}|{eta or ''}"


class Messages:
    """Which task messages were published (submissions, retries and requeues by the lock) and
    which a worker received, by ``<task id>|<retries>|<eta>`` (recorded by the workers' signal
    receivers, :func:`message_id`)."""

    def __init__(self, records: redis.Redis, broker: redis.Redis) -> None:
        self.records = records
        self.broker = broker  # the broker's database
        #: task id -> (unix time, message) of its last published message
        self.latest: dict[str, tuple[float, str]] = {}
        self.received: set[str] = set()

    def refresh(self) -> None:
        for item, raw_at in self.records.hscan_iter("published", count=1000):
            message, at = item.decode(), float(raw_at)
            task_id = message.split("|", 1)[0]
            if at >= self.latest.get(task_id, (0.0, ""))[0]:
                self.latest[task_id] = (at, message)
        self.received = {m.decode() for m in self.records.sscan_iter("received", count=1000)}

    def last(self, task_id: str) -> str:
        """The task's last message: its submission, or its last published retry or requeue."""
        return self.latest.get(task_id, (0.0, message_id(task_id, 0, None)))[1]

    def when(self, task_id: str) -> str:
        """Wall-clock time the task's last message was published."""
        at = self.latest.get(task_id, (None, ""))[0]
        return "?" if at is None else _wall(at)

    def last_received(self, task_id: str) -> bool:
        return self.last(task_id) in self.received

    def describe(self, task_id: str) -> str:
        """Where the task's last message is: received by a worker, in the broker, or neither."""
        where = "received" if self.last_received(task_id) else "not received"
        if task_id in self.in_broker():
            where += ", in the broker"
        return f"published {self.when(task_id)}, {where}"

    def in_broker(self) -> set[str]:
        """Task ids of the messages the broker still has: queued, or unacked (delivered to a
        worker, redelivered after the visibility timeout if that worker died)."""
        ids = set()
        for key in self.broker.scan_iter(match="celery*", _type="list", count=1000):
            for raw in self.broker.lrange(key, 0, -1):
                ids.add(json.loads(raw)["headers"]["id"])
        for raw in self.broker.hvals("unacked"):
            ids.add(json.loads(raw)[0]["headers"]["id"])
        return ids

    def stranded(self, outstanding: set[str]) -> bool:
        """Whether every task in ``outstanding`` lost its last message (see check_tasks)."""
        self.refresh()
        if any(self.last_received(t) for t in outstanding):
            return False
        return not (outstanding & self.in_broker())


def check_tasks(
    producer: Producer, revoked: set[str], ran: dict[str, set[str]], messages: Messages
) -> dict[str, dict[str, Any]]:
    """How each pattern's tasks ended; the lost ones with a reason.

    A task that never ended, and whose last message (the submission, its last retry or its
    last requeue by the lock) no worker ever received, was lost by the broker transport, not by
    a lock: kombu's Redis transport pops a message (``BRPOP``) before it records it as unacked,
    so a worker SIGKILLed in between loses that message. Those are counted apart
    (``broker_lost``).
    """
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tasks": 0, "outcomes": Counter(), "lost": 0, "broker_lost": 0, "lost_details": []}
    )
    in_broker = messages.in_broker()
    for task_id, meta in producer.final_states().items():
        sub = producer.tasks[task_id]
        s = out[sub.pattern]
        s["tasks"] += 1
        status = meta.get("status")
        result = meta.get("result")
        exc = result.get("exc_type") if isinstance(result, dict) else None
        reason = None
        if status == "SUCCESS":
            outcome = "success"
            if task_id not in ran[sub.pattern]:
                reason = "SUCCESS without a recorded section"
        elif status == "REVOKED":
            outcome = "revoked"
            if task_id not in revoked:
                reason = "REVOKED but never revoked"
        elif status == "FAILURE" and exc == "TimeLimitExceeded" and sub.limited:
            outcome = "time-limit"
        elif not messages.last_received(task_id) and task_id not in in_broker:
            outcome = "broker-lost"
            s["broker_lost"] += 1
            s["lost_details"].append(
                f"{sub.pattern} {sub.key} {sub.kind} {task_id}: {status}, its message "
                f"{messages.last(task_id)} (published {messages.when(task_id)}) "
                "was never received by a worker and is not in the broker"
            )
        else:
            outcome = "lost"
            reason = f"{status} {exc or ''}".strip()
        s["outcomes"][outcome] += 1
        if reason:
            s["lost"] += 1
            s["lost_details"].append(f"{sub.pattern} {sub.key} {sub.kind} {task_id}: {reason}")
    return out


def dump_records(records: redis.Redis, path: Path) -> None:
    """The ``events`` and ``chaos`` streams as JSON lines, for a post-mortem."""
    with path.open("w") as out:
        for stream in ("events", "chaos"):
            for ev in read_stream(records, stream):
                out.write(json.dumps({"stream": stream, **ev}) + "\n")


def locks_left(config: Config, nodes: list[RedisServer]) -> dict[str, list[str]]:
    """Lock keys that still exist (ours: on any node; flawed: still blocking a caller)."""
    left: dict[str, list[str]] = {p: [] for p in config.patterns}
    for node in nodes:
        client = node.client()
        try:
            if "ours" in left:
                left["ours"] += [
                    f"{k.decode()} on :{node.port}"
                    for k in client.scan_iter(match=_keys.lock_pattern("torture"), count=1000)
                    if _keys.is_slot(k)
                ]
            if node is nodes[0]:
                for pattern in config.patterns:
                    if pattern in flawed.PATTERNS:
                        impl = flawed.PATTERNS[pattern]
                        left[pattern] += [
                            flawed.lock_key(pattern, f"k{i}")
                            for i in range(config.keys)
                            if impl.still_held(
                                client, flawed.lock_key(pattern, f"k{i}"), time.time()
                            )
                        ]
        finally:
            client.close()
    return left


#: ERROR lines the chaos causes by design (killed children, hard time limits).
EXPECTED_ERRORS = (
    "WorkerLostError",
    "TimeLimitExceeded",
    "exited with 'signal",
    "Hard time limit",
    " lost (token ",
)


def worker_log_counts(workers: list[WorkerProcess]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for worker in workers:
        for path in filter(None, (worker.log, worker.stderr)):
            text = path.read_text(errors="replace") if path.exists() else ""
            counts["lock lost (ERROR)"] += text.count(" lost (token ")
            counts["parent releases"] += text.count("released the lock of dead child")
            counts["hard time limits"] += text.count("Hard time limit")
            for line in text.splitlines():
                if ("ERROR/" in line or "CRITICAL/" in line) and not any(
                    known in line for known in EXPECTED_ERRORS
                ):
                    counts["unexpected ERROR lines"] += 1
    return dict(counts)


# -- the run --------------------------------------------------------------------------------------


def progress(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)


def _exit_on_signals() -> None:
    """SIGTERM and SIGINT unwind the run (stopping its workers and servers), even when SIGINT
    was inherited as ignored (a background job of a non-interactive shell)."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def run(config: Config) -> dict[str, Any]:
    """One torture run; returns every figure (``summary``, ``ok``, per-pattern stats)."""
    _exit_on_signals()
    seed = config.seed if config.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="torture-"))
    with contextlib.ExitStack() as stack:
        records_server = stack.enter_context(RedisServer())
        broker_server = stack.enter_context(RedisServer())
        nodes = [stack.enter_context(RedisServer()) for _ in range(config.nodes)]
        base = f"redis://127.0.0.1:{broker_server.port}"
        records = redis.Redis(port=records_server.port, socket_timeout=10)
        results = redis.Redis(port=broker_server.port, db=2, socket_timeout=10)
        broker = redis.Redis(port=broker_server.port, db=1, socket_timeout=10)
        env = {
            "REDLOCK_TEST_BROKER": f"{base}/1",
            "REDLOCK_TEST_BACKEND": f"{base}/2",
            "REDLOCK_TEST_RECORDS": records_server.url,
            "REDLOCK_TEST_URL": ",".join(n.url for n in nodes),
            "REDLOCK_TEST_LEASE": str(config.lease),
            "REDLOCK_TEST_TTL_MARGIN": str(config.margin),
            "REDLOCK_TEST_VISIBILITY": str(visibility(config)),
        }
        workers = [
            make_worker(
                i,
                config.concurrency,
                {**env, "REDLOCK_TEST_CLOCK_SKEW": str(config.skews[i % len(config.skews)])},
                logdir,
            )
            for i in range(config.workers)
        ]
        for worker in workers:
            stack.callback(worker.kill)
        for worker in workers:
            worker.launch()
        wait_until(lambda: all(w.is_ready() for w in workers), 60, "the workers' 'ready.'", POLL)
        t_ready = time.monotonic()
        app = Celery("torture-client", broker=f"{base}/1", set_as_current=False)
        stack.callback(app.close)
        producer = Producer(config, rng, app, results, records)
        chaos = Chaos(config, rng, workers, nodes, records, app)
        progress(
            f"torture: {config.workers} workers ready after "
            f"{time.monotonic() - started:.1f}s; chaos for {config.seconds:.0f}s "
            f"(seed {seed}, logs in {logdir}, kept on failure)"
        )

        # 1. load and chaos
        target = config.backlog * config.workers * config.concurrency
        t_chaos = time.monotonic()
        end = t_chaos + config.seconds
        next_action = t_chaos + 1.0
        next_poll = 0.0
        while time.monotonic() < end:
            now = time.monotonic()
            chaos.restart_due()
            if now >= next_poll:
                producer.poll()
                next_poll = now + 0.5
            producer.top_up(target, short_only=now >= end - config.tail)
            if now >= next_action:
                chaos.step()
                next_action = time.monotonic() + rng.uniform(*config.chaos_interval)
            time.sleep(POLL)

        # 2. heal and drain
        t_drain = time.monotonic()
        chaos.heal()
        deadline = time.monotonic() + config.drain
        next_report = time.monotonic() + 5.0
        messages = Messages(records, broker)
        stranded_since: float | None = None
        while producer.outstanding and time.monotonic() < deadline:
            producer.poll()
            # Stop early when every task left lost its message in the broker (never received,
            # not queued): nothing can end them. Seen twice, 1 s apart, to let deliveries land.
            if messages.stranded(producer.outstanding):
                stranded_since = stranded_since or time.monotonic()
                if time.monotonic() - stranded_since >= 1.0:
                    break
            else:
                stranded_since = None
            if config.verbose and time.monotonic() >= next_report:
                next_report += 5.0
                progress(
                    f"  drain: {len(producer.outstanding)} tasks not ended: "
                    + ", ".join(
                        f"{producer.describe(t)} (last message {messages.describe(t)})"
                        for t in sorted(producer.outstanding)
                    )
                )
            time.sleep(0.25)
        drained = not producer.outstanding
        t_stop = time.monotonic()
        # Warm shutdown; a worker still busy after 5 s runs a duplicate of a finished task
        # (redelivered after the visibility timeout): SIGKILL it, its lease then runs out.
        for worker in workers:
            worker.send(signal.SIGTERM)
        warm = [w.join(timeout=5.0) for w in workers]
        t_stopped = time.monotonic()

        # 3. every lease runs out, then no lock may be left
        expiry = config.lease + max(abs(s) for s in config.skews) + 0.5
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: not any(locks_left(config, nodes).values()),
                expiry,
                "every lock key to expire",
                POLL,
            )
        left = locks_left(config, nodes)

        # 4. check
        sections = check_sections(records, config)
        messages.refresh()
        tasks = check_tasks(
            producer, chaos.revoked, {p: s["ran"] for p, s in sections.items()}, messages
        )
        dump_records(records, logdir / "records.jsonl")
        logs = worker_log_counts(workers)
        t_checked = time.monotonic()
        elapsed = t_checked - started
        records.close()
        results.close()
        broker.close()

    patterns: dict[str, dict[str, Any]] = {}
    for p in config.patterns:
        s, t = sections[p], tasks[p]
        patterns[p] = {
            "tasks": t["tasks"],
            "outcomes": dict(t["outcomes"]),
            "entries": s["entries"],
            "exits": s["exits"],
            "killed_inside": s["entries"] - s["exits"],
            "overlaps": s["overlaps"],
            "overlaps_within_ttl": s["overlaps_within_ttl"],
            "inversions": s["inversions"],
            "unlocked": s["unlocked"],
            "lost": t["lost"],
            "broker_lost": t["broker_lost"],
            "locks_left": len(left[p]),
            "details": s["details"][:200],
            "lost_details": t["lost_details"][:200],
            "left_keys": left[p][:50],
        }
    ours = patterns.get("ours", {})
    violations = sum(
        ours.get(k, 0) for k in ("overlaps", "inversions", "lost", "locks_left", "unlocked")
    )
    ok = violations == 0
    c = chaos.counts
    time_limits = sum(pt["outcomes"].get("time-limit", 0) for pt in patterns.values())
    parts = [
        f"{ours.get('tasks', 0)} tasks",
        f"{ours.get('overlaps', 0)} overlaps",
        f"{ours.get('inversions', 0)} token inversions",
        f"{ours.get('lost', 0)} lost",
        f"{ours.get('locks_left', 0)} locks left",
        f"{c['child_kill'] + c['window_kill'] + c['step_kill']} child kills "
        f"({c['window_kill'] + c['step_kill']} in windows)",
        f"{c['worker_kill']} worker kills",
        f"{c['revoke_sigterm'] + c['revoke_sigkill']} revokes",
        f"{time_limits} hard time limits",
    ]
    if config.nodes >= 3:
        parts.append(f"{c['node_outage']} node outages of {config.nodes}")
    if logs.get("lock lost (ERROR)"):
        parts.append(f"{logs['lock lost (ERROR)']} locks reported lost")
    if ours.get("unlocked"):
        parts.append(f"{ours['unlocked']} unlocked runs")
    broker_lost = sum(pt["broker_lost"] for pt in patterns.values())
    if broker_lost:
        parts.append(f"{broker_lost} lost by the broker (never received)")
    if not drained:
        parts.append(f"{len(producer.outstanding)} tasks not ended after the drain")
    summary = f"torture: {', '.join(parts)} in {elapsed:.1f}s: {'OK' if ok else 'FAIL'}"
    result: dict[str, Any] = {
        "summary": summary,
        "ok": ok,
        "seed": seed,
        "config": {k: v for k, v in asdict(config).items() if k != "mix"}
        | {"mix": [asdict(k) for k in config.mix], "visibility": visibility(config)},
        "patterns": patterns,
        "chaos": dict(c),
        "chaos_log": chaos.log,
        "worker_logs": logs,
        "worker_starts": [w.starts for w in workers],
        "warm_stops": warm,
        "timings": {
            "total": elapsed,
            "startup": t_ready - started,
            "chaos": t_drain - t_chaos,
            "drain": t_stop - t_drain,
            "stop": t_stopped - t_stop,
            "expiry_and_check": t_checked - t_stopped,
        },
        "logdir": str(logdir),
    }
    if config.verbose or not ok:
        for stats in patterns.values():
            for line in stats["details"][:20] + stats["lost_details"][:20] + stats["left_keys"]:
                progress(f"  {line}")
    print(summary, flush=True)
    if ok and not config.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
        result["logdir"] = None
    if config.json_path:
        Path(config.json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m chaos.torture", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--long", action="store_true", help="3 workers, 480 s of chaos (default: 2 workers, 25 s)"
    )
    p.add_argument(
        "--quorum",
        action="store_true",
        help="locks on a quorum of independent nodes that chaos stops and restarts",
    )
    p.add_argument("--nodes", type=int, default=3, help="quorum size with --quorum (3 or 5)")
    p.add_argument(
        "--rejoin-grace",
        type=float,
        default=0.0,
        metavar="S",
        help="with --quorum: no node goes down within S seconds of another's rejoin",
    )
    p.add_argument("--seconds", type=float, help="seconds of chaos")
    p.add_argument("--workers", type=int, help="prefork workers (-c 2 each)")
    p.add_argument("--seed", type=int, help="random seed (printed at the start)")
    p.add_argument("--json", metavar="F", help="write every figure as JSON to F")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each violation, and the tasks the drain waits for",
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the worker logs and records dump (kept anyway on failure)",
    )
    args = p.parse_args(argv)
    config = Config(
        seed=args.seed, json_path=args.json, verbose=args.verbose, keep_logs=args.keep_logs
    )
    if args.long:
        config.seconds, config.workers, config.drain = 480.0, 3, 120.0
        config.mix = default_mix(config.lease, longest=6.0)
    if args.quorum:
        config.nodes = args.nodes
        config.rejoin_grace = args.rejoin_grace
        config.drain = max(config.drain, 60.0)
    if args.seconds is not None:
        config.seconds = args.seconds
    if args.workers is not None:
        config.workers = args.workers
    return config


def main(argv: Sequence[str] | None = None) -> int:
    return 0 if run(parse_args(argv))["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
