"""Fencing tokens across a step back of a real Redis server's clock (libfaketime).

Each server runs under libfaketime (:class:`chaos.clock.SteppedClockServer`); the test reads
tokens, steps the server clock back one hour while it runs, checks the server's ``TIME`` did
go back, and reads more tokens. Before the high-water mark the tokens after the step were
3.6·10⁹ (one hour in µs) smaller than those before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator

import pytest
import redis as redis_py

from celery_redlock import Lock
from celery_redlock.asyncio import Lock as AsyncLock
from chaos.clock import SteppedClockServer, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

HOUR = 3600.0


@pytest.fixture
def server() -> Iterator[SteppedClockServer]:
    with SteppedClockServer() as s:
        yield s


def step_back(servers: list[SteppedClockServer]) -> None:
    """Step every server's clock back one hour, and check that its ``TIME`` followed."""
    before = [s.server_time() for s in servers]
    for s in servers:
        s.step(-HOUR)
    for s, was in zip(servers, before, strict=True):
        assert s.server_time() < was - HOUR + 60


def tokens_of(target: object, n: int, limit: int = 1) -> list[int]:
    """``n`` successive holders of one name, each reading its token."""
    out = []
    for i in range(n):
        lock = Lock(target, "fenced", ttl=10, owner=f"task-{i}", limit=limit)  # type: ignore[arg-type]
        assert lock.acquire(blocking=False)
        token = lock.fencing_token
        assert token is not None
        out.append(token)
        lock.release()
    return out


def strictly_increasing(tokens: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(tokens))


@pytest.mark.parametrize("limit", [1, 3], ids=["lock", "semaphore"])
def test_tokens_strictly_increase_across_a_one_hour_step_back(
    server: SteppedClockServer, limit: int
) -> None:
    r = server.client()
    before = tokens_of(r, 10, limit)
    step_back([server])
    after = tokens_of(r, 10, limit)
    assert strictly_increasing(before + after), (before[-1], after[0])


def test_asyncio_tokens_strictly_increase_across_a_one_hour_step_back(
    server: SteppedClockServer,
) -> None:
    async def tokens(n: int) -> list[int]:
        out = []
        for i in range(n):
            async with AsyncLock(server.url, "fenced", ttl=10, owner=f"task-{i}") as lock:
                assert lock.fencing_token is not None
                out.append(lock.fencing_token)
        return out

    before = asyncio.run(tokens(10))
    step_back([server])
    after = asyncio.run(tokens(10))
    assert strictly_increasing(before + after), (before[-1], after[0])


def test_quorum_tokens_increase_across_a_step_back_and_a_node_restarting_empty() -> None:
    """Three nodes, clocks stepped back one hour, then each node in turn restarts empty: the
    token is the largest of a majority, and every acquisition left its token on a majority
    (the write-back), so a majority of any later acquisition still holds one of them."""
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(SteppedClockServer()) for _ in range(3)]
        clients = [n.client() for n in nodes]
        tokens = tokens_of(clients, 5)
        step_back(nodes)
        tokens += tokens_of(clients, 5)
        for node in nodes:
            node.restart(keep_data=False)
            node.step(-HOUR)
            tokens += tokens_of(clients, 5)
        assert strictly_increasing(tokens), tokens


@pytest.mark.parametrize("nodes", [1, 3], ids=["semaphore", "quorum"])
def test_tokens_increase_after_the_clock_ran_ahead_long_enough_to_expire_the_counter(
    nodes: int,
) -> None:
    """The per-name counter lives 24 h (server time): (1) the clock runs 25 h ahead and tokens
    are handed out; (2) it runs 50 h ahead, the counter expires; (3) it is set right. Tokens
    after (3) come from the clock and are smaller than those of (1), unless the high-water
    mark (no TTL) remembers them."""
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(SteppedClockServer()) for _ in range(nodes)]
        target: object = servers[0].client() if nodes == 1 else [s.client() for s in servers]
        for s in servers:
            s.step(25 * HOUR)
        ahead = tokens_of(target, 5, limit=2 if nodes == 1 else 1)
        for s in servers:
            s.step(50 * HOUR)
            assert s.client().get("redlock:{fenced}:fence") is None  # expired (and deleted)
            s.step(0)
        after = tokens_of(target, 5, limit=2 if nodes == 1 else 1)
        assert strictly_increasing(ahead + after), (ahead[-1], after[0])


def test_a_client_of_a_server_that_answers_nothing_gives_up_after_its_timeout(
    server: SteppedClockServer,
) -> None:
    """Helper probe, round 4: the slow-link probe's "1 s timeout" ``PING`` to a node that
    answered nothing gave up after about 15 s (redis-py's default retries)."""
    client = server.client(timeout=0.5)
    client.ping()  # connected before the pause: the PING alone is timed
    server.pause()
    try:
        began = time.monotonic()
        with pytest.raises(redis_py.TimeoutError):
            client.ping()
        assert time.monotonic() - began < 1.5
    finally:
        server.resume()
        client.close()
