"""Two prefork workers contend for one key; print that runs never overlapped.

Run with ``make demo`` (or ``python example_project/demo.py``). It starts its own
``redis-server`` on a free loopback port and two ``celery worker`` processes, submits duplicate
``sync_account(42)`` calls, prints a summary, then stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_redlock.testing import RedisServer  # noqa: E402


def start_worker(name: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "celery", "-A", "example_project.tasks", "worker",
        "-P", "prefork", "-c", "2", "-n", f"{name}@%h", "-l", "INFO", "--logfile", str(log),
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and re.search(r"ready\.", log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker did not start; see {log}")
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200, help="duplicate calls to submit")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="redlock-demo-"))
    with RedisServer(args=["--maxmemory-policy", "noeviction"]) as server:
        base = f"redis://127.0.0.1:{server.port}"
        env = {**os.environ, "DEMO_REDIS_URL": base,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        os.environ["DEMO_REDIS_URL"] = base
        from example_project.tasks import app, records, sync_account

        workers = [(start_worker(n, env, logs / f"{n}.log"), logs / f"{n}.log")
                   for n in ("w1", "w2")]
        try:
            for proc, log in workers:
                wait_ready(proc, log)
            print(f"redis-server on port {server.port}; 2 prefork workers x 2 processes")
            started = time.monotonic()
            results = [sync_account.delay(42) for _ in range(args.calls)]
            values = [res.get(timeout=120) for res in results]
            elapsed = time.monotonic() - started
        finally:
            for proc, _ in workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc, _ in workers:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        runs = sum(v is not None for v in values)
        max_inside = int(records.zscore("max_inside", 42) or 0)
        left = [k for k in server.client().scan_iter(match="redlock:{*}")
                if not k.endswith(b":fence")]
        timeline = [t.decode() for t in records.lrange("timeline", 0, 5)]
        app.close()
    print(f"calls: {len(values)}  ran: {runs}  skipped: {len(values) - runs}  "
          f"in {elapsed:.1f}s")
    print(f"maximum concurrent executions for account 42: {max_inside}")
    print("timeline (first entries): " + ", ".join(timeline))
    print(f"lock keys left behind: {len(left)}")
    ok = max_inside == 1 and not left and runs > 0
    print("OK: runs never overlapped" if ok else "FAILED: overlap or leftover lock")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
