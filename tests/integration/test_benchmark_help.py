"""Every benchmark script answers ``--help`` and starts nothing: ``bench_web`` ignored it and
began writing a million locks (killed, it left the Cluster's redis-servers running)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT

#: ``python -m benchmarks`` (the whole run, benchmarks/bench.py) and each script of its own.
SCRIPTS = [
    "bench_asyncio",
    "bench_core",
    "bench_cpu",
    "bench_quorum",
    "bench_tracing",
    "bench_web",
    "takeover",
]


@pytest.mark.parametrize("script", ["", *SCRIPTS])
def test_a_benchmark_answers_help_and_runs_nothing(script: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}".rstrip("."), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout[:200]


def test_every_benchmark_script_is_listed() -> None:
    found = sorted(
        p.stem
        for p in (ROOT / "benchmarks").glob("*.py")
        if p.stem != "__main__" and 'if __name__ == "__main__":' in p.read_text()
    )
    assert found == sorted(SCRIPTS)
