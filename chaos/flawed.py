"""Four flawed Redis lock patterns and the plain correct one, under the torture run's chaos.

Run from the repository root::

    python -m chaos.flawed                  # about 3 minutes; prints the table
    python -m chaos.flawed --seconds 30     # shorter; --json F writes every figure

It runs :mod:`chaos.torture` once, with every pattern below and celery-redlock side by
side: the same workers, the same task mix, the same chaos (child and worker SIGKILLs, revokes,
hard time limits), each pattern on its own keys, and prints each one's violations. Each
pattern gets 2 keys (``--keys``), not the torture run's 8: six patterns share the workers, and
a failure mode needs a second caller of the same key at the wrong moment. This module is also
imported by the workers (:mod:`chaos.torture_app`) for the patterns themselves; it never
runs in the package.

The patterns, and the chaos that makes each one fail:

``setnx_expire``  (a) ``SETNX key token``, then ``PEXPIRE key ttl``: a process killed between
                  the two leaves a key without TTL, held forever. The chaos aims SIGKILLs at
                  that window (tasks announce it; it lasts a few tens of ms). Shows up as
                  *locks left* and *lost* tasks (every later call of the key gives up).
``getset``        (b) the value is the holder's expiry time on the client's clock; a caller
                  that finds it in the past takes over with ``GETSET`` (the recipe of the old
                  ``SETNX`` documentation). Each worker's clock is skewed (0, +1.2, -0.6 s): a
                  fast clock takes over locks that are still held. Shows up as *overlaps*.
``del_no_check``  (c) ``SET NX PX``, release with a plain ``DEL``. A slow holder that outlived
                  its TTL deletes its successor's lock, and a third caller enters beside the
                  successor. Shows up as overlaps whose earlier holder was *within* its TTL.
``get_then_del``  (d) ``SET NX PX``, release with ``GET`` (is it mine?) then ``DEL``. A pause
                  between the two (300 ms here, a GC pause or a slow network in life) lets the
                  key expire and change owner; the ``DEL`` then removes the new owner's lock.
``plain``         ``SET NX PX`` and a Lua compare-and-delete: correct, but with a fixed TTL and
                  no renewal, so a holder running longer than the TTL overlaps its successor
                  (the overlaps all have an earlier holder that had *outlived* its TTL).
``ours``          celery-redlock's ``LockedTask`` with a renewed lease, parent-side release of
                  dead children and the hard time limit cap.

Every flawed pattern uses the same TTL as our lease, and a naive fencing counter (``INCR``
after acquiring, a second command). Contention is handled by polling every 50 ms for up to 2 s,
then retrying the task after 0.5-1 s (at most 15 times: a call that never gets its lock is
*lost*). Workers run ``-c 4``: most pool children are waiting for a lock at any time.

Reading the table: *overlaps* counts pairs of executions inside the same key at once. Every
fixed-TTL pattern overlaps when a holder outlives its TTL (the mix has tasks of 1.2-2 TTLs);
*of which holder within its TTL* counts the overlaps that no TTL explains: the signature of
(b), (c) and (d). Fencing tokens still increase in entry order for every pattern (each holder
takes its token right after acquiring): a fencing store would reject the stale writes, but the
overlaps happen all the same.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

#: Compare-and-delete, the correct release (also what our package does, in one script).
CAD = """
-- KEYS[1] the lock, ARGV[1] the owner token; returns 1 deleted, 0 not the owner
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Context:
    """What a pattern may use besides Redis: kill windows, a (skewed) clock, the TTL."""

    window: Callable[..., None]
    clock: Callable[[], float]
    ttl: float


def lock_key(pattern: str, key: str) -> str:
    return f"flawed:{pattern}:{key}"


def _cad(client: redis.Redis, key: str, token: str) -> bool:
    return bool(client.eval(CAD, 1, key, token))


class Pattern:
    """One lock recipe: ``acquire`` (non-blocking), ``release``, and what counts as held."""

    name = ""
    label = ""

    def acquire(self, r: redis.Redis, key: str, token: str, ctx: Context) -> bool:
        return bool(r.set(key, token, nx=True, px=int(ctx.ttl * 1000)))

    def release(self, r: redis.Redis, key: str, token: str, ctx: Context) -> None:
        _cad(r, key, token)

    def still_held(self, r: redis.Redis, key: str, now: float) -> bool:
        """Whether ``key`` would still stop a caller at ``now`` (after every TTL ran out)."""
        return bool(r.exists(key))


class SetnxExpire(Pattern):
    name, label = "setnx_expire", "(a) SETNX then EXPIRE"

    def acquire(self, r: redis.Redis, key: str, token: str, ctx: Context) -> bool:
        if not r.setnx(key, token):
            return False
        ctx.window("step:setnx-expire")  # a crash here leaves a key without TTL
        r.pexpire(key, int(ctx.ttl * 1000))
        return True


class GetsetTimestamp(Pattern):
    name, label = "getset", "(b) timestamp + GETSET"

    def acquire(self, r: redis.Redis, key: str, token: str, ctx: Context) -> bool:
        expires = ctx.clock() + ctx.ttl
        if r.setnx(key, f"{expires:.6f}"):
            return True
        current = r.get(key)
        if current is None or float(current) >= ctx.clock():
            return False  # held, and not expired by this client's clock
        old = r.getset(key, f"{ctx.clock() + ctx.ttl:.6f}")
        return old is None or float(old) < ctx.clock()

    def release(self, r: redis.Redis, key: str, token: str, ctx: Context) -> None:
        value = r.get(key)
        if value is not None and float(value) > ctx.clock():  # "only if not expired yet"
            r.delete(key)

    def still_held(self, r: redis.Redis, key: str, now: float) -> bool:
        value = r.get(key)
        return value is not None and float(value) > now


class DelNoOwnerCheck(Pattern):
    name, label = "del_no_check", "(c) DEL without owner check"

    def release(self, r: redis.Redis, key: str, token: str, ctx: Context) -> None:
        r.delete(key)


class GetThenDel(Pattern):
    name, label = "get_then_del", "(d) GET then DEL"

    def release(self, r: redis.Redis, key: str, token: str, ctx: Context) -> None:
        if r.get(key) == token.encode():
            ctx.window("pause:get-del", 0.3)  # a pause between the check and the delete
            r.delete(key)


class Plain(Pattern):
    name, label = "plain", "plain SET NX PX + Lua CAD"


PATTERNS: dict[str, Pattern] = {
    p.name: p for p in (Plain(), SetnxExpire(), GetsetTimestamp(), DelNoOwnerCheck(), GetThenDel())
}
LABELS = {"ours": "celery-redlock (ours)", **{p.name: p.label for p in PATTERNS.values()}}
ORDER = ["ours", "plain", "setnx_expire", "getset", "del_no_check", "get_then_del"]


# -- the comparison ------------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    """The violation counts per pattern, as a Markdown table."""
    rows = [
        "| pattern | tasks | overlaps | of which holder within its TTL | token inversions "
        "| lost | locks left |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ORDER:
        stats = result["patterns"].get(name)
        if stats is None:
            continue
        within = "n/a (renewed)" if name == "ours" else stats["overlaps_within_ttl"]
        rows.append(
            f"| {LABELS[name]} | {stats['tasks']} | {stats['overlaps']} | {within} | "
            f"{stats['inversions']} | {stats['lost']} | {stats['locks_left']} |"
        )
    broker = sum(s["broker_lost"] for s in result["patterns"].values())
    if broker:
        rows.append(
            f"\n({broker} task(s) never reached a worker: lost by the broker transport "
            "when a worker was SIGKILLed, counted in no row)"
        )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.flawed", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="chaos phase (default 120)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--keys", type=int, default=2, help="keys per pattern (default 2)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="pool children per worker (default 4: most of them wait for a lock)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", metavar="F", help="write every figure as JSON to F")
    p.add_argument("-v", "--verbose", action="store_true", help="print each violation")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from chaos import torture  # not at the top: torture (and every worker) imports this module

    args = parse_args(argv)
    config = torture.Config(
        seconds=args.seconds,
        workers=args.workers,
        concurrency=args.concurrency,
        keys=args.keys,
        patterns=tuple(ORDER),
        seed=args.seed,
        json_path=args.json,
        verbose=args.verbose,
        mix=torture.COMPARISON_MIX,
        skews=(0.0, 1.2, -0.6),
        keep_logs=True,
    )
    result = torture.run(config)
    print()
    print(table(result))
    ours = result["patterns"]["ours"]
    ok = not any(ours[k] for k in ("overlaps", "inversions", "lost", "locks_left"))
    print(f"\nours: {'no violation' if ok else 'VIOLATIONS'}; summary: {result['summary']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
