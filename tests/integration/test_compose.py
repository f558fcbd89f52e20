"""``docker-compose.yml`` matches the example project it runs (checked without Docker).

The app is inspected in a subprocess with the compose file's environment, so that importing it
neither changes this process's current Celery app nor depends on what the tests imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

INSPECT = """
import json
from example_project.tasks import app
print(json.dumps({
    "main": app.main,
    "broker": app.conf.broker_url,
    "redlock_url": app.conf.redlock_url,
    "tasks": sorted(n for n in app.tasks if not n.startswith("celery.")),
    "schedule": {
        name: {
            "task": entry["task"],
            "every": float(entry["schedule"]),
            "options": entry.get("options", {}),
            "cooldown": app.tasks[entry["task"]].lock_cooldown,
        }
        for name, entry in app.conf.beat_schedule.items()
    },
}))
"""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def app_info(services: dict[str, dict[str, Any]]) -> dict[str, Any]:
    env = {
        **os.environ,
        **services["worker1"]["environment"],
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", INSPECT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"redis", "worker1", "worker2", "beat", "producer"}
    for name in ("worker1", "worker2", "beat", "producer"):
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}
        assert services[name]["environment"]["EXAMPLE_REDIS_URL"] == "redis://redis:6379"


def test_redis_never_evicts_a_lock(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    command = redis["command"]
    assert command[0] == "redis-server"
    assert option(command, "--maxmemory-policy") == "noeviction"


def test_the_image_builds_from_files_that_exist(services: dict[str, dict[str, Any]]) -> None:
    build = services["worker1"]["build"]
    context = ROOT / build["context"]
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (context / source).exists(), line


def test_celery_commands_name_the_example_app(
    services: dict[str, dict[str, Any]], app_info: dict[str, Any]
) -> None:
    names = []
    for service, sub in [("worker1", "worker"), ("worker2", "worker"), ("beat", "beat")]:
        command = services[service]["command"]
        assert command[:2] == ["celery", "-A"]
        module = option(command, "-A")
        assert module == "example_project.tasks"
        assert importlib.util.find_spec(module) is not None
        assert command[3] == sub, service
        if sub == "worker":
            assert option(command, "-P") == "prefork"
            names.append(option(command, "-n"))
    assert len(set(names)) == 2  # two distinct node names
    assert app_info["main"] == "example_project"
    assert app_info["broker"] == "redis://redis:6379/1"
    assert app_info["redlock_url"] == "redis://redis:6379/0"
    assert {"example_project.tasks.refresh_report", "example_project.tasks.sync_account"} <= set(
        app_info["tasks"]
    )


def test_beat_entries_follow_the_recommended_setup(app_info: dict[str, Any]) -> None:
    """A registered task, ``expires`` <= ``lock_cooldown`` < interval, a ``time_limit``."""
    assert app_info["schedule"]
    for name, entry in app_info["schedule"].items():
        assert entry["task"] in app_info["tasks"], name
        assert 0 < entry["options"]["expires"] <= entry["cooldown"] < entry["every"], name
        assert entry["options"]["time_limit"] > 0, name


def test_the_producer_module_exists(services: dict[str, dict[str, Any]]) -> None:
    command = services["producer"]["command"]
    assert command[:2] == ["python", "-m"]
    spec = importlib.util.find_spec(command[2])
    assert spec is not None and spec.origin is not None
    assert "def main(" in Path(spec.origin).read_text()
