"""Recognising Redis-compatible servers from their ``INFO`` (``celery_redlock._redis.servers``).

The replies are the ``Server`` fields each server documents or prints (docs/servers.md says
where each comes from); a real Redis is identified in ``tests/integration/test_servers.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_redlock._celery.checks import _check_info
from celery_redlock._redis.servers import Server, identify, verdict

REDIS = {"redis_version": "7.0.15", "redis_mode": "standalone", "role": "master"}
VALKEY = {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.2"}
DRAGONFLY = {"redis_version": "7.4.0", "dragonfly_version": "df-v1.40.1", "thread_count": 7}
KEYDB = {"redis_version": "6.3.4", "executable": "/usr/bin/keydb-server", "mvcc_depth": 0}
KEYDB_ACTIVE = {**KEYDB, "role": "active-replica"}
GARNET = {"garnet_version": "1.0.84", "redis_version": "7.2.5", "redis_mode": "standalone"}


@pytest.mark.parametrize(
    ("info", "server"),
    [
        (REDIS, Server("Redis", "7.0.15", "7.0.15")),
        (VALKEY, Server("Valkey", "8.0.2", "7.2.4")),
        ({"redis_version": "7.2.4", "server_name": "valkey"}, Server("Valkey", "7.2.4", "7.2.4")),
        (DRAGONFLY, Server("Dragonfly", "df-v1.40.1", "7.4.0")),
        (KEYDB, Server("KeyDB", "6.3.4", "6.3.4")),
        ({"redis_version": "6.3.4", "role": "active-replica"}, Server("KeyDB", "6.3.4", "6.3.4")),
        (GARNET, Server("Garnet", "1.0.84", "7.2.5")),
        ({}, Server("Redis", "?", "?")),
    ],
    ids=lambda v: v.product if isinstance(v, Server) else None,
)
def test_each_server_is_recognised_by_what_its_info_says(
    info: dict[str, Any], server: Server
) -> None:
    assert identify(info) == server


def test_redis_and_valkey_need_no_word() -> None:
    assert verdict(REDIS) == []
    assert verdict(VALKEY) == []


def test_garnet_is_an_error_naming_the_transaction_mode() -> None:
    [(level, message)] = verdict(GARNET)
    assert level == logging.ERROR
    assert "--lua-transaction-mode" in message and "Garnet 1.0.84" in message


def test_a_keydb_active_replica_is_an_error_a_single_primary_is_not() -> None:
    [(level, message)] = verdict(KEYDB_ACTIVE)
    assert level == logging.ERROR
    assert "active replica" in message and "both sides of a split" in message
    [(level, _)] = verdict(KEYDB)
    assert level == logging.INFO


def test_dragonfly_is_told_the_scripts_declare_their_keys() -> None:
    [(level, message)] = verdict(DRAGONFLY)
    assert level == logging.INFO
    assert "KEYS" in message


def test_the_startup_check_logs_the_verdict_naming_the_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        _check_info("redis://garnet:1/0", GARNET)
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage().startswith("celery_redlock: locks on redis://garnet:1/0: Garnet")


@pytest.mark.parametrize(
    ("info", "named"),
    [
        (REDIS, "locks on Redis 7.0.15 at redis://h:1/0"),
        (VALKEY, "locks on Valkey 8.0.2 (redis_version 7.2.4) at redis://h:1/0"),
        (GARNET, "locks on Garnet 1.0.84 (redis_version 7.2.5) at redis://h:1/0"),
    ],
    ids=["redis", "valkey", "garnet"],
)
def test_the_startup_check_names_the_server_it_found(
    caplog: pytest.LogCaptureFixture, info: dict[str, Any], named: str
) -> None:
    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        _check_info("redis://h:1/0", info)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line == f"celery_redlock: {named}"
