"""Each script declares the commands it runs, and the startup check's dry run probes exactly
those (:mod:`celery_redlock._redis.probe`): the declarations are pinned against the sources."""

from __future__ import annotations

import re

import pytest
import redis as redis_py

from celery_redlock._redis import companions as companion_calls
from celery_redlock._redis import owner, probe, scripts
from celery_redlock._redis.scripts import base, companions, lock, queue


def _called(source: str, how: str) -> set[str]:
    return {m.upper() for m in re.findall(rf"redis\.{how}\('(\w+)'", source)}


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_each_script_declares_the_commands_it_runs(script: base.Script) -> None:
    called = _called(script.source, "call")
    assert set(script.commands) == called
    assert set(script.tolerated) == _called(script.source, "pcall") - called
    assert len(script.commands) == len(set(script.commands))
    assert script.source.lstrip().startswith("--") or "local function" in script.source
    assert "-- KEYS[1" in script.source and "returns" in script.source  # its contract


def test_every_script_of_every_concern_is_declared_once() -> None:
    names = [s.name for s in scripts.SCRIPTS]
    assert len(names) == len(set(names))
    declared = {s.source for s in scripts.SCRIPTS}
    for module in (lock, queue, companions):
        for name, value in vars(module).items():
            if isinstance(value, str) and "redis.call" in value and not name.startswith("_"):
                assert value in declared, f"{module.__name__}.{name} is not declared"
                assert getattr(scripts, name) is value  # importable from the package too


def test_the_dry_run_probes_every_command_a_feature_needs() -> None:
    for feature in probe.FEATURES.values():
        assert set(feature.commands) <= set(probe.ORDER), feature.name
    # A command only the command line sends is never a worker's requirement.
    workers = set().union(*(probe.FEATURES[f].commands for f in ("lock", "enqueue", "newest")))
    assert not {"SCAN", "HGETALL", "MGET"} & workers
    assert {"HGET", "HSET", "HDEL"} <= set(probe.FEATURES["newest"].commands)
    assert {"LLEN", "LINDEX", "RPUSH", "LTRIM"} <= set(probe.FEATURES["rate"].commands)


def test_the_release_scripts_mark_a_cooldown_as_owner_reads_it() -> None:
    """The Lua literal and :data:`owner.COOLDOWN` are one mark, written in two languages."""
    for script in (lock.RELEASE, lock.RELEASE_ATTEMPT):
        assert f"'{owner.COOLDOWN}' .. string.sub(" in script
    assert len(owner.COOLDOWN) == 8  # the scripts replace the first 8 characters


@pytest.mark.parametrize(
    ("reply", "rule"),
    [
        # Redis 6.2 and 7.0, direct
        ("this user has no permissions to access one of the keys used as arguments", "~rl:*"),
        ("this user has no permissions to access one of the channels used as arguments", "&rl:*"),
        ("this user has no permissions to run the 'select' command", "+select"),
        ("this user has no permissions to run the 'script' command or its subcommand", "+script"),
        # Redis 7.2 and newer (measured on 7.4.1), direct and inside a script
        ("No permissions to access a key", "~rl:*"),
        ("No permissions to access a channel", "&rl:*"),
        ("ACL failure in script: No permissions to access a key script: 1a2b", "~rl:*"),
        ("User redlock has no permissions to run the 'dump' command", "+dump"),
        # inside a script on 7.0: no command named
        ("The user executing the script can't run this command or subcommand script: 3e", ""),
    ],
)
def test_a_refusal_is_mapped_to_the_acl_rule_that_grants_it(reply: str, rule: str) -> None:
    """Redis 7.2 words a key refusal "No permissions to access a key": read as a command
    refusal, the startup check dropped its key probes and asked for commands the user had."""
    assert probe.acl_rule(reply, "rl") == rule
    assert probe.key_refused(reply) is rule.startswith("~")


def test_an_acl_refusal_inside_a_script_names_the_features_commands_on_every_redis() -> None:
    """Review, round 3: Redis 7.2 and newer name the command refused inside a script, and the
    hint named that one alone ("+hset (refused before the script ran)"), as for a refused
    EVALSHA; inside a script the feature's commands are what to grant, as on 7.0."""
    inside = {
        "7.0": "The user executing the script can't run this command or subcommand script: x",
        "7.2": "ERR ACL failure in script: User u has no permissions to run the 'hset' command "
        "script: x, on @user_script:1.",
    }
    for wording in inside.values():
        grant = companion_calls.acl_refusal(
            redis_py.exceptions.ResponseError(wording), "mark_newest"
        )
        assert grant is not None and grant.startswith("+hget +hset"), grant
    direct = redis_py.exceptions.NoPermissionError(
        "this user has no permissions to run the 'evalsha' command"
    )
    assert companion_calls.acl_refusal(direct, "mark_newest") == (
        "+evalsha (refused before the mark_newest script ran)"
    )
