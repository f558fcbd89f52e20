"""Redis clients: one shared client per URL per process, and how errors are classified.

URL forms:

* ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS: ``ssl_ca_certs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname`` as query
  parameters) and ``unix:///path.sock``: what redis-py's ``from_url`` accepts, and Celery's
  ``ssl_cert_reqs=CERT_NONE`` (:func:`redis_py_spelling`);
* ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``: the primary that
  the Sentinels name ``service``, followed across failovers (``rediss+sentinel://`` for TLS to
  the primary, and with ``sentinel_ssl=true`` to the Sentinels too; ``sentinel_username=`` and
  ``sentinel_password=`` in the query for Sentinels that require them);
* ``redis+cluster://[user:password@]host:port[,host:port...]/``: a Redis Cluster
  (``rediss+cluster://`` for TLS).

Socket timeouts default to 5 s (reads) and 2 s (connect) unless the URL sets them, so an
unreachable server fails an operation instead of hanging a task. Over TLS the server's
certificate must name the URL's host (``ssl_check_hostname`` on unless the URL says
``ssl_check_hostname=false`` or ``ssl_cert_reqs=none``), on every redis-py: 5.x did not check
it by default, so a certificate that the CA issued to *any* host let that host's key stand in
for the lock Redis.

:func:`redact` is the one function that hides credentials in anything this package prints:
messages, logs, exceptions and the startup checks.

This module never imports Celery.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import os
import re
import ssl
import weakref
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis as redis_py
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..exceptions import LockUnavailable
from .core import Outcome, classify
from .forks import Guard
from .pools import WaitingPool

logger = logging.getLogger("celery_redlock.lock")

#: Schemes accepted by :func:`client_for`.
SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)

#: Errors that mean "this node did not answer": the lock state there is unknown. For a Redis
#: Cluster also CLUSTERDOWN / retries exhausted (``ClusterError``) and "no node reachable" or
#: "slot not covered" (``RedisClusterException``; its other uses are misuse that the keys built
#: by :mod:`celery_redlock._keys`, one hash tag per lock, cannot cause).
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_py.exceptions.ConnectionError,
    redis_py.exceptions.TimeoutError,
    redis_py.exceptions.BusyLoadingError,
    redis_py.exceptions.ClusterError,
    redis_py.exceptions.RedisClusterException,
    redis_py.exceptions.InvalidResponse,
    OSError,
)


def as_text(value: Any) -> str:
    """A reply's ``value`` as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply by which a node refuses for now (``BUSY``, ``OOM``,
    ``READONLY``, ``NOPERM``...: :func:`celery_redlock._redis.core.classify`)."""
    return classify(exc) is Outcome.REFUSED


_clients: dict[tuple[str, float | None], Any] = {}
_guard = Guard()


#: Connections of the pool of a client built from a ``redis://``, ``rediss://`` or
#: ``unix://`` URL (``?max_connections=`` in the URL sets it), as the asyncio lock's.
MAX_CONNECTIONS = 100


def client_for(url: str, timeout: float | None = None) -> Any:
    """A shared client for ``url`` (one per URL and timeout per process; fork-safe).

    ``timeout`` sets both socket timeouts (the worker's main process uses 1 s). A URL of one
    server gets a :class:`~.pools.WaitingPool` of :data:`MAX_CONNECTIONS`: the 101st thread at
    once waits for a free connection (at most the socket timeout), as an asyncio task does,
    instead of failing with "Too many connections" (redis-py 8's plain pool stops at 100).
    """
    client = _clients.get((url, timeout))
    if client is not None:
        return client
    with _guard:
        client = _clients.get((url, timeout))
        if client is None:
            options: dict[str, Any] = {}
            if "socket_timeout=" not in url:
                options["socket_timeout"] = timeout or 5.0
            if "socket_connect_timeout=" not in url:
                options["socket_connect_timeout"] = timeout or 2.0
            if url.startswith("rediss") and not _HOSTNAME_SET.search(url):
                options["ssl_check_hostname"] = True
            try:
                validate_url(url)
            except ValueError as exc:
                raise ValueError(f"{redact_url(url)!r} is not a valid Redis URL: {exc}") from None
            try:
                client = _connect(redis_py_spelling(url), options)
            except UNAVAILABLE_ERRORS as exc:  # a Cluster client connects when built
                raise LockUnavailable(
                    f"Redis at {redact_url(url)} did not answer: {exc}", nodes=(redact_url(url),)
                ) from exc
            _clients[(url, timeout)] = client
        return client


#: ``user:password@`` after a ``/`` or ``:`` (also in malformed URLs such as ``redis//u:p@h``
#: and passwords holding an unencoded ``/`` or a quote), up to the last ``@`` before a space.
_USERINFO = re.compile(r"(?<=[/:])(?!/)\S*@")
#: ``user:pass word@`` right after ``://``: a password holding a space (redis-py accepts it).
_SPACED_USERINFO = re.compile(r"(?<=://)[^/\n]*@")
#: A password's value in a query string or a message: ``password=``, ``sentinel_password=``
#: and misspellings (``pasword=``, ``passwd=``, ``pwd=``).
_PASSWORD_PARAM = re.compile(r"(\w*(?:pa?s+w|pwd)\w*=)[^&\s]*", re.IGNORECASE)
#: A URL's scheme.
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:/+", re.IGNORECASE)


def redact(text: Any) -> str:
    """``text`` (a URL, a list of them, a message) with anything like credentials hidden.

    ``redis://user:secret@host:6379/0`` becomes ``redis://***@host:6379/0``; so do malformed
    forms (``redis//u:pw@h``, ``redis:/u:pw@h``, ``redis://u:p/w@h``, ``redis://u:p w@h``), and
    secret-looking query values (``password=``, ``pasword=``...) become ``***``. It errs on the
    side of hiding: in a message where a URL without a path is followed by an ``@`` on the same
    line, the text between is hidden. A text that is one URL: see :func:`redact_url`.
    """
    # Query values first: an ``@`` in one (``?password=p@ss``) would else pass for the end of
    # a ``user:password@`` part, and the rest of the value would be shown.
    hidden = _PASSWORD_PARAM.sub(r"\1***", str(text))
    return _USERINFO.sub("***@", _SPACED_USERINFO.sub("***@", hidden))


def redact_url(url: str) -> str:
    """One URL with its credentials hidden: everything from its scheme to its last ``@`` (a
    password holding ``/``, a space and ``@`` together included), then :func:`redact`."""
    url = _PASSWORD_PARAM.sub(r"\1***", url)
    scheme = _SCHEME.match(url)
    if scheme is not None and "@" in url:
        url = f"{scheme.group(0)}***@{url.rpartition('@')[2]}"
    return redact(url)


_LOCALHOST = {"localhost": "127.0.0.1", "::1": "127.0.0.1"}


def node_identity(url: str) -> tuple[Any, ...]:
    """What makes two URLs the same Redis server: scheme family, hosts and ports (or socket
    path). Not the database: two databases of one server fail together, so a quorum that
    listed ``/0``, ``/1`` and ``/2`` of one port would lose all its "nodes" in one crash.

    Parses ``url`` as :func:`client_for` would, without connecting; raises :class:`ValueError`
    (see :func:`validate_url`) for a URL that no client could be built from.
    """
    validate_url(url)
    scheme = url.partition("://")[0]
    if scheme.endswith(("+sentinel", "+cluster")):
        _, nodes, path, _ = _split(url)
        hosts = tuple(sorted((_LOCALHOST.get(h.lower(), h.lower()), p) for h, p in nodes))
        return (scheme.rpartition("+")[2], hosts, *path)
    kwargs = redis_py.connection.parse_url(url)
    if "path" in kwargs:
        return ("unix", kwargs["path"])
    host = str(kwargs.get("host") or "localhost").lower()
    return ("tcp", _LOCALHOST.get(host, host), int(kwargs.get("port") or 6379))


def check_member(item: Any) -> None:
    """Raise :class:`ValueError` if ``item`` (a URL or a client) cannot be one node of a
    quorum: a Redis Cluster is many nodes, each holding part of the keys (listed as one, every
    lock operation failed with an ``AttributeError`` of its client)."""
    if isinstance(item, str):
        if not item.partition("://")[0].endswith("+cluster"):
            return
        shown = repr(redact_url(item))
    elif is_cluster(item):
        shown = f"a {type(item).__name__} client"
    else:
        return
    raise ValueError(
        f"a Redlock quorum's nodes are single servers, and {shown} is a Redis Cluster: list "
        "independent servers (redis://, rediss://, unix://, a Sentinel's primary), or give the "
        "Cluster alone"
    )


def check_distinct(items: Sequence[Any]) -> None:
    """Raise :class:`ValueError` if a quorum's list names one node twice (two URLs of one
    database, or one client object twice): its acquisitions would compete with themselves,
    and it would never hold the lock, reporting its own attempt as the holder."""
    seen: dict[Any, Any] = {}
    for item in items:
        identity = node_identity(item) if isinstance(item, str) else _client_identity(item)
        if identity in seen:
            shown = [
                redact_url(x) if isinstance(x, str) else type(x).__name__
                for x in (seen[identity], item)
            ]
            raise ValueError(
                f"a Redlock quorum lists the same node twice ({shown[0]} and {shown[1]}); it "
                "needs independent nodes, each once"
            )
        seen[identity] = item


def check_timeouts(items: Sequence[Any], node_timeout: float) -> None:
    """Raise :class:`ValueError` if a quorum's list holds a client without a socket timeout
    (redis-py before 8 builds them so by default); log a WARNING for one whose timeout is
    longer than the quorum's ``node_timeout`` (from redis-py 8 the default is 5 s).

    Such a client waits for a node that stops answering without closing its connections (a
    frozen process, a network partition) as long as its timeout says, forever without one,
    and the quorum's calls with it. Timeline, with three ``redis.Redis(port=...)`` clients of
    redis-py 5: (1) node A freezes; (2) a renewal's reply from A is awaited the quorum's
    0.5 s, and its connection dropped; (3) the next renewal reconnects to A, and its
    handshake is awaited forever: the lock was lost with two of three nodes up, and every
    acquire hung. With redis-py 8's defaults each reconnect waits 5 s per try, retried 3
    times: past a renewal's lease. A URL's client is built with the quorum's timeout, and no
    retries."""
    for item in items:
        if isinstance(item, str):
            continue
        timeout = _socket_timeout(item)
        if timeout is None:
            raise ValueError(
                f"the Redlock quorum's client of {node_name(item)} has no socket timeout: it "
                "would wait forever for a node that stops answering (a frozen process, a "
                "network partition), and so would the lock, with a majority up; pass the "
                "nodes' URLs, or clients with socket_timeout=0.5 and retry=Retry(NoBackoff(), 0)"
            )
        if isinstance(timeout, (int, float)) and timeout > node_timeout and _first_warning(item):
            logger.warning(
                "the Redlock quorum's client of %s has a socket timeout of %gs, longer than "
                "the quorum's %gs: a node that stops answering holds each lock call up to "
                "that long at its reconnect, times the client's retries, and a lock can be "
                "lost with a majority up; pass the nodes' URLs, or clients with "
                "socket_timeout=%g and retry=Retry(NoBackoff(), 0)",
                node_name(item),
                timeout,
                node_timeout,
                node_timeout,
            )


def _first_warning(client: Any) -> bool:
    """Whether ``client`` was not warned of yet (once per client: a ``Lock`` may be built per
    call)."""
    try:
        if client in _warned:
            return False
        _warned.add(client)
    except TypeError:  # not weakly referenceable, or unhashable: warned each time
        pass
    return True


_warned: weakref.WeakSet[Any] = weakref.WeakSet()


def _socket_timeout(client: Any) -> object:
    """The socket timeout ``client``'s connections get: its pool's setting, else the default
    of its connection class (5 s from redis-py 8, none before); :data:`_UNKNOWN` when the
    client does not say (a proxy, a client of another kind)."""
    pool: Any = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return _UNKNOWN
    if "socket_timeout" in kwargs:
        return kwargs["socket_timeout"]
    try:
        parameter = inspect.signature(pool.connection_class).parameters["socket_timeout"]
    except (AttributeError, KeyError, TypeError, ValueError):
        return _UNKNOWN
    return _UNKNOWN if parameter.default is inspect.Parameter.empty else parameter.default


_UNKNOWN = object()


def _client_identity(client: Any) -> tuple[Any, ...]:
    """What :func:`node_identity` says of a URL, for a client of one server (its pool's
    ``host`` and ``port``, or socket ``path``); the object itself for any other."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    if "path" in kwargs:
        return ("unix", kwargs["path"])
    if "host" in kwargs:
        host = str(kwargs["host"]).lower()
        return ("tcp", _LOCALHOST.get(host, host), int(kwargs.get("port") or 6379))
    return ("client", id(client))


#: ``ssl.CERT_*`` as a URL spells it (``None``: no verification, as redis-py reads it).
_CERT_REQS_VALUES = {
    ssl.CERT_NONE: "none",
    ssl.CERT_OPTIONAL: "optional",
    ssl.CERT_REQUIRED: "required",
    None: "none",
}


def _tls_value(key: str, value: Any) -> str | None:
    """``value`` as a URL query value; ``None`` if a URL cannot carry it (redis-py parses
    strings, and booleans only for the keys it reads as booleans)."""
    if key == "ssl_cert_reqs":
        if isinstance(value, str):
            return value.lower().removeprefix("cert_")
        return _CERT_REQS_VALUES.get(value)
    if isinstance(value, bool):
        parser = redis_py.connection.URL_QUERY_ARGUMENT_PARSERS.get(key)
        return str(value).lower() if parser is redis_py.connection.to_bool else None
    return value if isinstance(value, str) else None


#: ``ssl_cert_reqs`` in a URL's query as Celery and kombu spell it (the :mod:`ssl` constants'
#: names, ``CERT_NONE``), or in another case (``Required``); redis-py takes ``none``,
#: ``optional`` and ``required`` only.
_CELERY_CERT_REQS = re.compile(
    r"(?<![^&])(ssl_cert_reqs=)(?:cert_)?(none|optional|required)(?=&|$)", re.IGNORECASE
)


def redis_py_spelling(url: str) -> str:
    """``url`` with its ``ssl_cert_reqs`` value as redis-py spells it: Celery's and kombu's
    ``CERT_NONE``, ``CERT_OPTIONAL``, ``CERT_REQUIRED`` (any case) become ``none``,
    ``optional``, ``required``. A broker URL is reused, and copied, as the lock's URL, and
    redis-py refuses those spellings ("Invalid SSL Certificate Requirements Flag: CERT_NONE").
    Anything else in ``url`` is left as it is, byte for byte."""
    query = urlsplit(url).query
    if "ssl_cert_reqs=" not in query.lower():
        return url
    start = url.index("?") + 1  # a query starts at the first "?": no part before holds one
    spelled = _CELERY_CERT_REQS.sub(lambda m: m[1] + m[2].lower(), query)
    return url[:start] + spelled + url[start + len(query) :]


def with_tls(url: str, tls: Any) -> str:
    """``url`` as ``rediss://`` with the TLS options ``tls`` (Celery's ``broker_use_ssl``: a
    dict, or ``True``) as query options; they win over the same options in the URL, as in
    kombu, and a ``None`` value is left out (``ssl_cert_reqs=None``: ``none``). Raises
    :class:`ValueError` for options no URL can carry (a unix socket, a value that is not a
    string); :func:`validate_url` then refuses keys redis-py does not take."""
    if tls is True:
        tls = {}
    if not isinstance(tls, dict) or url.startswith("unix://"):
        raise ValueError(f"broker_use_ssl={redact(repr(tls))} cannot travel with a {url[:7]} URL")
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key, value in tls.items():
        shown = _tls_value(key, value)
        if shown is not None:
            query[key] = shown
        elif value is not None or key == "ssl_cert_reqs":
            raise ValueError(f"broker_use_ssl[{key!r}] is a {type(value).__name__}")
    return urlunsplit(("rediss", parts.netloc, parts.path, urlencode(query), parts.fragment))


def _did_you_mean(pool: Any, exc: TypeError) -> str:
    """``; did you mean 'ssl_ca_certs'?`` for a query option redis-py refused (``exc``) that
    is close to one its connection class takes (``?ssl_ca_cert=``), or ``""``."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if found is None:
        return ""
    known = {
        name
        for cls in pool.connection_class.__mro__
        if "__init__" in vars(cls)
        for name in inspect.signature(vars(cls)["__init__"]).parameters
    }
    close = difflib.get_close_matches(found[1], sorted(known - {"self"}), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


#: Query options of the Sentinel and Cluster forms (the plain forms take redis-py's).
_TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)
#: A URL that decides on the host name check itself, or turns certificate checks off.
_HOSTNAME_SET = re.compile(r"[?&](ssl_cert_reqs=(cert_)?none|ssl_check_hostname=)", re.IGNORECASE)
_CERT_REQS = tuple(dict.fromkeys(_CERT_REQS_VALUES.values()))


#: The query options of a URL that name files.
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


def missing_files(url: str) -> list[str]:
    """The TLS files ``url`` names that do not exist here, as ``name=path``: its connections
    fail with "No such file or directory", which names no file. Not refused with the URL: a
    process that only publishes (a web process) may lack the files its workers have."""
    return [
        f"{name}={path}"
        for name, path in parse_qsl(urlsplit(url).query)
        if name in _TLS_FILES and not os.path.exists(path)
    ]


def missing_tls_files(target: Any, error: BaseException) -> list[str]:
    """The TLS files that ``target`` (a URL or a client) was given and that do not exist here,
    as ``name=path``, when ``error`` is a file not found (else none): redis-py's "Error 2
    connecting to ... No such file or directory." names no file."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, FileNotFoundError):
        cause = cause.__cause__ or cause.__context__
    if cause is None and "No such file or directory" not in str(error):
        return []
    if isinstance(target, str):
        return missing_files(target)
    kwargs = getattr(getattr(target, "connection_pool", None), "connection_kwargs", None) or {}
    return [
        f"{name}={kwargs[name]}"
        for name in _TLS_FILES
        if isinstance(kwargs.get(name), str) and not os.path.exists(kwargs[name])
    ]


def gives_client_cert(url: str) -> bool:
    """Whether ``url`` gives a TLS client certificate (``ssl_certfile``)."""
    return any(name == "ssl_certfile" for name, _ in parse_qsl(urlsplit(url).query))


def validate_url(url: str) -> None:
    """Raise :class:`ValueError` if no client could be built from ``url``; never connects.

    Caught here, not at the first lock: a scheme this package does not build clients for, a
    ``user:password`` holding an unencoded ``/`` or ``#`` (it would be read as the path), a
    port or database that is not a number, a query option redis-py does not take
    (``?sockettimeout=3``, or ``ssl_*`` without ``rediss://``) or a bad value of one
    (``ssl_cert_reqs=maybe``), a Sentinel URL
    without its service, and Celery's ``;``-separated failover form or a comma-separated list
    (a quorum is a list). The message never contains the credentials. Celery's spelling of
    ``ssl_cert_reqs`` (``CERT_NONE``) is taken, as :func:`redis_py_spelling` says it.
    """
    url = redis_py_spelling(url)
    if not url.startswith(SCHEMES):
        raise ValueError(f"the scheme is not one of {', '.join(s[:-3] for s in SCHEMES)}")
    if url != url.strip(" "):  # a line break is dropped by urlsplit and redis-py; a space not
        raise ValueError("it starts or ends with a space")
    if re.search(r";\s*[a-z+]+://", url):
        raise ValueError(
            "it holds ';' (Celery's failover form): give one URL, or a quorum as a list of URLs"
        )
    if re.search(r",\s*[a-z+]+://", url):
        raise ValueError("it holds several URLs: give a quorum as a list of URLs, not one string")
    parts = urlsplit(url)
    # "redis://u:p?w@h" puts "w@h" in the query: an '@' before its first '=' was no option's.
    in_query = "@" not in parts.netloc and "@" in parts.query.split("=", 1)[0]
    if parts.scheme != "unix" and ("@" in parts.path or "@" in parts.fragment or in_query):
        raise ValueError(
            "its user name or password holds '/', '?' or '#': percent-encode them (%2F, %3F, %23)"
        )
    scheme = parts.scheme
    if scheme.endswith(("+sentinel", "+cluster")):
        _validate_multi_host(url, scheme)
        return
    try:
        port = parts.port
    except ValueError:
        raise ValueError("its port is not a number") from None
    if port == 0:
        raise ValueError("its port is 0, which no server listens on")
    # redis-py reads the digits between the slashes (kombu's ``redis://host:6379//`` is 0).
    if scheme != "unix" and not re.fullmatch(r"/*(\d+/*)?", parts.path):
        raise ValueError(f"its database {parts.path!r} is not a number (redis://host:port/<db>)")
    try:
        pool = redis_py.ConnectionPool.from_url(url)
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        if scheme == "redis" and "'ssl" in str(exc):
            raise ValueError(f"TLS options need a rediss:// URL ({exc})") from None
        raise ValueError(
            f"a query option is not one redis-py takes ({exc}){_did_you_mean(pool, exc)}"
        ) from None
    except (ValueError, redis_py.exceptions.RedisError) as exc:
        raise ValueError(f"a query option has a bad value ({redact(exc)})") from None
    given = pool.connection_kwargs
    if scheme == "unix" and not given.get("path"):
        raise ValueError("it names no socket path (unix:///path/to/redis.sock)")
    for option in ("socket_timeout", "socket_connect_timeout"):
        value = given.get(option)
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"its {option} is {value}; expected seconds > 0")


def _validate_multi_host(url: str, scheme: str) -> None:
    try:
        auth, nodes, path, query = _split(url)
    except ValueError:
        raise ValueError("a port is not a number") from None
    if not all(host for host, _ in nodes):
        raise ValueError("a host is missing (host:port[,host:port...])")
    accepted = []
    if scheme.endswith("+sentinel"):
        accepted = ["sentinel_username", "sentinel_password"]
        if scheme.startswith("rediss"):
            accepted.append("sentinel_ssl")
    unknown = sorted(set(query) - set(accepted))
    if unknown:
        if scheme.startswith("rediss"):
            accepted += _TLS_OPTIONS
        raise ValueError(
            f"query option {unknown[0]!r} is not taken by a {scheme}:// URL "
            f"(it takes {', '.join(accepted) or 'none'})"
        )
    if query.get("sentinel_ssl", "false").lower() not in ("true", "false"):
        raise ValueError("sentinel_ssl takes true or false")
    if auth.get("ssl_cert_reqs", "none") not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs takes {', '.join(_CERT_REQS)}")
    if scheme.endswith("+cluster"):
        if path not in ([], ["0"]):
            raise ValueError("a Redis Cluster has database 0 only: end the URL at host:port/")
    elif not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(
            f"a {scheme}:// URL names the service and may name a database: .../<service>[/<db>]"
        )


def _connect(url: str, options: dict[str, Any]) -> Any:
    scheme, _, _ = url.partition("://")
    if scheme.endswith("+sentinel"):
        return _sentinel(url, options)
    if scheme.endswith("+cluster"):
        return _cluster(url, options)
    pool = WaitingPool.from_url(url, max_connections=MAX_CONNECTIONS, **options)
    pool.timeout = pool.connection_kwargs.get("socket_timeout") or 5.0  # the URL's, if it gives one
    return redis_py.Redis(connection_pool=pool)


def _split(url: str) -> tuple[dict[str, Any], list[tuple[str, int]], list[str], dict[str, str]]:
    """Credentials and TLS options, ``(host, port)`` list, path parts, and other query items."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    auth: dict[str, Any] = {}
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            auth["username"] = unquote(user)
        if password:
            auth["password"] = unquote(password)
    query = dict(parse_qsl(parts.query))
    if parts.scheme.startswith("rediss"):
        auth["ssl"] = True
        for name in _TLS_OPTIONS:
            if name in query:
                auth[name] = query.pop(name)
        if "ssl_check_hostname" in auth:
            auth["ssl_check_hostname"] = redis_py.connection.to_bool(auth["ssl_check_hostname"])
    nodes = [_host_port(item) for item in hosts.split(",")]
    return auth, nodes, [p for p in parts.path.split("/") if p], query


def _host_port(item: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; port 0 stands for the default."""
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", item)
    if bracketed:
        host, port = bracketed[1], bracketed[2]
    else:
        host, colon, after = item.partition(":")
        port = after if colon else None
    return host, 0 if port is None else int(port)


def _sentinel(url: str, options: dict[str, Any]) -> Any:
    auth, nodes, path, query = _split(url)  # checked by validate_url: path is [service, db?]
    sentinels = [(host, port or 26379) for host, port in nodes]
    # No retries per Sentinel (redis-py's default is 10, with backoff): discover_master already
    # tries each Sentinel in turn, and a dead one must not cost seconds of every operation.
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": options["socket_timeout"],
        "socket_connect_timeout": options["socket_connect_timeout"],
        "retry": Retry(NoBackoff(), 0),
    }
    for name in ("username", "password"):
        if f"sentinel_{name}" in query:
            sentinel_kwargs[name] = query.pop(f"sentinel_{name}")
    # TLS to the Sentinels too, with the URL's certificates, only when asked: redis-py's and
    # kombu's Sentinel clients reach them over plain TCP, as many deployments serve them.
    if query.pop("sentinel_ssl", "false").lower() == "true":
        sentinel_kwargs.update({k: v for k, v in auth.items() if k.startswith("ssl")})
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs, **options)
    db = int(path[1]) if len(path) > 1 else 0
    return sentinel.master_for(path[0], db=db, **auth, **options)


def _cluster(url: str, options: dict[str, Any]) -> Any:
    auth, nodes, _, _ = _split(url)
    startup = [ClusterNode(host, port or 6379) for host, port in nodes]
    return RedisCluster(startup_nodes=startup, **auth, **_no_cluster_retries(), **options)


def _no_cluster_retries() -> dict[str, Any]:
    """No retries of a command by the Cluster client: a failed command fails at once, and the
    topology refresh it asked for serves the next one. redis-py's default (3 retries with
    backoff, from 6.0 in ``retry``, before in ``cluster_error_retry_attempts``) blocked a
    command to a dead primary about 4.5 s, refused connections and all. Timeline, when one
    thread renewed a process's locks in turn: (1) one of three primaries dies, the others
    serve their slots; (2) each renewal on the dead node blocks 4.5 s; (3) with three of them,
    the locks on the live primaries went unrenewed past their lease, and calls of their keys
    ran beside them. (Renewals run concurrently now; an acquire or a release on the dead node
    would still wait those 4.5 s.) Our own layer retries: a renewal within the lease, an
    acquire by ``redlock_on_unavailable``."""
    if int(redis_py.__version__.split(".")[0]) >= 6:
        return {"retry": Retry(NoBackoff(), 0)}
    return {"retry": Retry(NoBackoff(), 0), "cluster_error_retry_attempts": 0}


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (redis-py's or a fork's, sync or asyncio)."""
    return any(cls.__name__ in ("RedisCluster", "ValkeyCluster") for cls in type(client).__mro__)


def gives_cert(client: Any) -> bool | None:
    """Whether ``client`` gives a TLS client certificate; ``None`` for a Cluster client."""
    if is_cluster(client):
        return None
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return bool(kwargs.get("ssl_certfile"))


def uses_tls(client: Any) -> bool | None:
    """Whether ``client`` connects over TLS; ``None`` for a Cluster client (one pool per node)."""
    if is_cluster(client):
        return None
    connection = getattr(getattr(client, "connection_pool", None), "connection_class", object)
    return any("SSL" in cls.__name__ for cls in connection.__mro__)


def node_name(client: Any) -> str:
    """``host:port`` (or socket path) of a client, for messages; never includes credentials."""
    if is_cluster(client):  # an asyncio client knows its nodes once it has connected
        manager = getattr(client, "nodes_manager", None)
        nodes = client.get_nodes() or list(getattr(manager, "startup_nodes", {}).values())
        return ",".join(f"{n.host}:{n.port}" for n in nodes) or "cluster"
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:
        return f"sentinel service {service}"
    kwargs = getattr(pool, "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


#: Modules whose clients send commands synchronously (redis-py's and valkey's).
_SYNC_MODULES = frozenset({"redis.client", "redis.cluster", "valkey.client", "valkey.cluster"})


def check_client(client: Any, *, asyncio: bool) -> Any:
    """``client``; :class:`TypeError` when it is no client (``5``, ``None``: it would fail at
    the first command with an :class:`AttributeError`; a pipeline, which queues its commands
    and failed at the first acquire with a ``TypeError`` naming no argument), or of the other
    kind than the lock's (an asyncio client for the thread lock, whose commands would be
    unawaited coroutines; a blocking one for the asyncio lock, which would block the loop,
    take the lock, then fail)."""
    kind = "celery_redlock.asyncio.Lock" if asyncio else "celery_redlock.Lock"
    if isinstance(client, type):  # its execute_command is callable: it passed as a proxy
        raise TypeError(
            f"{kind} needs a Redis URL or a client, got the class "
            f"{client.__module__}.{client.__qualname__}: pass an instance, "
            f"{client.__qualname__}(...)"
        )
    if isinstance(client, (bytes, bytearray)):
        raise TypeError(
            f"{kind} needs a Redis URL as a str, got {type(client).__name__}: decode it"
        )
    if any(c.__name__.endswith("Pipeline") for c in type(client).__mro__):
        raise TypeError(
            f"{kind} needs a Redis URL or a client, got a pipeline "
            f"({type(client).__module__}.{type(client).__qualname__}), whose commands are "
            "queued, not sent: pass the client it came from"
        )
    definer = next((c for c in type(client).__mro__ if "execute_command" in vars(c)), None)
    if definer is None and callable(getattr(client, "execute_command", None)):
        return client  # a proxy of a client (wrapt, celery.local.Proxy): its kind is not told
    if definer is None:  # not a client at all: it would fail at the first command
        example = "redis.asyncio.Redis" if asyncio else "redis.Redis"
        raise TypeError(
            f"{kind} needs a Redis URL, a client ({example}) or a list of them for a quorum, "
            f"got {type(client).__qualname__}"
        )
    coroutine = inspect.iscoroutinefunction(vars(definer)["execute_command"])
    if asyncio and not coroutine and definer.__module__ in _SYNC_MODULES:
        wanted, other = "an asyncio client (redis.asyncio.Redis, valkey.asyncio.Valkey)", "Lock"
    elif not asyncio and coroutine:
        wanted, other = "a blocking client (redis.Redis, valkey.Valkey)", "asyncio.Lock"
    else:
        return client
    raise TypeError(
        f"{kind} needs a URL or {wanted}, got {type(client).__module__}."
        f"{type(client).__qualname__}: use celery_redlock.{other} with it"
    )
