"""``python -m example_project.stampede``: 50 concurrent requests, one rebuild, 49 from cache."""

from __future__ import annotations

import re
import subprocess
import sys

from support import ROOT


def test_one_request_rebuilds_the_others_are_served_from_the_cache(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "example_project.stampede", "--redis-url", redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = dict(re.findall(r"^([a-z ]+): (\S+)", done.stdout, re.MULTILINE))
    assert summary["requests"] == "50"
    assert summary["rebuilds"] == "1"
    assert summary["served from cache"] == "49"
