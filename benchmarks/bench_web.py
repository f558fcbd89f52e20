"""``python -m benchmarks.bench_web``: the dashboard at scale, beside ``ls`` and a bare SCAN.

For 100,000 and 1,000,000 held locks on one redis-server, and 1,000,000 on a 3-primary Redis
Cluster (``support.servers.ClusterNodes``), in the same run:

* time to first page: ``GET /`` on a freshly started ``celery redlock web`` (its first request:
  connections, template compilation), then the median of warm page views;
* ``celery redlock ls --json``: time to its first byte of output and to its end;
* a bare ``SCAN`` with the page's pattern: one step (``COUNT`` as the page uses), and the whole
  walk;
* Redis commands per page view (``INFO commandstats`` of every node, before and after, less
  the ``INFO`` calls themselves);
* the page process's peak RSS (``VmHWM``) after the page views.

The locks are written with pipelined ``SET ... PX`` of owner tokens, the key layout of a held
lock; their holder host has no ``@`` (not a worker), so no page view waits for a control ping:
the figures are the inventory's own cost. (With workers, a page pings the holders once per
``LIVENESS_TTL``: one broker round trip when they all answer, ``--ping-timeout`` when one is
dead.)

Also the module of the app the measured processes load: ``-A benchmarks.bench_web``, with the
lock URL from ``REDLOCK_TEST_WEB_BENCH_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis as redis_py
from celery import Celery

from celery_redlock._redis.inventory import ROWS as STEP
from celery_redlock._redis.keys import digest, keys_for
from celery_redlock._redis.owner import new_token
from celery_redlock.testing import RedisServer, free_port, wait_until
from support.servers import ClusterNodes

ROOT = Path(__file__).resolve().parents[1]

app = Celery("bench_web", set_as_current=False)
app.conf.redlock_url = os.environ.get("REDLOCK_TEST_WEB_BENCH_URL", "redis://127.0.0.1:1/0")
# The ping's broker: a page view pings nobody here (no holder is a worker).
app.conf.broker_url = os.environ.get("REDLOCK_TEST_WEB_BENCH_BROKER", "memory://")

PAGE_VIEWS = 20


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def populate(clients: list[redis_py.Redis], route: Any, n: int) -> float:
    """``n`` held locks over 50 task names, pipelined per node. Seconds it took."""
    start = time.perf_counter()
    pipes = [c.pipeline(transaction=False) for c in clients]
    for i in range(n):
        key = keys_for("redlock", f"bench.t{i % 50:02d}:{digest(str(i).encode())}").lock
        pipe = pipes[route(key)]
        pipe.set(key, new_token(f"task-{i:08d}", "bench-host", 1000 + i % 7), px=3_600_000)
        if len(pipe) >= 10_000:
            pipe.execute()
    for pipe in pipes:
        pipe.execute()
    return time.perf_counter() - start


def commands(clients: list[redis_py.Redis]) -> int:
    total = 0
    for c in clients:
        stats = c.info("commandstats")
        total += sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    return total


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as reply:
        body = reply.read()
    return time.perf_counter() - start, body.count(b"<tr data-key=")


def measure_page(url: str, clients: list[redis_py.Redis]) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REDLOCK_TEST_WEB_BENCH_URL": url,
    }
    env = {k: v for k, v in env.items() if not k.startswith("REDLOCK_WEB_") or "BENCH" in k}
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_web", "redlock", "web"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], cwd=ROOT, env=env, stderr=subprocess.DEVNULL
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 60, "the dashboard to listen")
        ready_s = time.perf_counter() - started
        base = f"http://127.0.0.1:{port}/"
        before = commands(clients)
        first_s, rows = get(base)
        first_commands = commands(clients) - before
        before = commands(clients)
        warm = [get(base)[0] for _ in range(PAGE_VIEWS)]
        per_view = (commands(clients) - before) / PAGE_VIEWS
        filtered_s, filtered_rows = get(base + "?prefix=bench.t07:")
        return {
            "process_ready_s": ready_s,
            "first_page_s": first_s,
            "first_page_rows": rows,
            "first_page_commands": first_commands,
            "warm_page_median_s": statistics.median(warm),
            "commands_per_view": per_view,
            "filtered_page_s": filtered_s,
            "filtered_rows": filtered_rows,
            "page_process_peak_rss_mb": peak_rss_mb(proc.pid),
        }
    finally:
        proc.terminate()
        proc.wait(10)


def measure_ls(url: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_WEB_BENCH_URL": url}
    cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_web", "redlock", "ls", "--json"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.read(1)
    first_byte = time.perf_counter() - start
    size = 1 + len(proc.stdout.read())
    proc.wait()
    return {"first_byte_s": first_byte, "total_s": time.perf_counter() - start, "bytes": size}


def measure_scan(nodes: list[redis_py.Redis]) -> dict[str, Any]:
    pattern = "redlock:{*}*"
    start = time.perf_counter()
    nodes[0].scan(0, match=pattern, count=STEP)
    step = time.perf_counter() - start
    start = time.perf_counter()
    found = sum(1 for node in nodes for _ in node.scan_iter(match=pattern, count=STEP))
    return {"one_step_s": step, "walk_s": time.perf_counter() - start, "keys": found}


def one_setup(label: str, url: str, nodes: list[redis_py.Redis], route: Any, n: int) -> Any:
    for node in nodes:
        node.flushall()
    progress(f"{label}: writing {n} locks")
    populate_s = populate(nodes, route, n)
    memory = sum(int(c.info("memory")["used_memory"]) for c in nodes)
    progress(f"{label}: page")
    page = measure_page(url, nodes)
    progress(f"{label}: ls --json")
    ls = measure_ls(url)
    progress(f"{label}: bare SCAN")
    scan = measure_scan(nodes)
    for node in nodes:
        node.flushall()
    return {
        "locks": n,
        "populate_s": populate_s,
        "used_memory_mb": memory / 2**20,
        "page": page,
        "ls_json": ls,
        "bare_scan": scan,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=os.environ.get("REDLOCK_TEST_WEB_BENCH_SIZES", "100000,1000000"),
        help="held locks on one server, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--cluster",
        type=int,
        default=int(os.environ.get("REDLOCK_TEST_WEB_BENCH_CLUSTER", "1000000")),
        help="held locks on a 3-primary Cluster, 0 for none (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cluster_size = args.cluster
    out: dict[str, Any] = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "runs": [],
    }
    with RedisServer() as server:
        node = server.client()
        out["redis_server"] = node.info("server")["redis_version"]
        for n in sizes:
            out["runs"].append(
                {
                    "setup": "one server",
                    **one_setup("one server", server.url, [node], lambda k: 0, n),
                }
            )
    if cluster_size:
        with ClusterNodes() as cluster:
            rc = redis_py.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
            primaries = sorted(rc.get_primaries(), key=lambda p: p.name)
            nodes = [redis_py.Redis(host="127.0.0.1", port=int(p.port)) for p in primaries]
            index = {int(p.port): i for i, p in enumerate(primaries)}

            def route(key: str) -> int:
                owner = rc.get_node_from_key(key)
                return index[int(owner.port)]

            run = one_setup("cluster", cluster.url, nodes, route, cluster_size)
            out["runs"].append({"setup": "3-primary cluster", **run})
            rc.close()
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
