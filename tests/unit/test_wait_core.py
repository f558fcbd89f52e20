"""The blocking wait's decisions, without Redis: :meth:`LockCore._wait` is a generator of I/O
requests (:class:`~celery_redlock._redis.core.Op`), driven here by hand as each lock's
``do_wait`` drives it, with a clock the test moves."""

from __future__ import annotations

from typing import Any

import pytest
import redis as redis_py

from celery_redlock._redis.core import SUBSCRIBED, Closing, Extended, LockCore, Op, Run, Steps
from celery_redlock._redis.owner import SEPARATOR, new_token, parse
from celery_redlock._redis.scripts import WaitReply
from celery_redlock.exceptions import LockUnavailable
from support.clock import FakeClock


class Node:
    names = ("fake:1",)

    def __init__(self, queues: bool, releases_node_by_node: bool = False) -> None:
        self.queued = queues
        self.releases_node_by_node = releases_node_by_node

    def queues(self, keys: Any) -> bool:
        return self.queued


class Core(LockCore):
    """A core whose nodes are a stand-in that does no I/O."""

    def _connect(self, redis: Any) -> Any:
        return redis

    def _stop_renewal(self) -> None:
        pass


class Driver:
    """Drives a wait one request at a time, as the locks' ``do_wait`` do (:class:`Run`)."""

    def __init__(self, steps: Steps[bool]) -> None:
        self.steps = steps
        self.run = Run(steps)
        self.requests = iter(self.run)
        self.secret = ""

    def next(self, reply: Any = None, error: BaseException | None = None) -> tuple[Any, Any]:
        """The next request after ``reply`` (or ``error``); ``(None, result)`` at the end."""
        self.run.reply, self.run.error = reply, error
        try:
            return next(self.requests)
        except StopIteration:
            return None, self.run.result


def queued_lock(clock: FakeClock) -> tuple[Core, Driver]:
    """A lock whose wait is queued behind a holder: its first queued try found it held."""
    core = Core(Node(queues=True), "job", ttl=10, clock=clock)
    driver = Driver(core._wait(timeout=5))
    assert driver.next() == (Op.ATTEMPT, None)
    op, channel = driver.next(False)
    assert op is Op.SUBSCRIBE and channel.startswith("redlock:{job}")
    assert driver.next()[0] is Op.RECEIVE  # the try waits for the confirmation
    op, (_, ttl_ms, _, driver.secret) = driver.next(SUBSCRIBED)
    assert op is Op.QUEUED and ttl_ms == 10_000
    assert driver.next(WaitReply(None, holder="other", pttl_ms=3000)) == (Op.HOLDER_TTL, None)
    return core, driver


def past_deadline(driver: Driver) -> tuple[str, str]:
    """The receive timed out past the deadline: the waiter tries once more, then leaves."""
    assert driver.next(None)[0] is Op.QUEUED  # it tries once more,
    assert driver.next(WaitReply(None, holder="other", pttl_ms=1000))[0] is Op.HOLDER_TTL
    op, arg = driver.next(1.0)
    assert op is Op.LEAVE  # then leaves the queue
    return arg  # type: ignore[no-any-return]


def test_a_waiter_whose_deadline_passes_after_the_handoff_leaves_holding_the_lock() -> None:
    """1. W is queued; 2. a release hands W the lock; 3. W's deadline passes before it reads
    the message; 4. W leaves, learns that it holds the lock, and returns True."""
    clock = FakeClock()
    core, driver = queued_lock(clock)
    assert driver.next(3.0) == (Op.RECEIVE, 3.0)  # the holder's TTL, within the deadline
    clock.now += 5
    member, secret = past_deadline(driver)
    assert member.startswith("10000:")  # the lease, then the channel
    handed = f"{secret}{SEPARATOR}handed"
    assert driver.next(handed) == (Op.FENCE, handed)  # taken without a fencing token
    # It left the queue: the connection serves again.
    assert driver.next() == (Op.CLOSE, Closing.REUSE)
    assert driver.next() == (None, True)
    assert core.token == handed and core.held  # its lease counts from its last try


def test_a_waiter_whose_deadline_passes_leaves_the_queue_empty_handed() -> None:
    clock = FakeClock()
    core, driver = queued_lock(clock)
    driver.next(3.0)
    clock.now += 5
    past_deadline(driver)
    assert driver.next(None) == (Op.CLOSE, Closing.REUSE)
    assert driver.next() == (None, False)
    assert not core.held


def test_a_waiter_whose_leave_gets_no_reply_strands_its_subscription() -> None:
    """Past its deadline, the leave finds Redis not answering: the waiter raises, and its
    subscription is stranded (it may still be queued: its channel must lose its subscriber)."""
    clock = FakeClock()
    core, driver = queued_lock(clock)
    driver.next(3.0)
    clock.now += 5
    past_deadline(driver)
    stalled = LockUnavailable("the lock Redis did not answer")
    assert driver.next(error=stalled) == (Op.CLOSE, Closing.STRANDED)
    with pytest.raises(LockUnavailable):
        driver.next()
    assert not core.held


def test_a_lock_handed_over_more_than_half_a_lease_ago_is_extended_first() -> None:
    clock = FakeClock()
    core, driver = queued_lock(clock)
    assert driver.next(3.0)[0] is Op.RECEIVE
    clock.now += 6  # the message is read more than half the 10 s lease after the last try
    handed = f"{driver.secret}{SEPARATOR}handed"
    assert driver.next(handed) == (Op.EXTEND, (handed, 10.0))
    assert driver.next(Extended(True, True)) == (Op.FENCE, handed)
    assert driver.next() == (Op.CLOSE, Closing.REUSE)
    assert driver.next() == (None, True) and core.held


def test_a_message_for_another_waiter_hands_nothing_over() -> None:
    core, driver = queued_lock(FakeClock())
    assert driver.next(3.0)[0] is Op.RECEIVE
    assert driver.next(f"someone-else{SEPARATOR}x")[0] is Op.QUEUED  # it just tries again
    assert not core.held


class SoftTimeLimit(Exception):
    """An ordinary exception raised by a signal handler, as Celery's soft time limit is."""


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, SoftTimeLimit])
def test_an_interrupted_waiter_abandons_its_place_and_closes_its_subscription(
    interrupt: type[BaseException],
) -> None:
    core, driver = queued_lock(FakeClock())
    assert driver.next(3.0)[0] is Op.RECEIVE
    op, arg = driver.next(error=interrupt())
    assert op is Op.ABANDON and len(arg) == 2
    assert driver.next() == (Op.CLOSE, Closing.CLOSE)
    with pytest.raises(interrupt):
        driver.next()
    assert not core.held


def test_a_broken_subscription_leaves_quietly_and_waits_anew() -> None:
    core, driver = queued_lock(FakeClock())
    assert driver.next(3.0)[0] is Op.RECEIVE
    lost = redis_py.exceptions.ConnectionError("Connection closed by server.")
    assert driver.next(error=lost)[0] is Op.LEAVE
    # Leaving failed too (quietly False): its entry may be left queued.
    assert driver.next(error=lost) == (Op.CLOSE, Closing.STRANDED)
    assert driver.next() == (Op.ATTEMPT, None)  # tries again, then subscribes again
    assert driver.next(False)[0] is Op.SUBSCRIBE
    assert not core.held


def test_a_bug_in_the_driver_is_not_taken_for_a_broken_subscription() -> None:
    _, driver = queued_lock(FakeClock())
    assert driver.next(3.0)[0] is Op.RECEIVE
    assert driver.next(error=KeyError("bug"))[0] is Op.ABANDON  # not LEAVE, to wait anew
    assert driver.next() == (Op.CLOSE, Closing.CLOSE)
    with pytest.raises(KeyError):  # raised as it is
        driver.next()


def test_without_a_queue_each_notification_brings_a_plain_attempt() -> None:
    core = Core(Node(queues=False), "job", ttl=10, clock=FakeClock())
    driver = Driver(core._wait(timeout=None))
    assert driver.next() == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.SUBSCRIBE, "redlock:{job}:released")
    assert driver.next() == (Op.RECEIVE, 1.0)  # until confirmed
    assert driver.next(SUBSCRIBED) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(None) == (Op.RECEIVE, 1.0)  # a key without expiry: look again in 1 s
    assert driver.next(b"1") == (Op.ATTEMPT, None)
    assert driver.next(True) == (Op.CLOSE, Closing.CLOSE)
    assert driver.next() == (None, True)


def test_a_quorum_waiter_that_a_wake_finds_the_same_holder_tries_again_soon() -> None:
    """A quorum's release reaches the nodes one by one: a waiter woken by the first that finds
    the releasing holder still there tries again after 10 ms, the delay doubling while it finds
    that holder, up to the holder's TTL; a new holder, or no wake, and it sleeps on the TTL."""
    core = Core(Node(queues=False, releases_node_by_node=True), "job", ttl=10, clock=FakeClock())
    first, second = parse(new_token("a")), parse(new_token("b"))
    driver = Driver(core._wait(timeout=None))
    assert driver.next() == (Op.ATTEMPT, None)
    core.last_holder = first
    assert driver.next(False)[0] is Op.SUBSCRIBE
    assert driver.next() == (Op.RECEIVE, 1.0)
    assert driver.next(SUBSCRIBED) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(30.0) == (Op.RECEIVE, 30.0)  # the same holder, no wake: its TTL
    assert driver.next(b"1") == (Op.ATTEMPT, None)  # woken
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(29.0) == (Op.RECEIVE, 0.01)  # the releasing holder is still there
    for delay in (0.02, 0.04, 0.08):  # no message: it goes on trying while it is there
        assert driver.next(None) == (Op.ATTEMPT, None)
        assert driver.next(False) == (Op.HOLDER_TTL, None)
        assert driver.next(29.0) == (Op.RECEIVE, delay)
    assert driver.next(None) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(0.1) == (Op.RECEIVE, 0.1)  # never past the holder's TTL
    assert driver.next(None) == (Op.ATTEMPT, None)
    core.last_holder = second  # another waiter won: its TTL
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(30.0) == (Op.RECEIVE, 30.0)
    assert driver.next(b"1") == (Op.ATTEMPT, None)
    assert driver.next(True) == (Op.CLOSE, Closing.CLOSE)
    assert driver.next() == (None, True)


def test_a_quorum_try_that_finds_the_holder_on_fewer_nodes_tries_again_soon() -> None:
    """The release under way frees node 0 and publishes there before the waiter's subscription
    took effect: no message comes. Its try once subscribed finds the holder on fewer nodes
    than its try before, which found it on every node: it tries again soon, as when woken. A
    holder that never held every node (it lacks one) is slept on."""
    core = Core(Node(queues=False, releases_node_by_node=True), "job", ttl=10, clock=FakeClock())
    core.last_holder = parse(new_token("a"))
    driver = Driver(core._wait(timeout=None))
    assert driver.next() == (Op.ATTEMPT, None)
    core._whole = True  # the first try found the holder on every node
    assert driver.next(False)[0] is Op.SUBSCRIBE
    assert driver.next() == (Op.RECEIVE, 1.0)
    assert driver.next(SUBSCRIBED) == (Op.ATTEMPT, None)
    core._whole = False  # this one found node 0 free
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(29.0) == (Op.RECEIVE, 0.01)
    assert driver.next(None) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(29.0) == (Op.RECEIVE, 0.02)

    lacking = Core(Node(queues=False, releases_node_by_node=True), "job", ttl=10, clock=FakeClock())
    lacking.last_holder = parse(new_token("a"))
    driver = Driver(lacking._wait(timeout=None))
    assert driver.next() == (Op.ATTEMPT, None)
    assert driver.next(False)[0] is Op.SUBSCRIBE  # its try found the holder lacking node 0
    assert driver.next() == (Op.RECEIVE, 1.0)
    assert driver.next(SUBSCRIBED) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(29.0) == (Op.RECEIVE, 29.0)


def test_a_single_node_waiter_woken_by_a_shortening_extend_sleeps_on_the_new_ttl() -> None:
    """A single node frees the lock in one script: a wake that finds the same holder came from
    an extend that shortened its TTL, and the waiter sleeps on that TTL, with no extra tries."""
    core = Core(Node(queues=False), "job", ttl=10, clock=FakeClock())
    core.last_holder = parse(new_token("a"))
    driver = Driver(core._wait(timeout=None))
    assert driver.next() == (Op.ATTEMPT, None)
    assert driver.next(False)[0] is Op.SUBSCRIBE
    assert driver.next() == (Op.RECEIVE, 1.0)
    assert driver.next(SUBSCRIBED) == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(30.0) == (Op.RECEIVE, 30.0)
    assert driver.next(b"1") == (Op.ATTEMPT, None)
    assert driver.next(False) == (Op.HOLDER_TTL, None)
    assert driver.next(0.3) == (Op.RECEIVE, 0.3)


def test_a_wait_its_driver_drops_asks_for_nothing_more() -> None:
    """A driver unwound outside a request (its generator closed) leaves no request behind."""
    _, driver = queued_lock(FakeClock())
    assert driver.next(3.0)[0] is Op.RECEIVE
    driver.steps.close()  # no "generator ignored GeneratorExit"
    with pytest.raises(StopIteration):
        driver.steps.send(None)
