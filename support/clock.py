"""A clock the test moves by hand, for the locks' injected ``clock``: expiry and lease arithmetic
without sleeping."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock the test moves by hand (``clock.now += 6``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
