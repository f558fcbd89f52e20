"""Fault runs: locked tasks on prefork workers, each in its own network namespace, under
partitions, slow and lossy links, pauses, clock steps and node crashes; judged by
:mod:`chaos.history` from a recorded history and a fenced PostgreSQL store.

Run from the repository root, as root (namespaces, routes and ``tc`` need it)::

    python -m chaos.faults                    # every fault, 6 s each (about 4 min in all)
    python -m chaos.faults --seconds 20       # every fault, 20 s each: the docs' table
    python -m chaos.faults --only clock-forward --json out.json

**The network.** A bridge ``rlf0`` (10.77.0.1/24, the root namespace's side) and, per host, a
namespace ``rlf-<host>`` joined to it by a veth pair: workers ``w1``, ``w2`` and lock nodes
``n1`` .. ``n5``. The broker, the record list and a relay to the local PostgreSQL listen on
10.77.0.1; nothing else is reached (no default route in any namespace). A partition between
two hosts is a pair of ``blackhole`` routes (packets vanish, as on a cut link, and connections
time out); a slow link is a ``tbf`` token bucket on a host's veth end; delay, jitter and the
effect of loss are ``tc qdisc ... netem`` there where the kernel has ``sch_netem``, and a
bounded userspace proxy (:mod:`chaos.lossy`) between ``w1`` and the lock nodes in any case
(it delays, jitters and stalls what it forwards: what TCP shows an application after a loss,
not packet loss itself). Everything
is removed on every exit path (:meth:`Net.down` in ``finally``, also after SIGINT/SIGTERM),
and a leftover of a killed run is removed before a new one starts.

**The faults** (:data:`FAULTS`, one per phase): a holder paused (SIGSTOP) past its lease, with
a careful and a careless body; a lock node paused; a node's clock stepped forward or back one
hour (libfaketime, :mod:`chaos.clock`); a node crashed and restarted at once with its fsync'd
append-only file or empty; on the quorum, a worker cut from the majority or from a minority,
two workers seeing different majorities, a node restarting empty, empty nodes rejoining
early onto a bare majority, a node paused, a node's clock stepped forward; a Sentinel primary
cut from its replica and its Sentinel during the failover; n1's link throttled to 8 kbit/s
(``tbf``); ``w1``'s link to the node or to every quorum node delayed 40 ms plus up to 30 ms
of jitter, with a 10 % chance per chunk of a 0.2-1 s stall (:mod:`chaos.lossy`); delay,
jitter and loss on the workers' links with ``netem`` where the kernel has ``sch_netem``
(skipped, and said so, where not; likewise ``tbf``).

**The load.** Each phase runs one fault against one deployment (one node, a 5-node quorum,
or a Sentinel-managed primary with one replica): a producer submits ``faults.step`` calls at
a fixed rate on 4 keys (0.2-1.2 s bodies, lease 1 s) for the phase; the fault starts after a
warm-up and is healed before a cool-down; then every result is read with a deadline. Every
loop is bounded by the phase's deadline.

**The schedule** is recorded: each fault's window (start, end, and the documented limit that
explains an overlap inside it, if any) goes into the result with the checker's verdict. The
workers' logs and each phase's history (``<fault>-events.jsonl``, one event a line) are kept
in ``$FAULTS_LOGDIR/faults-<pid>/`` (``/tmp`` by default), so a failed check can be read
event by event.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_py

from celery_redlock.testing import RedisServer, free_port
from chaos.clock import SteppedClockServer, libc_redis_server, missing
from chaos.fenced_store import FencedStore
from chaos.history import Event, Window, check, takeover_times
from chaos.lossy import Effects, Proxy
from support.workers import WorkerProcess

BRIDGE = "rlf0"
SUBNET = "10.77.0"
ROOT = Path(__file__).resolve().parents[1]
LEASE = 1.0
KEYS = 4


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, check=check, capture_output=True, timeout=15)


class Net:
    """The bridge and one namespace per host; partitions and netem between them."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        self.ip = {h: f"{SUBNET}.{i}" for i, h in enumerate(self.hosts, start=2)}
        self.cuts: set[tuple[str, str]] = set()
        self.shaped: set[str] = set()

    @staticmethod
    def ns(host: str) -> str:
        return f"rlf-{host}"

    def exec_prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def up(self) -> None:
        self.down()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for host in self.hosts:
            ns, veth = self.ns(host), f"rlf-{host}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", BRIDGE)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip[host]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def cut(self, a: str, b: str) -> None:
        """Partition ``a`` from ``b`` (both directions)."""
        for x, y in ((a, b), (b, a)):
            sh("ip", "-n", self.ns(x), "route", "add", "blackhole", f"{self.ip[y]}/32")
            self.cuts.add((x, y))

    def heal(self) -> None:
        for x, y in sorted(self.cuts):
            sh("ip", "-n", self.ns(x), "route", "del", "blackhole", f"{self.ip[y]}/32", check=False)
        self.cuts.clear()
        for host in sorted(self.shaped):
            sh("tc", "-n", self.ns(host), "qdisc", "del", "dev", "eth0", "root", check=False)
        self.shaped.clear()

    def shape(self, host: str, kind: str, *spec: str) -> None:
        """``tc qdisc add ... root <kind> <spec>`` on ``host``'s link (what it sends)."""
        sh("tc", "-n", self.ns(host), "qdisc", "add", "dev", "eth0", "root", kind, *spec)
        self.shaped.add(host)

    def down(self) -> None:
        """Remove every namespace and the bridge of any run (idempotent)."""
        listed = sh("ip", "netns", "list", check=False).stdout.decode()
        for line in listed.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith("rlf-"):
                sh("ip", "netns", "del", name, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)


class Relay:
    """A TCP relay from ``listen`` on the bridge to ``127.0.0.1:target`` (PostgreSQL listens on
    loopback only; the workers' namespaces reach the bridge address)."""

    def __init__(self, listen: str, target: int) -> None:
        self.target = target
        self.server = socket.create_server((listen, 0))
        self.port = int(self.server.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            up.settimeout(None)
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        self.server.close()


@dataclass
class Fault:
    """One fault: what it does, to which deployment, and the limit that explains an overlap
    inside its window (``None``: no overlap allowed)."""

    name: str
    quorum: bool
    inject: Callable[[Run], None]
    limit: str | None = None
    #: How long the fault lasts (seconds), as a multiple of the lease.
    leases: float = 3.0
    #: The kernel qdisc it needs (``netem``, ``tbf``), tried at run time; ``None``: none.
    qdisc: str | None = None
    #: ``w1`` reaches the lock nodes through a :class:`chaos.lossy.Proxy` (one per node) that
    #: applies these effects during the fault's window; ``w2`` reaches them directly.
    proxy: Effects | None = None
    #: The deployment is a Sentinel-managed primary (n1) with a replica (n2), watched by one
    #: Sentinel (n3), instead of one node or a quorum.
    sentinel: bool = False
    #: The bodies stop when their lock is lost (``False``: they write on; only the fence stops
    #: their stale writes).
    heed_loss: bool = True


@dataclass
class Run:
    """One phase: the servers, workers and producer of one fault."""

    net: Net
    nodes: list[SteppedClockServer]
    workers: list[subprocess.Popen[bytes]]
    records: redis_py.Redis
    notes: list[dict[str, Any]] = field(default_factory=list)
    paused: list[int] = field(default_factory=list)
    #: Every holder's pid a fault paused, kept after the heal continued it: the fault's window
    #: explains only overlaps of their holdings (:attr:`chaos.history.Window.holders`).
    stopped: set[int] = field(default_factory=set)
    on_heal: list[Callable[[], None]] = field(default_factory=list)
    proxies: list[Proxy] = field(default_factory=list)
    #: Set while a healed fault still settles (the phase goes on until it is clear).
    settling: threading.Event = field(default_factory=threading.Event)

    def note(self, action: str, **detail: Any) -> None:
        self.notes.append({"at": time.time(), "action": action, **detail})

    def holder_pid(self) -> int | None:
        """The pid of a pool child inside a body now (from its latest ``body_start``)."""
        events = [json.loads(e) for e in self.records.lrange("events", -200, -1)]
        open_: dict[str, int] = {}
        for e in events:
            if e["kind"] == "body_start":
                open_[e["call"]] = e["pid"]
            elif e["kind"] == "body_end":
                open_.pop(e["call"], None)
        return next(iter(open_.values()), None)


def _pause_holder(run: Run) -> None:
    """SIGSTOP a holder whose body runs, waiting for one up to :data:`HOLDER_WAIT` seconds; a
    phase that found none fails (it tested nothing: it passed before, pausing nobody)."""
    deadline = time.monotonic() + HOLDER_WAIT
    while (pid := run.holder_pid()) is None:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no body ran for {HOLDER_WAIT:g} s: no holder to pause")
        time.sleep(0.05)
    os.kill(pid, signal.SIGSTOP)
    run.paused.append(pid)
    run.stopped.add(pid)
    run.note("SIGSTOP holder", pid=pid)


#: Seconds ``pause-holder`` waits for a body to run (calls are sent every 0.1 s).
HOLDER_WAIT = 5.0


def _pause_node(run: Run) -> None:
    run.nodes[0].pause()
    run.note("SIGSTOP node", node="n1")
    run.on_heal.append(run.nodes[0].resume)


def _clock(offset: float, restore: bool) -> Callable[[Run], None]:
    """Step n1's clock by ``offset``; ``restore``: step it back at heal (a step the other way,
    so a backward step is not restored: its heal would be a forward step, another fault)."""

    def inject(run: Run) -> None:
        run.nodes[0].step(offset)
        run.note("clock step", node="n1", offset=offset)
        if restore:
            run.on_heal.append(lambda: run.nodes[0].step(0))

    return inject


def _crash(keep_data: bool) -> Callable[[Run], None]:
    """SIGKILL n1 and start it again at once, from its fsync'd append-only file or empty."""

    def inject(run: Run) -> None:
        offset = run.nodes[0].offset
        run.nodes[0].kill()
        run.note("SIGKILL node", node="n1")
        run.nodes[0].restart(keep_data=keep_data)
        run.nodes[0].step(offset)
        run.note("node restarted", node="n1", keep_data=keep_data)

    return inject


def _early_rejoin(run: Run) -> None:
    """The delayed-restart hazard of ``nodes.py``, broken on purpose: (a) n4 and n5 crash, so
    new holders hold on n1, n2, n3 only; (b) n1 crashes and restarts empty; (c) n4 and n5
    restart empty at once, before the leases ran out: n1, n4, n5 are a majority that knows no
    holder."""
    for node in run.nodes[3:]:
        node.kill()
    run.note("SIGKILL nodes", nodes=["n4", "n5"])
    time.sleep(LEASE)  # new holders are admitted on the bare majority meanwhile
    run.nodes[0].kill()
    run.nodes[0].restart(keep_data=False)
    run.note("node restarted", node="n1", keep_data=False)
    for node in run.nodes[3:]:
        node.restart(keep_data=False)
    run.note("nodes restarted", nodes=["n4", "n5"], keep_data=False)


def _cut(pairs: Sequence[tuple[str, str]]) -> Callable[[Run], None]:
    def inject(run: Run) -> None:
        for a, b in pairs:
            run.net.cut(a, b)
        run.note("partition", pairs=[list(p) for p in pairs])

    return inject


def _netem(run: Run) -> None:
    for host in ("w1", "w2"):
        run.net.shape(host, "netem", "delay", "40ms", "30ms", "loss", "10%")
    run.note("netem", hosts=["w1", "w2"], spec="delay 40ms 30ms loss 10%")


#: n1's link during ``slow-link-node``: a token bucket of 8 kbit/s (1 KB/s) holding one full
#: packet, with a queue of at most 300 ms; beyond it the kernel drops packets (real losses,
#: resent by TCP). The load's replies and acks need more than that: the queue fills.
SLOW = ("rate", "8kbit", "burst", "1600", "latency", "300ms")


def _slow_link(run: Run) -> None:
    """Throttle what n1 sends (its replies and acks, to both workers) with ``tbf``; meanwhile a
    thread in the root namespace sends a ``PING`` to n1 every 0.25 s until the heal and
    records the round trips, under the phase's load: each ``PING`` is sent once and given 1 s
    (:meth:`~chaos.clock.SteppedClockServer.client` makes no retries), so a round trip is one
    ``PING``'s and a timeout is recorded as ``None``, never as the time of a retry."""
    run.net.shape("n1", "tbf", *SLOW)
    run.note("tbf", host="n1", spec=" ".join(SLOW))
    healing = threading.Event()

    def probe() -> None:
        client = run.nodes[0].client(timeout=1)
        trips: list[float | None] = []
        try:
            while not healing.wait(0.25):
                began = time.monotonic()
                try:
                    client.ping()
                    trips.append(round(time.monotonic() - began, 3))
                except redis_py.RedisError:
                    trips.append(None)
        finally:
            client.close()
        run.note("ping round trips through the slow link", node="n1", seconds=trips)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    def stop() -> None:
        healing.set()
        thread.join(timeout=2)

    run.on_heal.insert(0, stop)


def _lossy_link(run: Run) -> None:
    for proxy in run.proxies:
        proxy.active.set()
    effects = run.proxies[0].effects
    run.note("proxy effects on", host="w1", **vars(effects))

    def off() -> None:
        for proxy in run.proxies:
            proxy.active.clear()
        run.note(
            "proxy effects off",
            chunks=sum(p.chunks for p in run.proxies),
            stalls=sum(p.stalls for p in run.proxies),
        )

    run.on_heal.append(off)


PAUSED = "a holder paused longer than its lease runs on (its writes are fenced)"
CLOCK_AHEAD = "a lock server's clock stepped forward expires its leases early"
EMPTY = "a single lock server that restarts empty has forgotten its locks"
EARLY = "quorum nodes restarting empty rejoined before the longest lease ran out"
FAILOVER = "a failover to an asynchronously replicated replica (two primaries for a while)"
#: The limits that lose the fencing tokens' state (docs/guide.md, "Fencing tokens"): in their
#: windows a later acquisition may get a smaller token.
TOKENS_GO_BACK = frozenset({EMPTY, EARLY, FAILOVER})
#: The limits whose stale holder held the lock before the fault (:attr:`Window.stale_before`).
STALE_BEFORE = frozenset({PAUSED, CLOCK_AHEAD, EMPTY})
#: The limits of a fault on holders' processes, not on a lock server or a link: only the
#: processes it stopped hold stale (:attr:`Window.holders`). A clock step or a restart of n1
#: ends the leases of every holder of every key on it, and a failover or an early rejoin
#: forgets them all: their windows name no holders.
ON_HOLDERS = frozenset({PAUSED})

FAULTS = [
    Fault("netem-one-node", False, _netem, qdisc="netem"),
    Fault("slow-link-node", False, _slow_link, qdisc="tbf"),
    Fault("lossy-link-worker", False, _lossy_link, proxy=Effects()),
    Fault("pause-holder", False, _pause_holder, PAUSED),
    Fault("pause-holder-careless-body", False, _pause_holder, PAUSED, heed_loss=False),
    Fault("pause-node", False, _pause_node),
    Fault("clock-forward", False, _clock(3600.0, restore=False), CLOCK_AHEAD),
    Fault("clock-back", False, _clock(-3600.0, restore=False)),
    Fault("crash-restart-with-data", False, _crash(True)),
    Fault("crash-restart-empty", False, _crash(False), EMPTY),
    Fault("partition-worker-from-majority", True, _cut([("w1", f"n{i}") for i in (1, 2, 3)])),
    Fault("partition-worker-from-minority", True, _cut([("w1", "n4"), ("w1", "n5")])),
    Fault(
        "bridge-partition",
        True,
        _cut([("w1", "n4"), ("w1", "n5"), ("w2", "n1"), ("w2", "n2")]),
    ),
    Fault("netem-quorum", True, _netem, qdisc="netem"),
    Fault("lossy-link-quorum", True, _lossy_link, proxy=Effects()),
    Fault("quorum-node-restart-empty", True, _crash(False)),
    Fault("quorum-early-rejoin", True, _early_rejoin, EARLY),
    Fault("quorum-node-paused", True, _pause_node),
    Fault("quorum-node-clock-forward", True, _clock(3600.0, restore=False)),
    Fault(
        "sentinel-primary-isolated",
        False,
        lambda run: _isolate_primary(run),
        FAILOVER,
        leases=5.0,
        sentinel=True,
    ),
]


#: How each qdisc a fault needs is tried (on the loopback of a scratch namespace).
PROBES = {"netem": ("delay", "1ms"), "tbf": SLOW}


def qdisc_available(kind: str) -> bool:
    """Whether this kernel has the qdisc ``kind`` (``sch_<kind>``)."""
    sh("ip", "netns", "add", "rlf-probe", check=False)
    try:
        sh("ip", "-n", "rlf-probe", "link", "set", "lo", "up")
        probe = ("tc", "-n", "rlf-probe", "qdisc", "add", "dev", "lo", "root", kind)
        return sh(*probe, *PROBES[kind], check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", "rlf-probe", check=False)


def start_worker(net: Net, host: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A prefork worker (2 processes, queue ``faults``) on ``host``: the suite's worker command
    line (:class:`support.workers.WorkerProcess`) run inside the host's namespace."""
    worker = WorkerProcess(
        None, host, 2, "prefork", ("-Q", "faults"), app="chaos.faults_app", log=log
    )
    cmd = [*net.exec_prefix(host), *worker.cmd]
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            env={**env, "FAULTS_HOST": host, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def start_sentinel(
    net: Net, primary: SteppedClockServer, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """One Sentinel on n3 watching ``primary`` as ``faults`` (1 s down-after, quorum 1);
    returns it and the lock URL that follows it."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, ip = free_port(), net.ip["n3"]
    conf = workdir / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind {ip}\nprotected-mode no\ndir {workdir}\n"
        f"sentinel monitor faults {primary.bind} {primary.port} 1\n"
        "sentinel down-after-milliseconds faults 1000\n"
        "sentinel failover-timeout faults 2000\n"
    )
    binary = libc_redis_server() or "redis-server"
    process = subprocess.Popen(
        [*net.exec_prefix("n3"), binary, str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    probe = redis_py.Redis(host=ip, port=port, socket_timeout=1)

    def watching() -> bool:
        with contextlib.suppress(redis_py.RedisError):
            return bool(probe.execute_command("SENTINEL", "REPLICAS", "faults"))
        return False

    wait_for(watching, 20, "the Sentinel to see the replica")
    probe.close()
    return process, f"redis+sentinel://{ip}:{port}/faults/0"


def _isolate_primary(run: Run) -> None:
    """Cut the primary n1 from its replica n2 and from the Sentinel (n3); the workers still
    reach it. The Sentinel promotes n2 after 1 s: two primaries until the heal."""
    _cut([("n1", "n2"), ("n1", "n3")])(run)

    def promoted() -> None:
        roles = {}
        for name, node in zip(("n1", "n2"), run.nodes, strict=True):
            with contextlib.suppress(redis_py.RedisError):
                roles[name] = node.client(timeout=1).info("replication")["role"]
        run.note("roles at heal", roles=roles)

    def watch() -> None:
        """The old primary keeps granting locks until the Sentinel turns it into a replica:
        the phase (and the fault's window) lasts until then, 20 s at most."""
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis_py.RedisError):
                    if run.nodes[0].client(timeout=1).info("replication")["role"] == "slave":
                        run.note("old primary demoted", node="n1")
                        return
                time.sleep(0.1)
            run.note("old primary still a primary after 20 s", node="n1")
        finally:
            run.settling.clear()

    def demoted() -> None:
        run.settling.set()
        threading.Thread(target=watch, daemon=True).start()

    run.on_heal[:0] = [promoted, demoted]


def final_state(result: Any) -> str:
    """A call's documented end state (:data:`chaos.history.FINAL_STATES`), or Celery's."""
    if result.state == "SUCCESS":
        return {"done": "SUCCESS", "lost": "LOST", None: "SKIPPED"}.get(result.result, "odd")
    if result.state == "FAILURE" and type(result.result).__name__ == "LockUnavailable":
        return "UNAVAILABLE"
    return str(result.state)


def run_fault(
    fault: Fault, net: Net, broker: RedisServer, relay: Relay, seconds: float, logdir: Path
) -> dict[str, Any]:
    """One phase (see the module docstring); returns its row of the result table."""
    from chaos.faults_app import app

    run_id = f"r{uuid.uuid4().hex[:10]}"
    store = FencedStore(run_id)
    store.create()
    hosts = [f"n{i}" for i in range(1, 6 if fault.quorum else 3 if fault.sentinel else 2)]
    bridge_broker = f"redis://{SUBNET}.1:{broker.port}"
    records = redis_py.Redis(host="127.0.0.1", port=broker.port, db=3, socket_timeout=5)
    records.flushdb()
    nodes: list[SteppedClockServer] = []
    workers: list[subprocess.Popen[bytes]] = []
    run = Run(net, nodes, workers, records)
    sentinel: subprocess.Popen[bytes] | None = None
    try:
        for host in hosts:
            replica = ["--replicaof", nodes[0].bind, str(nodes[0].port)] if nodes else []
            node = SteppedClockServer(
                free_port(),
                persist=True,
                prefix=net.exec_prefix(host),
                bind=net.ip[host],
                args=replica if fault.sentinel else (),
            )
            nodes.append(node.start())
        urls = [f"{n.url}?socket_timeout=0.5&socket_connect_timeout=0.5" for n in nodes]
        if fault.sentinel:
            sentinel, url = start_sentinel(net, nodes[0], logdir / f"{fault.name}-sentinel")
            urls = [url]
        env = {
            **os.environ,
            "FAULTS_BROKER": f"{bridge_broker}/1",
            "FAULTS_BACKEND": f"{bridge_broker}/2",
            "FAULTS_RECORDS": f"{bridge_broker}/3",
            "FAULTS_LOCKS": ",".join(urls),
            "FAULTS_LEASE": str(LEASE),
            "FAULTS_STORE_RUN": run_id,
            "FAULTS_STORE_DSN": f"host={SUBNET}.1 port={relay.port} dbname=test user=postgres",
        }
        via = {"FAULTS_LOCKS": ",".join(urls)}
        if fault.proxy is not None:
            for n in nodes:
                proxy = Proxy(f"{SUBNET}.1", (n.bind, n.port), fault.proxy, seed=fault.name)
                run.proxies.append(proxy)
            proxied = [
                u.replace(f"{n.bind}:{n.port}", f"{SUBNET}.1:{p.port}")
                for u, n, p in zip(urls, nodes, run.proxies, strict=True)
            ]
            via = {"FAULTS_LOCKS": ",".join(proxied)}
        for host in ("w1", "w2"):
            host_env = {**env, **via} if host == "w1" else env
            workers.append(start_worker(net, host, host_env, logdir / f"{fault.name}-{host}.log"))
        wait_for(lambda: records.exists("ready:w1", "ready:w2") == 2, 60, "both workers ready")
        app.conf.broker_url = f"redis://127.0.0.1:{broker.port}/1"
        app.conf.result_backend = f"redis://127.0.0.1:{broker.port}/2"
        submitted: list[tuple[str, Any]] = []
        rng = random.Random(fault.name)
        start = time.time()
        fault_at, heal_at = start + seconds * 0.25, start + seconds * 0.25 + fault.leases * LEASE
        end = max(start + seconds, heal_at + 3 * LEASE)
        injected = healed = False
        injected_at = fault_at
        while time.time() < end or (run.settling.is_set() and time.time() < end + 25):
            now = time.time()
            if not injected and now >= fault_at:
                fault.inject(run)
                injected, injected_at = True, time.time()
                # A fault lasts its leases from its injection (pause-holder may wait for a
                # body to pause): healed on the planned time, it could last no time at all.
                heal_at = max(heal_at, injected_at + fault.leases * LEASE)
                end = max(end, heal_at + 3 * LEASE)
            if injected and not healed and now >= heal_at:
                heal(run)
                healed = True
            call = uuid.uuid4().hex[:12]
            key = f"k{rng.randrange(KEYS)}"
            records.rpush(
                "events",
                json.dumps({"at": time.time(), "call": call, "kind": "submitted", "key": key}),
            )
            body = (key, rng.uniform(0.2, 1.2), call, fault.heed_loss)
            result = app.send_task("faults.step", body)
            submitted.append((call, result))
            time.sleep(0.1)
        if not healed:
            heal(run)
        # A fault ends when its heal did (a demotion may take a while), plus a lease.
        healed_at = max([heal_at, *(n["at"] for n in run.notes)])
        window = Window(
            fault.name,
            fault_at,
            healed_at + LEASE,
            fault.limit,
            fault.limit in TOKENS_GO_BACK,
            injected_at if fault.limit in STALE_BEFORE else None,
            frozenset(run.stopped) if fault.limit in ON_HOLDERS else None,
        )
        finals = collect(submitted, deadline=time.monotonic() + 30)
        for call, state in finals.items():
            records.rpush(
                "events",
                json.dumps({"at": time.time(), "call": call, "kind": "final", "state": state}),
            )
        raw = records.lrange("events", 0, -1)
        (logdir / f"{fault.name}-events.jsonl").write_bytes(b"\n".join(raw) + b"\n")
        events = [Event.from_dict(json.loads(e)) for e in raw]
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
        leftover = leftover_keys(nodes, deadline=time.monotonic() + 4 * LEASE)
        verdict = check(events, store.writes(), [window], leftover)
        takeovers = takeover_times(events, [window])
        return {
            "fault": fault.name,
            "deployment": "5-node quorum"
            if fault.quorum
            else "Sentinel (primary, replica)"
            if fault.sentinel
            else "one node",
            "calls": len(submitted),
            **verdict.summary(),
            "takeover_s": max(takeovers) if takeovers else None,
            "window": [window.start - start, window.end - start],
            "limit": fault.limit,
            "schedule": [{**n, "at": n["at"] - start} for n in run.notes],
            "details": verdict.details(),
        }
    finally:
        heal(run)
        if sentinel is not None:
            sentinel.kill()
            sentinel.wait()
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGKILL)
        for proxy in run.proxies:
            proxy.close()
        for n in nodes:
            n.stop()
        records.close()
        store.drop()


def heal(run: Run) -> None:
    """End the fault: routes and qdiscs removed, paused processes continued, nodes back."""
    run.net.heal()
    for pid in run.paused:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    run.paused.clear()
    while run.on_heal:
        run.on_heal.pop(0)()
    run.note("heal")


def collect(submitted: list[tuple[str, Any]], deadline: float) -> dict[str, str]:
    """Each call's end state, waiting until ``deadline`` at most (then: its Celery state)."""
    out: dict[str, str] = {}
    for call, result in submitted:
        left = max(0.1, deadline - time.monotonic())
        with contextlib.suppress(Exception):
            result.get(timeout=left, propagate=False)
        out[call] = final_state(result)
    return out


def leftover_keys(nodes: list[SteppedClockServer], deadline: float) -> list[str]:
    """Lock keys (not high-water marks, not counters) still present once every lease ran out."""

    def present() -> list[str]:
        found = []
        for n in nodes:
            c = n.client()
            try:
                found += [
                    k.decode() for k in c.scan_iter(match="redlock:{*") if not k.endswith(b":fence")
                ]
            finally:
                c.close()
        return found

    while (left := present()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def table(rows: list[dict[str, Any]]) -> str:
    """The result table, in Markdown."""
    head = (
        "| fault | deployment | calls | overlaps explained (longest, s) | overlaps unexplained |"
        " token inversions | stale writes accepted | stale writes rejected | lost calls |"
        " leftover keys | takeover (s) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        explained = str(sum(r["overlaps_explained"].values()))
        if r["overlap_max_s"]:
            explained += f" ({max(r['overlap_max_s'].values()):.2f})"
        takeover = "" if r["takeover_s"] is None else f"{r['takeover_s']:.2f}"
        lines.append(
            f"| {r['fault']} | {r['deployment']} | {r['calls']} | {explained} |"
            f" {r['overlaps_unexplained']} | {r['token_inversions']} |"
            f" {r['stale_writes_accepted']} | {r['stale_writes_rejected']} | {r['lost_calls']} |"
            f" {r['leftover_keys']} |"
            f" {takeover} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.faults", description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--only", action="append", help="run only this fault (repeatable)")
    parser.add_argument("--json", type=Path, help="write the rows there")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("chaos.faults needs root (network namespaces, routes, tc)", file=sys.stderr)
        return 2
    reason = missing()
    if reason:
        print(f"chaos.faults cannot step clocks: {reason}", file=sys.stderr)
        return 2
    faults = [f for f in FAULTS if not args.only or f.name in args.only]
    for kind in sorted({f.qdisc for f in faults if f.qdisc}):
        if not qdisc_available(kind):
            skipped = [f.name for f in faults if f.qdisc == kind]
            print(f"not run (no sch_{kind} in this kernel): {', '.join(skipped)}", file=sys.stderr)
            faults = [f for f in faults if f.qdisc != kind]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # The namespaces and the bridge have fixed names: a second run waits for the first.
    guard = Path("/run/lock/celery-redlock-faults.lock").open("w")  # noqa: SIM115
    fcntl.flock(guard, fcntl.LOCK_EX)
    net = Net(["w1", "w2", "n1", "n2", "n3", "n4", "n5"])
    logdir = Path(os.environ.get("FAULTS_LOGDIR", "/tmp")) / f"faults-{os.getpid()}"
    logdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        net.up()
        with RedisServer(
            args=["--bind", "127.0.0.1", f"{SUBNET}.1", "--protected-mode", "no"]
        ) as broker:
            relay = Relay(f"{SUBNET}.1", 5432)
            try:
                for fault in faults:
                    row = run_fault(fault, net, broker, relay, args.seconds, logdir)
                    # Free the phase's results while the broker answers: on Celery < 5.7 a
                    # result freed later (by the cyclic collector, after the broker stopped)
                    # retries its UNSUBSCRIBE for 20 s, and the run never ends.
                    gc.collect()
                    rows.append(row)
                    print(json.dumps({k: row[k] for k in row if k not in ("schedule",)}))
            finally:
                relay.close()
    finally:
        net.down()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
