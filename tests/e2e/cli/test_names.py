"""``celery redlock`` with names that broke it (issue 14, rows 2, 3 and 15), on real workers.

A worker named ``w|x@host`` (the token's separator in its name) must be pinged under that name
and never called dead while it answers; a lock name with control characters must stay one
escaped row; a malformed URL must never show its password.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.owner import new_token
from celery_redlock.testing import RedisServer
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import HOLD, HOST, cli, started

pytestmark = pytest.mark.slow


def test_a_worker_named_with_a_pipe_is_alive_and_its_lock_is_kept(
    server: RedisServer, client: Celery, records: redis_py.Redis
) -> None:
    locks = redis_py.Redis(port=server.port)
    url = f"redis://127.0.0.1:{server.port}/0"
    node = f"w|x@{HOST}"
    with WorkerProcess(server.port, "w|x", app="tests.e2e.tooling_app", args=["-Q", "pipe"]):
        result = client.send_task(HOLD, args=("pipe",), queue="pipe")
        child = started(records, "pipe")["pid"]  # a pool child, which stays in the pool
        listed = json.loads(cli(server.port, "ls", "--json").stdout)
        records.rpush("go:pipe", 1)
        assert result.get(timeout=10) == "pipe"
        (task_lock,) = [i for i in listed if i["task_id"] == result.id]
        assert task_lock["host"] == node  # the worker's real name, as it answers to it

        # A lock stored the same way (held here, so that it outlives the CLI calls), as that
        # child's: a pid none of the worker's processes has is a dead holder's.
        held = Lock(url, f"pipe-{secrets.token_hex(4)}", ttl=60, owner="t-1", host=node)
        assert held.acquire(blocking=False)
        secret, _pid, rest = locks.get(held.key).decode().split("|", 2)
        assert locks.set(held.key, f"{secret}|{child}|{rest}", keepttl=True)
        # A token that stored the name as w_x@host (the older spelling): no worker answers
        # under it, but a live one answers under a similar name, so its liveness is unknown.
        legacy = f"redlock:{{legacy-{secrets.token_hex(4)}}}"
        token = f"{secrets.token_hex(16)}|4242|{int(time.time() * 1000)}|w_x@{HOST}|legacy-task"
        locks.set(legacy, token, px=60_000)
        try:
            refused = cli(server.port, "release", held.key)
            assert refused.returncode == 1, refused.stdout
            assert "refused" in refused.stderr and "answers a control ping" in refused.stderr
            unsure = cli(server.port, "release", legacy)
            assert unsure.returncode == 1, unsure.stdout
            assert "refused" in unsure.stderr and "liveness is unknown" in unsure.stderr
            dead = cli(server.port, "release", "--dead")
            assert dead.returncode == 0, dead.stderr
            assert f"kept {held.key}" in dead.stdout and "worker alive" in dead.stdout
            assert f"kept {legacy}" in dead.stdout and "liveness unknown" in dead.stdout
            assert "released 0 lock(s)" in dead.stdout
            assert held.locked() and locks.exists(legacy)
        finally:
            locks.delete(legacy, held.key)


def test_control_characters_in_a_lock_name_are_escaped_in_every_row(server: RedisServer) -> None:
    """A ``Lock`` refuses such a name now; an older version, or another program, may have
    written one: the key is written as a holder of this process would."""
    name = "evil\nname\x1b[31m"
    shown = "evil\\nname\\x1b[31m"
    client = server.client()
    key = keys_for("redlock", name).lock
    assert client.set(key, new_token("held-here"), px=30_000, nx=True)
    try:
        listed = cli(server.port, "ls")
        assert listed.returncode == 0, listed.stderr
        rows = listed.stdout.splitlines()
        assert "\x1b" not in listed.stdout
        assert [row for row in rows if shown in row] == [rows[1]]  # one row, escaped
        assert len(rows) == 2

        inspected = cli(server.port, "inspect", name)
        assert inspected.returncode == 0, inspected.stderr
        assert "\x1b" not in inspected.stdout and f"redlock:{{{shown}}}" in inspected.stdout

        refused = cli(server.port, "release", name)
        assert refused.returncode == 1 and "\x1b" not in refused.stderr
        assert f"refused: redlock:{{{shown}}}" in refused.stderr

        as_json = json.loads(cli(server.port, "ls", "--json").stdout)
        assert [item["name"] for item in as_json] == [name]  # JSON keeps the exact name
    finally:
        client.delete(key)
        client.close()


@pytest.mark.parametrize("url", ["redis//u:hunter2@h:1/0", "redis:/u:hunter2@h/0"])
def test_a_malformed_url_is_a_cli_error_without_the_password(server: RedisServer, url: str) -> None:
    done = cli(server.port, "ls", env={"REDLOCK_TEST_URL": url})
    assert done.returncode == 1
    assert "redlock_url" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
