"""The ``redlock`` click group, and what its commands share: the app's inventory, input checks.

A subcommand joins the group with ``@redlock.command()`` (or ``redlock.add_command``) and
reaches the app's locks with :func:`store_of`; Redis errors reach the user as one ``Error:``
line (:func:`answers`), and a quorum node that does not answer while a majority does as one
``WARNING:`` line on stderr (:meth:`LockStore.on_unanswered`). A ``--timeout`` is declared
with :data:`TIMEOUT`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import click
from click.core import ParameterSource

from .._celery.options import SETTINGS, Settings, settings_for
from .._redis.clients import redact_url
from .._redis.inventory import Inventory
from ..exceptions import LockConfigError, LockUnavailable, RedlockError
from ._format import tolerant_streams
from ._liveness import checked_wait


class LockStore(Inventory):
    """The :class:`~celery_redlock._redis.inventory.Inventory` of an app's settings (its
    ``redlock_url`` and ``redlock_prefix``), with the ``redlock_lease`` its renewals set."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings.url, settings.prefix)
        self.settings = settings
        self.lease = settings.lease
        self.warned: set[str] = set()

    def on_unanswered(self, node: str, error: LockUnavailable) -> None:
        """One ``WARNING:`` line on stderr per quorum node that did not answer (what the
        command prints is what the majority of nodes shows), or Cluster primary (the locks in
        its slots are left out)."""
        if node not in self.warned:
            self.warned.add(node)
            going_on = (
                f"going on with the majority of the {len(self.urls)} nodes that answer"
                if len(self.urls) > 1
                else f"the locks in the slots of Cluster primary {node} are not listed"
            )
            click.echo(f"WARNING: {error}; {going_on}", err=True)

    def answering(self) -> str:
        """Where a listing that found nothing looked, when a node did not answer it (a
        Cluster primary, a quorum's minority): `` on the Cluster primaries that answer``;
        else ``""``. "is not held", said of a lock that lived in a dead primary's slots,
        read as certain."""
        if not self.warned:
            return ""
        return (
            " on the nodes that answer"
            if len(self.urls) > 1
            else " on the Cluster primaries that answer"
        )

    def unanswered(self) -> str:
        """``; <node> did not answer: ...`` for the nodes that did not (:meth:`answering`)."""
        if not self.warned:
            return ""
        nodes = ", ".join(sorted(self.warned))
        lost = (
            "a lock held on a majority with it may not be seen"
            if len(self.urls) > 1
            else "the locks in its slots are not seen"
        )
        return f"; {nodes} did not answer: {lost}"


@click.group(name="redlock")
@click.pass_context
def redlock(ctx: click.Context, /, **_: Any) -> None:
    """Inspect and release celery-redlock locks; show their counters.

    Run it with your app, whose redlock_* settings say where the locks are:
    celery -A yourproject redlock ls
    """
    tolerant_streams()


def without_app(ctx: click.Context) -> bool:
    """Whether ``celery`` was run without ``-A``/``--app`` (nor ``APP`` in the environment)."""
    root = ctx.find_root()
    return "app" in root.params and not root.params["app"]


#: Celery's own options that choose the app and its settings (``broker_url`` may be the
#: ``redlock_url``), as ``(parameter, flag)``: a hint's command repeats those given.
_ROOT_OPTIONS = (
    ("broker", "-b"),
    ("result_backend", "--result-backend"),
    ("loader", "--loader"),
    ("config", "--config"),
    ("workdir", "--workdir"),
)


def command_line(ctx: click.Context, *args: str) -> str:
    """``celery -A <app> redlock <args>`` as the operator ran it, to paste: the ``-A`` they gave
    (on the command line or in the environment), and the other options of :data:`_ROOT_OPTIONS`
    that they typed. Arguments are quoted for a shell; a password in a URL shows as ``***``,
    to be typed again."""
    root = ctx.find_root()
    words = ["celery", "-A", _app_given(root.params.get("app"))]
    for name, flag in _ROOT_OPTIONS:
        if root.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        # Celery's --workdir changes into the folder and keeps no value: the folder is here.
        value = os.getcwd() if name == "workdir" else root.params.get(name)
        if isinstance(value, str) and value:
            words += [flag, redact_url(value) if "://" in value else value]
    return " ".join([*map(shlex.quote, words), "redlock", *map(shlex.quote, args)])


def _app_given(value: object) -> str:
    """The ``-A`` the operator gave. Celery 5.3 hands the command the app it loaded, not the
    name: it is read from the command line then (``yourproject`` when there is none)."""
    if isinstance(value, str) and value:
        return value
    if value is not None:
        words = sys.argv[1:]
        for i, word in enumerate(words[: words.index("redlock")] if "redlock" in words else []):
            if word in ("-A", "--app") and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(("--app=", "-A")) and word not in ("-A", "--app"):
                return word.removeprefix("--app=").removeprefix("-A")
    return "yourproject"


def store_of(ctx: click.Context) -> LockStore:
    """The locks of the ``-A`` app; a clear error naming ``-A`` when none was given and no
    configuration module (``--config``, ``CELERY_CONFIG_MODULE``, a ``celeryconfig.py``) set a
    ``redlock_*`` setting, also when Celery's defaults would resolve (a Redis broker in
    ``CELERY_BROKER_URL`` or ``-b``). Timeline without that: (1) the workers run with
    ``redlock_lease=120``; (2) a worker in a warm shutdown runs a task, its lock renewed; (3)
    ``celery redlock release --dead``, typed without ``-A`` in a container whose environment
    names the broker, judged it by the default 30 s lease, released it, and exited 0: the task
    ran on without its lock."""
    app = ctx.obj.app
    if without_app(ctx) and not _sets_redlock(app):
        try:
            settings_for(app)
            why = "its redlock_* settings say where the locks are and how long a lease is"
        except LockConfigError as exc:
            why = f"so no redlock_* settings: {exc}"
        raise click.ClickException(
            f"no app given ({why}); run it with your app: "
            f"{command_line(ctx, ctx.info_name or 'ls')} ..."
        )
    try:
        return LockStore(settings_for(app))
    except LockConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _sets_redlock(app: Any) -> bool:
    """Whether ``app``'s configuration sets one of the ``redlock_*`` settings, spelled as
    Celery's default app reads it (lower case, no namespace: it ignores ``REDLOCK_LEASE`` and
    ``CELERY_REDLOCK_LEASE``, and a misspelt one sets nothing); the package adds none."""
    return any(key in SETTINGS for key in app.conf)


@contextlib.contextmanager
def answers() -> Iterator[None]:
    """Redis failures as one ``Error:`` line: the node (credentials hidden) and what failed,
    a refused permission by its command."""
    try:
        yield
    except RedlockError as exc:
        raise click.ClickException(str(exc)) from exc


def ping_wait(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """``value`` checked by :func:`~._liveness.checked_wait`, as a usage error."""
    try:
        return checked_wait(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


#: The ``--timeout`` option of the commands that ping workers.
TIMEOUT = click.option(
    "--timeout",
    type=float,
    default=1.0,
    show_default=True,
    callback=ping_wait,
    help="Seconds to wait for a ping (0.1 to 3600).",
)


def text_argument(value: str | None, what: str, expected: str) -> str | None:
    """``value`` checked: never empty, and UTF-8 text (a byte that is not UTF-8 reaches
    Python as a lone surrogate, which no key can hold)."""
    if value is None:
        return None
    if not value.strip():
        raise click.UsageError(f"{what} is empty; expected {expected}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise click.UsageError(f"{what} '{shown}' is not UTF-8 text; expected {expected}") from None
    return value
