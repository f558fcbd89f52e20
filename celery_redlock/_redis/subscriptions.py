"""Release notifications: the pub/sub connections blocking waiters listen on.

A blocking waiter listens on a channel (a lock's release channel, or a queued waiter's own:
:data:`~celery_redlock._redis.scripts.WAIT`) and must not miss a message sent after its next
try, so it waits for the server's ``subscribe`` confirmation first.

* Threads: each wait holds a ``PubSub`` of its own, on a pool apart from the lock's
  (:func:`subscriber_of`); one whose wait ended is set aside for the next wait of the process
  within :data:`IDLE_REUSE` seconds (:func:`subscribe`, :func:`set_aside`).
* asyncio: one ``PubSub`` per event loop and client carries the channels of every waiting task
  (:class:`Hub`): 200 waiters cost one connection, not 200, and a release reaches the waiter
  it hands the lock to without waking the others. A connection idle for more than
  :data:`IDLE_REUSE` seconds serves no new wait: cut meanwhile (a proxy's idle timeout,
  ``CLIENT KILL``), it would be reconnected by redis-py while the next wait subscribes on it,
  which lost that wait's ``SUBSCRIBE`` (a release missed for :data:`SUBSCRIBE_TIMEOUT`) or
  failed it with a ``RuntimeError`` (two reads at once; now a connection error, after which
  the waiters subscribe again). Back-to-back waits share one connection.

No ``UNSUBSCRIBE`` is ever sent (an ACL user may lack it): a connection keeps the dead
channels of earlier waits, on which nothing is published again, and is closed once it carries
too many.

This module never imports Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import redis as redis_py

from .clients import as_text
from .core import classify
from .forks import Guard
from .owner import current_pid
from .pools import WaitingPool


def on(message: dict[str, Any], channel: str) -> bool:
    """Whether a pub/sub ``message`` came on ``channel`` (bytes, or str with decoded replies)."""
    return as_text(message["channel"]) == channel


# -- threads -------------------------------------------------------------------------------------

_subscribers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_subscribers_guard = Guard()


def subscriber_of(client: Any) -> Any:
    """A client like ``client`` on a connection pool of its own, for subscriptions.

    Closing a subscription disconnects its connection and hands it back to its pool. In the
    lock's own pool the next command, the waiter's release once it has run, would then
    connect again (a TCP connect and the handshake: round trips on the path to the next
    waiter), and a pool with ``max_connections`` would be used up by the waiters, each holding
    a connection for its whole wait: a waiter found it exhausted on a healthy server. Plain and
    blocking pools (TCP, TLS, Unix socket) of redis-py and valkey, and the pool of a client built
    from a URL (:class:`~.pools.WaitingPool`), are copied, as a plain pool;
    any other (Sentinel) is used as it is.
    """
    pool: Any = getattr(client, "connection_pool", None)
    library = _plain_pool_library(pool)
    if library is None:
        return client
    with _subscribers_guard:
        subscriber = _subscribers.get(client)
        if subscriber is None:
            plain = sys.modules[f"{library}.connection"].ConnectionPool
            # Unbounded, as the waiters are (by the threads that wait): redis-py 8 bounds a
            # plain pool at 100 by default, and its 101st waiter failed as "pool exhausted".
            own = plain(
                connection_class=pool.connection_class,
                max_connections=2**31,
                **pool.connection_kwargs,
            )
            client_type = getattr(sys.modules[library], _CLIENTS[library])
            subscriber = _subscribers[client] = client_type(connection_pool=own)
        return subscriber


#: Per library whose pools :func:`subscriber_of` copies, its client class.
_CLIENTS = {"redis": "Redis", "valkey": "Valkey"}


def _plain_pool_library(pool: Any) -> str | None:
    """The library (``redis``, ``valkey``) of ``pool`` when it is a plain or blocking pool of
    it (not a Sentinel's, whose connections follow the primary), else ``None``."""
    kind = type(pool)
    if kind is WaitingPool:  # the pool of a client built from a URL
        return "redis"
    library, _, module = kind.__module__.partition(".")
    if library not in _CLIENTS or module != "connection":
        return None
    return library if kind.__name__ in ("ConnectionPool", "BlockingConnectionPool") else None


#: Idle subscriptions kept per subscriber client, at most (the rest are closed).
IDLE_SUBSCRIPTIONS = 8

#: Channels one kept subscription may carry; one that has this many is closed, not reused.
SUBSCRIPTION_CHANNELS = 16

#: Per client: ``(pid, PubSub, monotonic time set aside)`` of the subscriptions kept.
_idle: weakref.WeakKeyDictionary[Any, list[tuple[int, Any, float]]] = weakref.WeakKeyDictionary()


def subscribe(client: Any, channel: str) -> Any:
    """A ``PubSub`` of ``client`` subscribing to ``channel`` (the request is sent; its
    confirmation is the ``subscribe`` message on ``channel``): one that an earlier wait of this
    process set aside (:func:`set_aside`), else a new one.

    A reused one stays subscribed to the dead channels of its earlier waits (no
    ``UNSUBSCRIBE``: an ACL user may lack it); nothing is published on them, but a waiter must
    still ignore the messages of other channels. One set aside more than :data:`IDLE_REUSE`
    seconds ago is closed, not reused, as an asyncio one is. Timeline, seen in CI: (1) two
    waits end and set their subscriptions aside; (2) the server cuts them while they are
    idle (``CLIENT KILL``, its ``timeout``, a proxy's idle timeout, a restart); (3) the next
    wait subscribes on the first, which fails before it is confirmed, then on the second:
    two failures in a row, and it raised ``LockUnavailable`` with the server up.
    """
    idle = _idle.get(client)
    while idle:
        try:
            pid, pubsub, since = idle.pop()
        except IndexError:  # another thread took the last one
            break
        if pid != current_pid():
            continue  # inherited through a fork: the parent's socket, never read or closed here
        if len(pubsub.channels) >= SUBSCRIPTION_CHANNELS or time.monotonic() - since > IDLE_REUSE:
            pubsub.close()
            continue
        pubsub.subscribe(channel)
        return pubsub
    pubsub = pubsub_of(client)
    pubsub.subscribe(channel)
    return pubsub


def pubsub_of(client: Any) -> Any:
    """A new ``PubSub`` of ``client`` (a thread's); on a RESP3 connection, with a handler of
    push messages that returns each as it came (:func:`as_received`).

    Without a handler of its own, a ``PubSub`` of redis-py 5.0 (and valkey-py 6.0) on a RESP3
    connection (``?protocol=3``) writes ``Push response: [...]`` to stderr at INFO, through a
    handler it adds to the ``push_response`` logger, for every subscription and release
    message; its default handler does nothing else (later releases log them at DEBUG). Given
    on RESP2 too, redis-py 5.0 and valkey-py would fail the subscription: their RESP2 parser
    takes no handler.
    """
    if _resp3(client):
        return client.pubsub(push_handler_func=as_received)
    return client.pubsub()


def aio_pubsub_of(client: Any) -> Any:
    """A new ``PubSub`` of an asyncio ``client``; on a RESP3 connection, with a handler of push
    messages as :func:`pubsub_of`'s, a coroutine function where the library awaits it
    (redis-py's later releases), else a plain one (redis-py 5.0, valkey-py). redis-py 5.0's and
    valkey-py 6.0's own handler writes ``Push response: [...]`` to stderr for every message,
    the whole token of a waiter handed the lock among them; the later ones log it at DEBUG. A
    library whose parser is not known gets none."""
    handler = _push_handler(client) if _resp3(client) else None
    if handler is None:
        return client.pubsub()
    return client.pubsub(push_handler_func=handler)


def _resp3(client: Any) -> bool:
    try:
        protocol = client.get_connection_kwargs().get("protocol")
    except AttributeError:  # a client of another shape: its own defaults
        return False
    return str(protocol) == "3"


def _push_handler(client: Any) -> Callable[[Any], Any] | None:
    """The push handler for an asyncio ``PubSub`` of ``client``: of the kind its library's
    asyncio RESP3 parser calls (its own default is a coroutine function, or not). The library
    is that of the first class of ``client``'s that belongs to one (a subclass of yours is
    defined in your package)."""
    for cls in type(client).__mro__:
        library = cls.__module__.partition(".")[0]
        parser = getattr(sys.modules.get(f"{library}._parsers.resp3"), "_AsyncRESP3Parser", None)
        default = getattr(parser, "handle_pubsub_push_response", None) or getattr(
            parser, "handle_push_response", None
        )
        if default is not None:
            return _received if inspect.iscoroutinefunction(default) else as_received
    return None


async def _received(message: Any) -> Any:
    """A RESP3 push message, as it came (:func:`aio_pubsub_of`, for a parser that awaits)."""
    return message


def as_received(message: Any) -> Any:
    """A RESP3 push message, as it came (:func:`pubsub_of`)."""
    return message


def set_aside(client: Any, pubsub: Any, reusable: bool = True) -> None:
    """Keep ``pubsub`` for the next wait of this process (:func:`subscribe`) if ``reusable``:
    its wait ended, and its channel is dead (a queued waiter's own channel once it left the
    queue: nothing is published there any more); else close it.

    Closing it would cost the waiter that was just handed a lock a socket shutdown on its way
    back to the caller (on a virtual machine, a few hundred microseconds after an idle wait),
    and the next wait a TCP connect and handshake. Beyond :data:`IDLE_SUBSCRIPTIONS` it is
    closed, and so is one not on a plain pool of its own (:func:`subscriber_of`): a Sentinel
    pool's connection kept idle could outlive a failover, still subscribed on the old primary,
    where the new one's handoff would not count it.
    """
    if not reusable or _plain_pool_library(getattr(client, "connection_pool", None)) is None:
        pubsub.close()
        return
    idle = _idle.get(client)
    if idle is None:
        with _subscribers_guard:
            idle = _idle.setdefault(client, [])
    if len(idle) >= IDLE_SUBSCRIPTIONS:
        pubsub.close()
        return
    idle.append((current_pid(), pubsub, time.monotonic()))


# -- asyncio -------------------------------------------------------------------------------------


class Inbox:
    """What one waiting task receives on its channel: messages in order, or the error that
    broke the subscription. :meth:`get` awaits a plain future, so a cancellation of the
    waiting task always lands (no ``asyncio.wait_for`` that could drop it, gh-86296)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.items: deque[Any] = deque()
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, data: Any) -> None:
        self.items.append(data)
        self._wake()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self, timeout: float) -> Any:
        """The next message's data, or ``None`` after ``timeout`` seconds; raises the error
        that broke the subscription."""
        if not self.items and self.error is None:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout, self._wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self.items:
            return self.items.popleft()
        if self.error is not None:
            raise self.error
        return None


class _Connection:
    """One ``PubSub`` and the task that reads it, for the inboxes of one loop and client."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.pubsub = aio_pubsub_of(hub.client)
        #: The inboxes of each channel, in the order their waiters began waiting: a release
        #: on a shared channel wakes them all, and the first woken tries first and wins.
        #: Timeline with a ``set`` (by memory address): on a 3-node quorum with 16 waiters,
        #: some won 111 of 415 handoffs, others 2, and some timed out after 20 s while the
        #: lock changed hands every 50 ms.
        self.inboxes: dict[str, dict[Inbox, None]] = {}
        self.confirmed: set[str] = set()
        self.pending: dict[str, list[asyncio.Future[None]]] = {}
        self.channels = 0  # subscribed so far, dead ones included
        self.reader: asyncio.Task[None] | None = None
        self.broken: BaseException | None = None
        #: One SUBSCRIBE in flight at a time: redis-py < 5.1 connects a ``PubSub`` once per
        #: concurrent first command, and all but the last connection would go unread.
        self.sending = asyncio.Lock()
        #: The loop's time when its last inbox left (``None`` while it has inboxes).
        self.idle_since: float | None = None

    async def add(self, inbox: Inbox, wanted: Callable[[], bool] | None = None) -> None:
        """Subscribe ``inbox``, and return once the server confirmed its channel.

        ``wanted()`` false when its turn to send comes: its waiter was cancelled meanwhile,
        and the ``SUBSCRIBE`` is not sent (it raises :class:`asyncio.CancelledError`), unless
        another inbox waits for that channel's confirmation too. Timeline without: (1) forty
        tasks loop on one key under ``asyncio.timeout(0.05)``, each wait subscribing a channel
        of its own, one ``SUBSCRIBE`` at a time; (2) each cancelled wait's subscription ran on
        (what was sent cannot be unsent); (3) those queued behind the others ran on too, though
        nothing had been sent: 900 to 2,900 of them queued after 8 to 10 s on a 2-core VM,
        ahead of every live waiter's."""
        channel = inbox.channel
        self.inboxes.setdefault(channel, {})[inbox] = None
        self.idle_since = None
        if channel in self.confirmed:
            return
        loop = asyncio.get_running_loop()
        confirmation = loop.create_future()
        first = channel not in self.pending
        self.pending.setdefault(channel, []).append(confirmation)
        if first:
            self.channels += 1
            async with self.sending:
                if (
                    wanted is not None
                    and not wanted()
                    and (confirmation.done() or self.pending.get(channel) == [confirmation])
                ):
                    self._unsent(channel, confirmation)
                    self.channels -= 1
                    if not confirmation.cancelled():  # failed by a cut connection (_break)
                        confirmation.exception()  # retrieved: its waiter is gone
                    raise asyncio.CancelledError
                try:
                    await self.pubsub.subscribe(channel)
                except BaseException as exc:
                    self._unsent(channel, confirmation)
                    if not isinstance(exc, Exception):
                        raise
                    # Any error, not only a Redis one: redis-py reconnecting it reads twice at
                    # once (RuntimeError), valkey-py writes to the socket it just dropped
                    # (AttributeError on None). The waiters subscribe again.
                    broken = exc if classify(exc) is not None else _broken(exc)
                    self._break(broken)
                    if broken is exc:
                        raise
                    raise broken from exc
        if self.reader is None:
            self.reader = loop.create_task(self._read(), name="celery-redlock subscription")
        timer = loop.call_later(SUBSCRIBE_TIMEOUT, _unconfirmed, confirmation, channel)
        try:
            await confirmation
        finally:
            timer.cancel()
            confirmation.cancel()  # no-op once done; a cancelled waiter's is failed by no one

    def _unsent(self, channel: str, confirmation: asyncio.Future[None]) -> None:
        """A ``SUBSCRIBE`` that raised: its confirmation is awaited by nobody (so never failed:
        asyncio would log "Future exception was never retrieved"), and the next wait of the
        channel sends its own."""
        confirmation.cancel()
        waiting = self.pending.get(channel)
        if waiting is not None and confirmation in waiting:
            waiting.remove(confirmation)
            if not waiting:
                del self.pending[channel]

    def remove(self, inbox: Inbox) -> None:
        inboxes = self.inboxes.get(inbox.channel)
        if inboxes is not None:
            inboxes.pop(inbox, None)
            if not inboxes:
                del self.inboxes[inbox.channel]
        if not self.inboxes and (self.broken or self is not self.hub.current):
            self.close()
        elif not self.inboxes:
            self.idle_since = asyncio.get_running_loop().time()

    def idle_for(self) -> float:
        """Seconds since its last inbox left (0 while it has inboxes)."""
        if self.idle_since is None:
            return 0.0
        return asyncio.get_running_loop().time() - self.idle_since

    def close(self) -> None:
        if self.hub.current is self:
            self.hub.current = None
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()
        elif self.reader is None:
            asyncio.get_running_loop().create_task(_close(self.pubsub))

    def _dispatch(self, message: dict[str, Any]) -> None:
        channel = as_text(message["channel"])
        if message["type"] == "subscribe":
            self.confirmed.add(channel)
            for confirmation in self.pending.pop(channel, []):
                if not confirmation.done():
                    confirmation.set_result(None)
        elif message["type"] == "message":
            for inbox in self.inboxes.get(channel, ()):
                inbox.put(message["data"])

    async def _read(self) -> None:
        try:
            while True:
                message = await self.pubsub.get_message(timeout=IDLE_READ)
                if message is not None:
                    self._dispatch(message)
                elif not self.inboxes and not self.pending:
                    return  # idle: the next wait subscribes anew
        except Exception as exc:  # the connection is of no use now: its waiters subscribe anew
            self._break(exc if classify(exc) is not None else _broken(exc))
        finally:
            if self.hub.current is self:
                self.hub.current = None
            await _close(self.pubsub)

    def _break(self, exc: BaseException) -> None:
        self.broken = exc
        for confirmations in self.pending.values():
            for confirmation in confirmations:
                if not confirmation.done():
                    confirmation.set_exception(exc)
        self.pending.clear()
        for inboxes in self.inboxes.values():
            for inbox in inboxes:
                inbox.fail(exc)


def _broken(exc: BaseException) -> redis_py.ConnectionError:
    """A connection error for an error of the reader or of a ``SUBSCRIBE`` that no classifier
    knows (a ``RuntimeError`` from two reads at once): the waiters subscribe again."""
    return redis_py.ConnectionError(f"the subscription connection broke: {exc!r}")


def _unconfirmed(confirmation: asyncio.Future[None], channel: str) -> None:
    if not confirmation.done():
        confirmation.set_exception(
            redis_py.exceptions.TimeoutError(f"no SUBSCRIBE confirmation for {channel}")
        )


async def _close(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        await (pubsub.aclose() if hasattr(pubsub, "aclose") else pubsub.close())


class Hub:
    """The subscriptions of one event loop on one client: one connection carries every
    waiting task's channel, and each message goes to the inboxes of its channel only.

    Timeline of a wait: (1) the task subscribes its inbox (:meth:`subscribe`) and returns once
    the server confirmed the channel; (2) it tries the lock; (3) a release publishes on the
    channel; (4) the hub's reader puts the message into the inbox, which wakes the task. A
    connection that carries :data:`HUB_CHANNELS` channels takes no new ones: the next one
    opens beside it, and the old one closes when its last waiter leaves.
    """

    def __init__(self, client: Any) -> None:
        try:  # weakly: a hub kept in a WeakKeyDictionary by its client would keep it alive
            self._client: Callable[[], Any] = weakref.ref(client)
        except TypeError:
            self._client = lambda: client
        self.current: _Connection | None = None

    @property
    def client(self) -> Any:
        """The client (alive while a lock on it subscribes: the lock holds it)."""
        return self._client()

    async def subscribe(
        self, channel: str, wanted: Callable[[], bool] | None = None
    ) -> tuple[_Connection, Inbox]:
        """Subscribe an inbox of ``channel``; ``wanted``: as :meth:`_Connection.add`'s."""
        connection = self.current
        if connection is not None and connection.idle_for() > IDLE_REUSE:
            connection.close()  # perhaps cut while idle: a new wait takes a new one
            connection = None
        if connection is None or connection.broken or connection.channels >= HUB_CHANNELS:
            if connection is not None and not connection.inboxes:
                connection.close()
            connection = self.current = _Connection(self)
        inbox = Inbox(channel)
        try:
            await connection.add(inbox, wanted)
        except BaseException:
            connection.remove(inbox)
            raise
        return connection, inbox


class Hubs:
    """The :class:`Hub` of each client for one event loop, kept in that loop's state, which goes
    when the loop shuts down (:func:`celery_redlock._redis.aionodes.loop_hubs`); each hub holds
    its client weakly, so it goes with the client too.

    Timeline of the leak this layout closes: (1) ``asyncio.run()`` per request, or a client
    built per request; (2) a lock on it waits, and the hub is kept by loop and client; (3)
    the hub's connection and reader task refer to the loop, and the hub referred to the
    client, so a table keyed weakly by either kept both for good (300 runs: 300 closed loops,
    about 25 kB each).
    """

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()
        #: Clients that cannot be weak keys (a class of yours with ``__eq__`` and no
        #: ``__hash__``), by id: one hub each all the same, checked by identity.
        self._by_id: dict[int, Hub] = {}

    def of(self, client: Any) -> Hub:
        """The hub of ``client``, made on first use."""
        try:
            hub = self._weak.get(client)
            if hub is None:
                hub = self._weak[client] = Hub(client)
        except TypeError:
            hub = self._by_id.get(id(client))
            if hub is None or hub.client is not client:
                hub = self._by_id[id(client)] = Hub(client)
        return hub


#: Seconds to wait for the server to confirm a SUBSCRIBE before subscribing again.
SUBSCRIBE_TIMEOUT = 5.0

#: Seconds the asyncio reader waits for a message before it checks whether anyone listens.
IDLE_READ = 30.0

#: Seconds a subscription connection without waiters still serves a new wait (a thread's set
#: aside, an asyncio loop's).
IDLE_REUSE = 1.0

#: Channels one asyncio subscription connection takes, dead ones included.
HUB_CHANNELS = 1024
