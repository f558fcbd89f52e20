"""The unit tier refuses to start processes (``tests/unit/conftest.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_starting_a_process_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="a unit test started a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
