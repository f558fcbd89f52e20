"""``make demo`` (``python -m example_project.demo``), shortened: its summary, and nothing left.

Every process the demo starts inherits a marker variable from this test's environment; after
the demo exits, no process on the machine may still carry it, and no redis-server may still
serve the demo's port.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support import ROOT

pytestmark = pytest.mark.slow

MARKER = "REDLOCK_TEST_DEMO_RUN"


def carrying(marker: bytes) -> list[int]:
    """PIDs of the processes whose environment holds ``marker`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def redis_servers_on(port: int) -> list[int]:
    """PIDs of redis-servers listening on ``port`` (their process title names the address;
    Redis rewrites its title over the environment, so the marker cannot find them)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if entry.name.isdigit() and re.search(rb"redis-server .*:%d\b" % port, cmdline):
                found.append(int(entry.name))
    return found


def test_demo_summary_and_nothing_left_behind() -> None:
    marker = f"{MARKER}={uuid.uuid4().hex}"
    env = {**os.environ, MARKER: marker.partition("=")[2]}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "example_project.demo", "--seconds", "6"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        survivors = carrying(marker.encode())
    finally:
        for pid in carrying(marker.encode()):  # only after a failure: ours, by their id
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert survivors == []
    port = re.search(r"redis-server on port (\d+)", out)
    assert port is not None, out
    assert redis_servers_on(int(port.group(1))) == []

    counts = {
        task: (int(runs), int(skips))
        for task, runs, skips in re.findall(
            r"^  (\w+) +runs +(\d+) +skipped +(\d+)$", out, re.MULTILINE
        )
    }
    report_runs, report_skips = counts["refresh_report"]
    assert report_runs >= 1 and report_skips >= 1  # a 3 s run every 1 s: ticks were skipped
    account_runs, account_skips = counts["sync_account"]
    assert account_runs >= 1 and account_skips >= 1

    concurrency = re.search(
        r"^maximum concurrent executions per key \(must be 1\): (.*)$", out, re.MULTILINE
    )
    assert concurrency is not None, out
    per_key = dict(item.split("=") for item in concurrency.group(1).split(", "))
    assert set(per_key) == {"report", "account:1", "account:2", "account:3"}
    assert set(per_key.values()) == {"1"}

    timeline = out.partition("lock timeline of the beat job")[2]
    for event in ("acquired", "skipped", "released"):
        assert re.search(rf"^  \+ *\d+\.\d\ds  {event} ", timeline, re.MULTILINE), out
    rebuilds = re.search(r"cache stampede guard: (\d+) reads, (\d+) rebuilds", out)
    assert rebuilds is not None and 0 < int(rebuilds.group(2)) < int(rebuilds.group(1))
    assert "left behind: 0 processes, 0 keys written by the package" in out
    assert "OK:" in out
