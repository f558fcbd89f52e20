"""One command on a synchronous client: the lock's round trips, with as little Python as
redis-py allows.

:func:`execute` is what the thread lock sends every command with. redis-py's
``Redis.execute_command`` costs, per command, about as many instructions as packing, sending
and parsing it (a retry closure, the maintenance-notification and ``HIMPORT`` checks, the
reply callbacks, two metrics calls that do nothing unless redis-py's observability is on).
A task lock makes two commands per execution, so that is a third of what locking adds to a
task. So, on a plain client, :func:`execute` takes a connection from the client's pool, sends
the command, reads the reply and gives the connection back, all through the pool's and the
connection's public methods, as ``execute_command`` does.

It goes through ``execute_command`` instead, unchanged, whenever the direct path would skip
something a user set up:

* the client is not a plain ``redis.Redis`` or ``valkey.Valkey`` (a Cluster client, an
  asyncio client, a subclass that overrides ``execute_command``);
* ``execute_command`` is wrapped (OpenTelemetry's and Sentry's Redis instrumentations wrap
  it on the class; a wrapper is not a plain function), or replaced on the instance;
* the client has one dedicated connection (``single_connection_client=True``);
* redis-py's own observability is enabled (its command metrics are recorded there).

Errors: a reply error (``NOSCRIPT``, ``OOM``, ``NOPERM``...) is raised as redis-py raises it,
and the connection goes back to the pool. A connection error or time-out on the direct path
disconnects that connection (``send_packed_command``/``read_response`` do). It is raised as
it is, as ``execute_command`` raises it, unless the client's retry policy retries that error
(the connection's ``retry_on_error``, e.g. ``retry_on_timeout=True``): then the command is
sent again through ``execute_command``, which applies the policy, and is tried once more than
the policy alone would. A server that stops answering costs one socket timeout, as with
``execute_command``, not two. A command the server may have run before its reply was lost is
seen as today by the callers (the acquire sees its own token as the holder, and the core's
checks decide).

``tests/integration/test_commands.py`` pins the direct path and each case above on every
redis-py and valkey version of the test matrix (redis-py's observability where it has one:
redis-py >= 7.1 with ``opentelemetry-sdk``).
"""

from __future__ import annotations

import inspect
from types import FunctionType
from typing import Any

from . import scripts as _scripts
from .core import Outcome, classify

#: Per client class: its library's own ``execute_command`` (the direct path is taken only while
#: the class still has it), or ``None`` for a class that never takes it.
_plain: dict[type, Any] = {}

#: Per pool class: whether ``get_connection`` wants a command name (redis-py < 5.3, valkey).
_named: dict[type, bool] = {}

#: ``(module, qualified name)`` of the ``execute_command`` functions the direct path stands for.
_LIBRARY_METHODS = {
    ("redis.client", "Redis.execute_command"),
    ("valkey.client", "Valkey.execute_command"),
}


def _plain_method(cls: type) -> Any:
    """``cls.execute_command`` if it is the library's own function, else ``None``: a wrapper
    is not a plain function (wrapt's proxies), or has ``__wrapped__`` (``functools.wraps``,
    which also copies the name and module)."""
    method = getattr(cls, "execute_command", None)
    if (
        type(method) is FunctionType
        and not hasattr(method, "__wrapped__")
        and (method.__module__, method.__qualname__) in _LIBRARY_METHODS
    ):
        return method
    return None


def _observed() -> bool:
    """Whether redis-py's observability records command metrics (redis-py >= 7.1)."""
    return _observability is not None and _observability().is_enabled()


_observability: Any
try:
    from redis.observability.providers import get_observability_instance as _observability
except ImportError:  # redis-py < 7.1, valkey: no command metrics of their own
    _observability = None


def connection_of(pool: Any, command: str = "EVALSHA") -> Any:
    """A connected connection from ``pool`` (redis-py < 5.3 and valkey want the command's
    name; whether a pool class does is read from its signature once)."""
    cls = type(pool)
    named = _named.get(cls)
    if named is None:
        parameters = list(inspect.signature(cls.get_connection).parameters.values())[1:]
        named = _named[cls] = bool(parameters) and parameters[0].default is parameters[0].empty
    return pool.get_connection(command) if named else pool.get_connection()


def execute(client: Any, *args: Any, **options: Any) -> Any:
    """``client.execute_command(*args, **options)``: the reply as the connection reads it.

    ``options`` go to ``execute_command`` only (redis-py's reply callbacks read them); the
    caller passes those that make the callback return the reply unchanged (``get=True`` for
    ``SET ... GET``), so both paths give the same value.
    """
    cls = type(client)
    method = _plain.get(cls, False)
    if method is False:
        method = _plain[cls] = _plain_method(cls)
    if (
        method is None
        or cls.execute_command is not method
        or "execute_command" in client.__dict__
        or client.connection is not None
        or _observed()
    ):
        return client.execute_command(*args, **options)
    pool = client.connection_pool
    connection = connection_of(pool, args[0])
    try:
        connection.send_packed_command((pack(connection.encoder, args),))
        reply = connection.read_response()
    except Exception as exc:
        retried = tuple(getattr(connection, "retry_on_error", None) or ())
        if classify(exc) is not Outcome.UNAVAILABLE or not isinstance(exc, retried):
            raise
    else:
        return reply
    finally:
        pool.release(connection)
    return client.execute_command(*args, **options)


def pack(encoder: Any, args: tuple[Any, ...]) -> bytes:
    """``args`` as one RESP request (an array of bulk strings), text encoded as ``encoder``
    (the connection's: the client's ``encoding`` and ``encoding_errors``) encodes it.

    What redis-py's Python packer sends for the same arguments, for the commands of one word
    and the argument types this package sends (``str``, ``int``, ``bytes``); it skips that
    packer's chunking of values over 6 kB (a lock's arguments are short) and its checks for
    other types, which cost as much as the round trip's own Python. Anything else is a
    :class:`TypeError` (a bug here, not a user's input).

    Short ASCII text and integers (command names, flags, script digests, TTLs: most of a
    request, the same on every call) are packed once per encoding and kept, at most
    :data:`PACKED_MAX` of each per encoding; formatting bytes costs more than the rest of
    the packing (about 2,500 instructions an argument). Keys and owner tokens are longer than
    :data:`PACKED_TEXT_MAX` and are never kept: their length lines come from
    :data:`_LENGTHS`, and UTF-8 text is encoded by ``str.encode``'s default path.
    """
    encoding, errors = encoder.encoding, encoder.encoding_errors
    kept = _packed.get(encoding)
    if kept is None:
        kept = _packed.setdefault(encoding, ({}, {}))
    texts, numbers = kept
    utf8 = encoding == "utf-8" and errors == "strict"
    count = len(args)
    parts = [_ARRAYS[count] if count < LENGTHS_KEPT else b"*%d\r\n" % count]
    for arg in args:
        kind = type(arg)
        if kind is str:
            packed = texts.get(arg)
            if packed is None:
                data = arg.encode() if utf8 else arg.encode(encoding, errors)
                if len(arg) <= PACKED_TEXT_MAX and len(texts) < PACKED_MAX and arg.isascii():
                    packed = texts[arg] = b"$%d\r\n%s\r\n" % (len(data), data)
                else:
                    size = len(data)
                    parts += (
                        _LENGTHS[size] if size < LENGTHS_KEPT else b"$%d\r\n" % size,
                        data,
                        CRLF,
                    )
                    continue
        elif kind is int:
            packed = numbers.get(arg)
            if packed is None:
                data = b"%d" % arg
                packed = b"$%d\r\n%s\r\n" % (len(data), data)
                if len(numbers) < PACKED_MAX:
                    numbers[arg] = packed
        elif kind is bytes:
            size = len(arg)
            parts += (_LENGTHS[size] if size < LENGTHS_KEPT else b"$%d\r\n" % size, arg, CRLF)
            continue
        else:
            raise TypeError(f"cannot send a {kind.__name__} argument: {arg!r}")
        parts.append(packed)
    return b"".join(parts)


#: :func:`pack`'s kept arguments per encoding: (text, integers), each ``{argument: packed}``.
_packed: dict[str, tuple[dict[str, bytes], dict[int, bytes]]] = {}
#: The most arguments of each kind :func:`pack` keeps per encoding.
PACKED_MAX = 256
#: The longest text :func:`pack` keeps (a script's SHA-1 digest: 40 characters).
PACKED_TEXT_MAX = 40
#: Sizes below this have their RESP length lines made once: ``_LENGTHS[n]`` is ``$<n>\r\n``
#: (a bulk string's) and ``_ARRAYS[n]`` is ``*<n>\r\n`` (a request's).
LENGTHS_KEPT = 1024
_LENGTHS = tuple(b"$%d\r\n" % n for n in range(LENGTHS_KEPT))
_ARRAYS = tuple(b"*%d\r\n" % n for n in range(LENGTHS_KEPT))
CRLF = b"\r\n"


def run_script(client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
    """Run ``source`` with ``EVALSHA``; after a ``NOSCRIPT`` reply (a server that restarted or
    ran ``SCRIPT FLUSH``), ``SCRIPT LOAD`` it and run it again (not ``EVAL``: an ACL user may
    have ``+evalsha +script|load`` only). Any redis-py-like client (``valkey`` too).

    On a Cluster the script is loaded on the node of its keys only (:func:`load_target`)."""
    sha = _scripts.sha1(source)
    try:
        return execute(client, "EVALSHA", sha, len(keys), *keys, *args)
    except Exception as exc:
        if classify(exc) is not Outcome.NOSCRIPT:
            raise
    client.execute_command("SCRIPT LOAD", source, **load_target(client, keys))
    return execute(client, "EVALSHA", sha, len(keys), *keys, *args)


def load_target(client: Any, keys: list[str]) -> dict[str, Any]:
    """Where ``SCRIPT LOAD`` goes for a script of ``keys``: on a Cluster client (sync or
    asyncio), the node that serves their slot; else the client's one server. A Cluster
    client sends ``SCRIPT LOAD`` to every primary by default. Timeline: (1) one of three
    primaries dies, the others serve their slots (full coverage off); (2) a task on a live
    primary releases its lock, the first release of this process; (3) ``NOSCRIPT``, then the
    load failed on the dead primary, and the release with it: the key stayed held by a task
    that had ended until its lease ran out."""
    node_of = getattr(client, "get_node_from_key", None)
    return {"target_nodes": node_of(keys[0])} if node_of is not None and keys else {}
