"""``celery -A proj redlock web``: serve the dashboard with uvicorn, loopback by default."""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

import click

from ..cli._group import ping_wait, store_of, without_app
from . import NEEDS_EXTRA
from ._security import LOOPBACK_NAMES, Credentials

__all__ = ["web"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _root_path(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--root-path``: empty (``/`` too), or a path of ``/``-separated segments without a
    trailing ``/``."""
    if value == "/":
        return ""
    if value and not (
        value.startswith("/")
        and not value.endswith("/")
        and value.isprintable()
        and not any(c in value for c in " ?#%\\")
    ):
        raise click.BadParameter(
            f"expected a path such as /locks (a leading /, no trailing /, no spaces, ?, # or "
            f"%), got {value!r}",
            ctx,
            param,
        )
    return value


@click.command(name="web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8077, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--actions/--read-only",
    default=False,
    show_default=True,
    help="Allow releasing locks and clearing markers from the page (needs credentials).",
)
@click.option(
    "--ping-timeout",
    type=float,
    default=1.0,
    show_default=True,
    callback=ping_wait,
    help="Seconds to wait for pings (0.1 to 3600).",
)
@click.option(
    "--root-path",
    default="",
    callback=_root_path,
    help="The path a reverse proxy serves the dashboard under, stripping it before it "
    "passes a request on (/locks for nginx's 'location /locks/ { proxy_pass "
    "http://127.0.0.1:8077/; }'): links, redirects and cookies then stay under it.",
)
@click.pass_context
def web(
    ctx: click.Context,
    host: str,
    port: int,
    actions: bool,
    ping_timeout: float,
    root_path: str,
) -> None:
    """Serve a dashboard of the locks: held locks, counters, a timeline, and (with --actions)
    owner-checked releases. Credentials come from the environment only: REDLOCK_WEB_TOKEN,
    or REDLOCK_WEB_USER and REDLOCK_WEB_PASSWORD."""
    try:
        import uvicorn
    except ImportError as exc:
        raise click.ClickException(f"{NEEDS_EXTRA} ({exc})") from exc
    try:
        # Through the package's lazy public name: this module is imported by the CLI, which
        # must not load the dashboard (nor Starlette) until ``web`` runs.
        from . import create_app
    except ImportError as exc:  # names the extra
        raise click.ClickException(str(exc)) from exc
    try:
        credentials = Credentials.from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if not credentials.configured and not _loopback(host):
        raise click.ClickException(
            f"refusing to serve on {host} without credentials: set REDLOCK_WEB_TOKEN, or "
            "REDLOCK_WEB_USER and REDLOCK_WEB_PASSWORD (or listen on 127.0.0.1)"
        )
    if actions and not credentials.configured:
        raise click.ClickException(
            "--actions needs credentials in the environment: REDLOCK_WEB_TOKEN, or "
            "REDLOCK_WEB_USER and REDLOCK_WEB_PASSWORD"
        )
    if without_app(ctx):  # said at once, as by every command, not on each page served
        store_of(ctx)
    app: Any = ctx.obj.app
    try:
        asgi = create_app(
            app,
            actions=actions,
            credentials=credentials,
            ping_timeout=ping_timeout,
            # Open on loopback: the Host check is what stops DNS rebinding. With credentials
            # the login does, and a TLS proxy in front passes the site's own Host.
            allowed_hosts=(host, *LOOPBACK_NAMES)
            if _loopback(host) and not credentials.configured
            else None,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    log = logging.getLogger("celery_redlock.web")
    if not log.handlers:  # every action is written to stderr, who did what
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    listening = _listen(host, port)
    bound = listening.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    mode = "actions enabled" if actions else "read-only"
    under = f", served under {root_path}/ by the proxy" if root_path else ""
    click.echo(f"celery-redlock dashboard on http://{shown}:{bound}/ ({mode}{under})", err=True)
    config = uvicorn.Config(asgi, log_level="warning", access_log=False, root_path=root_path)
    uvicorn.Server(config).run(sockets=[listening])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` (an IPv4 address first, for a name) and ``port`` (0: one
    the system picks), before the address is announced: the announcement names the port
    bound, and a port in use or an address that is not this machine's is one error line."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise click.ClickException(f"cannot listen on {host}: {exc.strerror}") from exc
    family, kind, proto, _, address = sorted(found, key=lambda a: a[0] != socket.AF_INET)[0]
    listening = socket.socket(family, kind, proto)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind(address)
        listening.listen(2048)  # uvicorn's backlog: a request sent once announced waits
    except OSError as exc:
        listening.close()
        raise click.ClickException(f"cannot listen on {host} port {port}: {exc.strerror}") from exc
    return listening
