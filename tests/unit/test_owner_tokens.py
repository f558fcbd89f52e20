"""Owner tokens: their secrets are never handed out twice, across threads and forks."""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from celery_redlock._redis import owner


def test_secrets_are_32_hex_characters_and_unique_across_threads() -> None:
    """Many more than one entropy block (256 secrets each), drawn by racing threads."""
    drawn: list[list[str]] = [[] for _ in range(8)]

    def draw(into: list[str]) -> None:
        for _ in range(1000):
            into.append(owner.new_secret())

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [secret for into in drawn for secret in into]
    assert len(set(every)) == len(every) == 8000
    assert all(len(secret) == 32 and int(secret, 16) >= 0 for secret in every)


def test_a_forked_child_never_hands_out_the_parents_unused_secrets() -> None:
    """The parent has most of a block left when it forks; the child must not use it."""
    owner.new_secret()  # a block is drawn, 255 secrets of it unused
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pid and 10 secrets, then exit at once
        try:
            os.close(read)
            line = f"{owner.current_pid()} {os.getpid()} " + " ".join(
                owner.new_secret() for _ in range(10)
            )
            os.write(write, line.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_cached_pid, child_pid, *child_secrets = pipe.read().split()
    os.waitpid(pid, 0)
    parent_secrets = [owner.new_secret() for _ in range(10)]
    assert child_cached_pid == child_pid == str(pid)
    assert owner.current_pid() == os.getpid()
    assert not set(child_secrets) & set(parent_secrets)
    assert owner.new_token("t").split("|")[1] == str(os.getpid())


def test_a_child_forked_while_a_secret_is_drawn_can_draw_its_own() -> None:
    """A fork while another thread holds the secrets' guard (here the forking thread itself,
    which makes it certain) leaves the child a guard of its own: its first secret used to
    wait forever on a copy held by a thread it does not have."""
    with owner._block_guard:
        pid = os.fork()
        if pid == 0:  # the child: SIGALRM ends it if the draw waits
            signal.alarm(10)
            try:
                os._exit(0 if len(owner.new_secret()) == 32 else 2)
            finally:
                os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    "value",
    [
        "abc|²|1796502400000|w@h|t",  # a digit str.isdigit() accepts and int() refuses
        "abc|1|1796502400000+³|w@h|t",
        "abc|1|99999999999999999999|w@h|t",  # past year 9999: no datetime shows it
        "abc|1|1796502400000+253402300800000|w@h|t",
        "abc|99999999999999999999|1796502400000|w@h|t",  # no pid_t holds it
        "abc|1|-5|w@h|t",
        "abc|1|1796502400000~|w@h|t",  # a renewed lease of no length
        "abc|1|1796502400000~0|w@h|t",
        "abc|1|1796502400000+9000~x|w@h|t",
        "abc|1|1796502400000~9000+9000|w@h|t",  # the cap after the lease: not this layout
    ],
)
def test_a_value_with_numbers_no_token_holds_is_foreign(value: str) -> None:
    """Such a value under the prefix (another program's) made ``celery redlock ls``, ``inspect``,
    ``release --dead`` and the dashboard fail for every lock instead of listing it as foreign."""
    assert owner.parse(value) is None


def test_the_largest_numbers_a_token_holds_are_read() -> None:
    latest = owner.MAX_MS
    parsed = owner.parse(f"abc|{owner.MAX_PID}|{latest}+{latest}|w@h|t")
    assert parsed is not None
    assert (parsed.pid, parsed.acquired_ms, parsed.max_hold_ms) == (owner.MAX_PID, latest, latest)


@pytest.mark.parametrize(
    ("max_hold_ms", "lease_ms", "field"),
    [
        (0, 0, r"\d+"),
        (9000, 0, r"\d+\+9000"),
        (0, 30000, r"\d+~30000"),
        (9000, 6000, r"\d+\+9000~6000"),
    ],
)
def test_a_token_records_its_cap_and_its_renewed_lease(
    max_hold_ms: int, lease_ms: int, field: str
) -> None:
    """A renewing holder's token records the lease it renews to, which ``celery redlock
    release --dead`` judges its TTL by (a deploy that changed ``redlock_lease`` had the
    command judge a draining worker's lock by the new lease, and release it)."""
    token = owner.new_token("t-1", host="w@h", pid=7, max_hold_ms=max_hold_ms, lease_ms=lease_ms)
    assert re.fullmatch(rf"[0-9a-f]{{32}}\|7\|{field}\|w@h\|t-1", token), token
    parsed = owner.parse(token)
    assert parsed is not None and parsed.task_id == "t-1"
    assert parsed.max_hold_ms == (max_hold_ms or None)
    assert parsed.lease_ms == (lease_ms or None)
