"""The fault harness (chaos.faults) end to end: one short fault on real namespaces, checked by
its own history checker, and nothing of the network left afterwards. The run of every fault is
``make test-faults`` (in ``.ci/run``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.clock import missing

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or missing() is not None,
    reason="needs root (network namespaces) and libfaketime with a libc-malloc redis-server",
)


def test_a_clock_step_back_and_a_worker_cut_from_the_majority_keep_every_guarantee(
    tmp_path: Path,
) -> None:
    """A lock server's clock stepped back one hour under load: tokens keep increasing. A worker
    cut off from 3 of 5 quorum nodes: its holders stop by their own clock before the majority
    lets their keys expire, so no other holder overlaps them."""
    out = tmp_path / "rows.json"
    only = ("--only", "clock-back", "--only", "partition-worker-from-majority")
    args = (*only, "--seconds", "5", "--json", str(out))
    done = subprocess.run(
        [sys.executable, "-m", "chaos.faults", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    clock, partition = json.loads(out.read_text())
    assert (clock["fault"], partition["fault"]) == ("clock-back", "partition-worker-from-majority")
    for row in (clock, partition):
        assert row["ok"] and row["overlaps_explained"] == {}
        assert row["token_inversions"] == 0 and row["stale_writes_accepted"] == 0
        assert row["writes_accepted"] > 0 and row["lost_calls"] == 0 and row["leftover_keys"] == 0
    assert [n["action"] for n in clock["schedule"]][:1] == ["clock step"]
    assert [n["action"] for n in partition["schedule"]][:1] == ["partition"]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, check=True)
    assert b"rlf-" not in namespaces.stdout
    links = subprocess.run(["ip", "link", "show"], capture_output=True, check=True)
    assert b"rlf0" not in links.stdout
