"""Who may look and act: credentials from the environment, CSRF tokens, the ``Origin`` check.

Standalone (``celery redlock web``), credentials come from the environment only, never from
the URL or the command line (both end up in logs and ``ps``):

* ``REDLOCK_WEB_TOKEN``: a bearer token (``Authorization: Bearer ...``), or typed once into the
  login form, which sets a session cookie (HttpOnly, ``SameSite=Strict``);
* ``REDLOCK_WEB_USER`` and ``REDLOCK_WEB_PASSWORD``: HTTP basic auth.

Each without its trailing line breaks (a value read from a file); a variable set to whitespace
only is refused at start, naming it (a token of 20 spaces was a credential).

A session cookie is ``<issued>.<nonce>.<mac>``: an HMAC, under the secret, of a digest of the
token, the issue time and a nonce. It ends after :data:`SESSION_LIFETIME` (12 hours), and with
the token. Hazard it closes, as a timeline (the secret is shared by several processes, so it
outlives the token):

1. an operator logs in with the token; the browser keeps the session cookie;
2. the token leaks, or the operator leaves; the token is rotated and the processes restart
   with the same ``REDLOCK_WEB_SECRET``;
3. the old cookie comes back: its HMAC covers the old token's digest, so it is refused (a
   cookie of a nonce only would be accepted for as long as the secret lives).

Every state-changing request is a POST that carries a CSRF token and no foreign ``Origin``.
The token is an HMAC of a random per-browser cookie (``SameSite=Strict``, HttpOnly) under the
process's secret (``REDLOCK_WEB_SECRET``, or random at start). A cross-site form post fails
twice: the browser does not send the Strict cookie, and the page that posts cannot read the
token. Hazard, as a timeline, of what the ``Origin`` check adds:

1. a user is logged in to the dashboard in one tab;
2. a page of another origin in another tab posts a form to the dashboard's action URL;
3. the browser sends ``Origin: <the other origin>``: refused before the token is looked at,
   even if an older browser had sent the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Credentials", "Guard"]

TOKEN_ENV, USER_ENV, PASSWORD_ENV, SECRET_ENV = (
    "REDLOCK_WEB_TOKEN",
    "REDLOCK_WEB_USER",
    "REDLOCK_WEB_PASSWORD",
    "REDLOCK_WEB_SECRET",
)

CSRF_COOKIE = "redlock_csrf"
SESSION_COOKIE = "redlock_session"

#: Headers of every page: no script, no frame, no cache (the lock list and a CSRF token).
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: The names a browser on this machine reaches a loopback address by: the ``Host`` headers a
#: dashboard without a login answers.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

#: The shortest ``REDLOCK_WEB_SECRET`` accepted. Timeline it closes: (1) an operator sets a
#: short word as the secret; (2) anyone who sees one session cookie (a proxy log, a shared
#: browser) tries words offline against its HMAC until one matches; (3) they sign cookies of
#: their own, which every process sharing the secret accepts, for as long as it is unchanged.
MIN_SECRET = 32

#: Seconds a session cookie is accepted after the login that set it (its ``Max-Age`` too).
SESSION_LIFETIME = 12 * 3600


@dataclass(frozen=True)
class Credentials:
    """What a standalone dashboard accepts (from the environment)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        """Read them from ``env`` (default ``os.environ``).

        Trailing line breaks are dropped from each (:func:`_env_value`), as a
        value read from a file has them (``$(cat token)`` keeps them in some shells, a secret
        mounted as a file has one, an editor may add two). Timeline without: (1)
        ``REDLOCK_WEB_TOKEN`` ends in ``\n``; (2) no browser or ``curl`` header can carry it;
        (3) every login is "wrong token", with the right one.

        :raises ValueError: for a value of only whitespace, a user without a password or the
            reverse, a short token (counted without its trailing line breaks) or one holding
            whitespace or a character other than printable ASCII, a short password (basic auth
            has no lockout: a password is guessed at network speed), or a user name with a
            ``:``, which basic auth cannot carry (RFC 7617: the browser sends
            ``user:password``, split at the first ``:``; every login was refused).
        """
        env = os.environ if env is None else env
        token, user, password = (_env_value(env, n) for n in (TOKEN_ENV, USER_ENV, PASSWORD_ENV))
        if (user is None) != (password is None):
            raise ValueError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
        if user is not None and ":" in user:
            raise ValueError(f"{USER_ENV} cannot contain ':' (basic auth splits at the first ':')")
        if token is not None and len(token) < 16:
            raise ValueError(f"{TOKEN_ENV} must be at least 16 characters (secrets.token_urlsafe)")
        if token is not None and any(c.isspace() for c in token):
            # A bearer token has none (RFC 6750), and a header's leading ones are dropped.
            raise ValueError(f"{TOKEN_ENV} cannot contain spaces or line breaks")
        if token is not None and not all("!" <= c <= "~" for c in token):
            # Timeline without: (1) a token with an "ä" starts the server and logs in through
            # the form; (2) curl sends it in UTF-8, the server reads header bytes as Latin-1;
            # (3) every scripted request is sent to the login page, with the right token.
            raise ValueError(
                f"{TOKEN_ENV} must be printable ASCII (an Authorization header carries no other; "
                "secrets.token_urlsafe gives one)"
            )
        if password is not None and len(password) < 12:
            raise ValueError(f"{PASSWORD_ENV} must be at least 12 characters")
        return cls(token, user, password)

    @property
    def configured(self) -> bool:
        return self.token is not None or self.user is not None


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    """The value of ``name`` in ``env`` without its trailing line breaks, or ``None`` when
    unset or empty. Spaces stay: a password ending in one is typed with it, and a browser
    sends it (a token refuses them: :meth:`Credentials.from_env`).

    :raises ValueError: naming ``name`` when it is set to whitespace only: a token of 20
        spaces was accepted as a credential, and stripped it would silently be no credential.
    """
    raw = env.get(name) or ""
    value = raw.rstrip("\r\n")
    if raw and not raw.strip():
        raise ValueError(f"{name} is only whitespace: set it to a value, or unset it")
    return value or None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """Authentication (standalone) and CSRF checks; no web framework in here.

    :param secret: the HMAC key (default ``REDLOCK_WEB_SECRET``, else random).
    :raises ValueError: for a ``REDLOCK_WEB_SECRET`` shorter than :data:`MIN_SECRET` (without
        its trailing line breaks), or of whitespace only.
    :param lifetime: seconds a session is accepted after its login.
    :param clock: the time in seconds since the epoch (injected by tests).
    """

    def __init__(
        self,
        credentials: Credentials,
        secret: bytes | None = None,
        *,
        lifetime: float = SESSION_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.credentials = credentials
        # Its trailing line breaks dropped, as the credentials' (Credentials.from_env): else a
        # secret read from a file signs other sessions than the same secret given bare.
        env_secret = (_env_value(os.environ, SECRET_ENV) or "") if secret is None else ""
        if env_secret and len(env_secret) < MIN_SECRET:
            raise ValueError(
                f"{SECRET_ENV} must be at least {MIN_SECRET} characters "
                "(secrets.token_urlsafe(32) gives 43)"
            )
        self.secret = secret or (env_secret.encode() if env_secret else secrets.token_bytes(32))
        self.lifetime = lifetime
        self.clock = clock
        token = credentials.token
        self._token_digest = hashlib.sha256(token.encode()).hexdigest() if token else None

    def _sign(self, purpose: str, value: str) -> str:
        mac = hmac.new(self.secret, f"{purpose}:{value}".encode(), hashlib.sha256)
        return mac.hexdigest()

    # -- authentication ---------------------------------------------------------------------

    def actor(self, authorization: str | None, session: str | None) -> str | None:
        """Who the request is from, or ``None`` when it is not authenticated."""
        creds = self.credentials
        scheme, _, value = (authorization or "").partition(" ")
        if creds.token is not None:
            if scheme.lower() == "bearer" and _same(value.strip(), creds.token):
                return "token"
            if session and self.valid_session(session):
                return "token (session)"
        if creds.user is not None and creds.password is not None and scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8 inside
                return None
            if _same(user, creds.user) & _same(password, creds.password):
                return user
        return None

    def login(self, token: str) -> str | None:
        """A session cookie value for the right token, else ``None``."""
        if self.credentials.token is None or not _same(token, self.credentials.token):
            return None
        issued, nonce = str(int(self.clock())), secrets.token_hex(16)
        return f"{issued}.{nonce}.{self._session_mac(issued, nonce)}"

    def _session_mac(self, issued: str, nonce: str) -> str:
        return self._sign("session", f"{self._token_digest}:{issued}:{nonce}")

    def valid_session(self, cookie: str) -> bool:
        """Whether ``cookie`` was set by a login with this token less than ``lifetime`` ago."""
        parts = cookie.split(".")
        if self._token_digest is None or len(parts) != 3:
            return False
        issued, nonce, mac = parts
        if not _same(mac, self._session_mac(issued, nonce)):
            return False
        # Signed here, so ``issued`` is the digits login() wrote.
        return self.clock() - int(issued) < self.lifetime

    # -- CSRF --------------------------------------------------------------------------------

    @staticmethod
    def new_csrf_cookie() -> str:
        return secrets.token_hex(16)

    def csrf_token(self, cookie: str) -> str:
        """The token a form must carry for the browser holding ``cookie``."""
        return self._sign("csrf", cookie)

    def csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        return bool(cookie) and bool(token) and _same(str(token), self.csrf_token(str(cookie)))


def origin_ok(origin: str | None, fetch_site: str | None, own: str) -> bool:
    """Whether a POST may come from where it says it comes from.

    ``own`` is the dashboard's ``scheme://host[:port]``. A foreign or ``null`` ``Origin`` is
    refused, and so is ``Sec-Fetch-Site: cross-site``; a request without either (a script,
    an old browser) is left to the CSRF token.
    """
    if fetch_site is not None and fetch_site.lower() == "cross-site":
        return False
    return origin is None or origin.rstrip("/").lower() == own.rstrip("/").lower()
