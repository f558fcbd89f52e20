"""The example project on a fresh machine, without Docker: ``make demo``.

Starts an embedded ``redis-server`` (free loopback port, ``noeviction``), two prefork workers,
``celery beat`` and the producer as subprocesses; runs for ``--seconds`` (20); prints what the
locks did: runs and skips per task, the maximum number of concurrent executions per key (must be
1), the cache stampedes, and the start of the beat job's lock timeline. Then it stops
everything it started (warm shutdown, SIGKILL after a deadline) and checks that no process and
no key the package wrote is left (the event counters aside). Exit status 0 when every check
passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from celery_redlock.testing import RedisServer

#: The repository root: ``python -m example_project.demo`` runs from there.
ROOT = Path(__file__).resolve().parents[1]

APP = "example_project.tasks"
TIMELINE_LINES = 8


def wait_for(what: str, predicate: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class Service:
    """One subprocess in its own process group, logging to a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self.log.touch()
        self.descendants: set[int] = set()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=env,
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 60) -> None:
        def seen() -> bool:
            if self.process.poll() is not None:
                raise SystemExit(f"demo: {self.name} exited early:\n{self.text()[-2000:]}")
            return re.search(pattern, self.text()) is not None

        wait_for(f"{self.name} to log /{pattern}/", seen, timeout)
        self.note_descendants()

    def note_descendants(self) -> None:
        """Remember the pool children (Linux ``/proc``), to check later that they are gone."""
        with contextlib.suppress(OSError):
            path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            self.descendants.update(int(pid) for pid in path.read_text().split())

    def terminate(self) -> None:
        """SIGTERM: a worker's warm shutdown lets a running task finish and release."""
        self.note_descendants()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20) -> None:
        """Wait for the process to exit after :meth:`terminate`; SIGKILL its group if late."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"demo: {self.name} did not stop within {timeout:.0f}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # anything left in its group
        self.process.wait()

    def pids(self) -> set[int]:
        return {self.process.pid, *self.descendants}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def package_keys(server: RedisServer) -> list[str]:
    """Every key the package wrote in the lock database, but the counter hashes and the
    fencing high-water marks.

    Lock slots, fencing counters, queued and newest-call markers, rate logs and override
    records all live under ``redlock:{<name>}``; the event counters (``redlock:stats:<task>``)
    are kept on purpose, so ``celery redlock stats`` can show them, and so are the high-water
    marks of fencing tokens (``redlock:fence:{<tag>}``, one per Cluster slot at most).
    """
    keys = (k.decode() for k in server.client().scan_iter(match="redlock:*"))
    kept = ("redlock:stats:", "redlock:fence:{")
    return [k for k in keys if not k.startswith(kept)]


def counter_hashes(server: RedisServer) -> int:
    """How many event-counter hashes (``redlock:stats:<task>``) the run left, on purpose."""
    return sum(1 for _ in server.client().scan_iter(match="redlock:stats:*"))


def summary(server: RedisServer, seconds: float) -> tuple[list[str], dict[str, int]]:
    """The report lines, and the maximum concurrency per key label."""
    data = redis.Redis(host="127.0.0.1", port=server.port, db=3, socket_timeout=5)
    decode = lambda m: {k.decode(): int(v) for k, v in m.items()}  # noqa: E731
    runs, skips = decode(data.hgetall("runs")), decode(data.hgetall("skips"))
    max_inside = {k.decode(): int(v) for k, v in data.zrange("max_inside", 0, -1, withscores=True)}
    cache = decode(data.hgetall("cache"))
    labels = {k.decode(): v.decode() for k, v in data.hgetall("labels").items()}
    lines = [f"ran {seconds:.0f}s: 2 prefork workers x 2 processes, celery beat, a producer"]
    for task in ("refresh_report", "sync_account"):
        lines.append(f"  {task:15s} runs {runs.get(task, 0):4d}   skipped {skips.get(task, 0):4d}")
    lines.append(
        "maximum concurrent executions per key (must be 1): "
        + ", ".join(f"{label}={n}" for label, n in sorted(max_inside.items()))
    )
    lines.append(
        f"cache stampede guard: {cache.get('requests', 0)} reads, "
        f"{cache.get('rebuilds', 0)} rebuilds"
    )
    events = [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in data.xrange("timeline")
    ]
    report = [e for e in events if labels.get(e["key"]) == "report"][:TIMELINE_LINES]
    lines.append(f"lock timeline of the beat job (key 'report', first {len(report)} events):")
    start = float(report[0]["t"]) if report else 0.0
    for e in report:
        what = {
            "acquired": f"acquired  by {e['id'][:8]}  fencing token {e.get('token', '')}",
            "skip": f"skipped   {e['id'][:8]}  (held by {e.get('holder', '')[:8]})",
            "released": f"released  by {e['id'][:8]}  (kept for lock_cooldown)",
        }.get(e["event"], f"{e['event']} {e['id'][:8]}")
        lines.append(f"  +{float(e['t']) - start:5.2f}s  {what}")
    data.close()
    return lines, max_inside


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the producer runs")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="redlock-demo-"))
    services: list[Service] = []
    with RedisServer(args=["--maxmemory-policy", "noeviction"]) as server:
        assert server.process is not None
        redis_pid = server.process.pid
        env = {
            **os.environ,
            "EXAMPLE_REDIS_URL": f"redis://127.0.0.1:{server.port}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        celery = ["-m", "celery", "-A", APP]
        try:
            for name in ("worker1", "worker2"):
                services.append(
                    Service(
                        name,
                        [
                            *celery,
                            "worker",
                            "-P",
                            "prefork",
                            "-c",
                            "2",
                            "-n",
                            f"{name}@%h",
                            "-l",
                            "INFO",
                            "--without-gossip",
                            "--without-mingle",
                            "--without-heartbeat",
                        ],
                        env,
                        logs,
                    )
                )
            services.append(
                Service(
                    "beat",
                    [
                        *celery,
                        "beat",
                        "-l",
                        "INFO",
                        "-s",
                        str(logs / "beat-schedule"),
                    ],
                    env,
                    logs,
                )
            )
            for service in services[:2]:
                service.wait_log(r"ready\.")
            services[2].wait_log(r"beat: Starting")
            print(f"demo: redis-server on port {server.port}, logs in {logs}", flush=True)
            producer = Service(
                "producer",
                [
                    "-m",
                    "example_project.producer",
                    "--seconds",
                    str(args.seconds),
                ],
                env,
                logs,
            )
            services.append(producer)
            wait_for("the producer", lambda: producer.process.poll() is not None, args.seconds + 60)
        finally:
            for service in reversed(services):  # producer and beat first: no new work
                service.terminate()
            for service in services:
                service.stop()
        # Only lock_cooldown keys may remain, for less than a second.
        with contextlib.suppress(SystemExit):
            wait_for("the last lock to expire", lambda: not package_keys(server), 5)
        left_keys = package_keys(server)
        counters = counter_hashes(server)
        lines, max_inside = summary(server, args.seconds)
        produced = re.findall(r"^producer: .*$", producer.text(), re.MULTILINE)
    started = {redis_pid, *(pid for service in services for pid in service.pids())}
    left_pids = sorted(pid for pid in started if alive(pid))
    print("\n".join([*lines, *produced]))
    print(
        f"left behind: {len(left_pids)} processes, {len(left_keys)} keys written by the package "
        f"(besides {counters} event-counter hashes, kept for `celery redlock stats`, and the "
        "fencing high-water marks)"
    )
    ok = bool(max_inside) and set(max_inside.values()) == {1} and not left_pids and not left_keys
    print("OK: no key ever ran twice at once; everything stopped" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
