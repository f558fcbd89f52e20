"""The layers hold in a fresh interpreter: importing the Redis layer never imports Celery, and
the CLI never loads the worker wiring.

Each test runs Python in a subprocess, so that what this test process already imported cannot
hide an import. The layer rules read from the source tree are in ``tests/unit/test_layers.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import typing

import pytest

from support.layers import REDIS_LAYER


def _celery_modules_after(code: str, prefix: str = "celery") -> list[str]:
    """Run ``code`` in a fresh interpreter; return the ``<prefix>*`` modules it left loaded."""
    probe = code + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps(sorted(
            m for m in sys.modules if m == {prefix!r} or m.startswith({prefix!r} + ".")
        )))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_redis_layer_modules_do_not_import_celery() -> None:
    # The modules themselves, with the package __init__ (the public surface, which includes
    # the Celery layer) bypassed: none of them may reach for celery, directly or indirectly.
    code = textwrap.dedent(
        f"""
        import importlib, importlib.util, sys, types
        spec = importlib.util.find_spec("celery_redlock")
        package = types.ModuleType("celery_redlock")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["celery_redlock"] = package
        for name in {REDIS_LAYER!r}:
            importlib.import_module(name)
        """
    )
    assert _celery_modules_after(code) == []


def test_importing_redis_layer_does_not_import_celery() -> None:
    code = "".join(f"import {name}\n" for name in REDIS_LAYER) + "from celery_redlock import Lock\n"
    assert _celery_modules_after(code) == []


def test_the_cli_does_not_load_the_worker_wiring() -> None:
    code = "import celery_redlock.cli\n"
    loaded = _celery_modules_after(code, prefix="celery_redlock")
    assert "celery_redlock._celery.wiring" not in loaded
    assert "celery_redlock._celery.engine" not in loaded


@pytest.mark.parametrize(
    ("missing", "name", "expected"),
    [
        ("starlette", "create_app", 'the dashboard needs the web extra: pip install "'),
        ("django", "django_urls", "django_urls mounts the dashboard in a Django project, and "),
    ],
)
def test_the_dashboard_without_a_library_names_what_to_install(
    missing: str, name: str, expected: str
) -> None:
    """Without Starlette (``None`` in ``sys.modules`` stands for a library not installed),
    ``from celery_redlock.web import create_app`` says which extra to install. Without Django,
    ``django_urls`` named the web extra too, which does not bring Django."""
    code = f"import sys; sys.modules[{missing!r}] = None\nfrom celery_redlock.web import {name}\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {expected}"), last
    assert missing in last


def test_a_lock_option_without_the_base_is_refused_when_only_a_helper_is_imported() -> None:
    """The README quickstart with ``base=LockedTask`` forgotten imports only
    ``current_fencing_token``: the router that refuses ``lock_by`` at ``delay()`` came with
    the wiring, which that import did not load, and the call was published to run unlocked."""
    code = textwrap.dedent(
        """
        from celery import Celery
        from celery_redlock import current_fencing_token

        app = Celery("proj", broker="memory://")
        app.conf.redlock_url = "redis://127.0.0.1:1/0"

        @app.task(name="proj.sync_account", lock_by=["account_id"])
        def sync_account(account_id):
            return current_fencing_token()

        try:
            sync_account.delay(42)
        except Exception as exc:
            print(type(exc).__name__, exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "LockConfigError task proj.sync_account: option lock_by=['account_id'] is ignored"
    ), done.stdout + done.stderr


@pytest.mark.parametrize("module", ["celery_redlock", "celery_redlock.web"])
def test_every_public_name_is_listed_by_dir_and_importable(module: str) -> None:
    """Packaging probe, round 3: ``dir(celery_redlock)`` lacked ``LockedTask`` and the other
    lazily loaded names (tab completion and ``inspect.getmembers`` never showed them), and
    ``create_app``'s ``credentials`` type could be imported from a private module only."""
    code = textwrap.dedent(
        f"""
        import importlib, json
        module = importlib.import_module({module!r})
        print(json.dumps([
            sorted(set(module.__all__) - set(dir(module))),
            [name for name in module.__all__ if getattr(module, name, None) is None],
        ]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[], []]


def test_the_dashboards_credentials_type_is_public() -> None:
    from celery_redlock.web import Credentials, create_app
    from celery_redlock.web._security import Credentials as Declared

    assert Credentials is Declared
    assert typing.get_type_hints(create_app)["credentials"] == Credentials | None


def test_help_of_the_dashboard_module_works_without_django() -> None:
    """Review, round 3: ``dir(celery_redlock.web)`` listed ``django_urls``, whose loading
    raises ``ModuleNotFoundError`` without Django (the web extra does not bring it), so
    ``inspect.getmembers`` and ``help()`` failed for every FastAPI or Starlette user."""
    code = textwrap.dedent(
        """
        import inspect, json, pydoc, sys
        sys.modules["django"] = None  # not installed
        import celery_redlock.web as web
        names = [name for name, _ in inspect.getmembers(web)]
        pydoc.render_doc(web)
        print(json.dumps(["create_app" in names, "Credentials" in names, "django_urls" in names]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, False]
