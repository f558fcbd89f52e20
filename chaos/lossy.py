"""A bounded userspace TCP proxy that delays, jitters and stalls what it forwards: the
application-visible effect of a slow, jittery, lossy link, for kernels without ``sch_netem``.

It does **not** drop packets (the kernel under :mod:`chaos.faults` has no netem, no tc
classifiers and no tc actions, so nothing can). It models what TCP shows an application after
a loss: every chunk arrives late by ``delay`` plus a uniform random ``jitter``, and with
probability ``stall_p`` a chunk (and every byte behind it: TCP delivers in order) waits an
extra retransmission-timeout-like pause drawn from ``stall``. Timeline of one stalled reply::

    t=0      node sends the reply to a renewal       (proxy receives it at once)
    t=0.04   a reply would reach the worker           (delay + jitter)
    t=0.04   proxy draws a stall of 0.6 s              (as if the segment were lost and resent)
    t=0.5    the worker's socket_timeout runs out     -> the renewal fails, as on a lossy link
    t=0.64   the bytes arrive on a socket the client already dropped

Each direction of a connection is a reader thread that stamps chunks with their delivery time
into a bounded queue (a full queue stops the reader: back-pressure, as a full window would)
and a writer that sends each at its time, never earlier than the chunk before it. Effects
apply only while :attr:`Proxy.active` is set (the fault's window); otherwise chunks pass at
once. :meth:`Proxy.close` closes the listener and every connection; each thread ends when its
socket does or within 0.2 s of the close.
"""

from __future__ import annotations

import contextlib
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Effects:
    """What the link does to each chunk while active (seconds; ``stall_p`` per chunk)."""

    delay: float = 0.04
    jitter: float = 0.03
    stall_p: float = 0.1
    stall: tuple[float, float] = (0.2, 1.0)


class Proxy:
    """Listen on ``listen`` (port chosen by the system), forward to ``target``."""

    #: Chunks in flight per direction of a connection before the reader waits.
    QUEUE = 256

    def __init__(
        self, listen: str, target: tuple[str, int], effects: Effects, seed: str = ""
    ) -> None:
        self.target = target
        self.effects = effects
        self.active = threading.Event()
        self.closed = threading.Event()
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.server = socket.create_server((listen, 0))
        self.server.settimeout(0.2)
        self.port = int(self.server.getsockname()[1])
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.chunks = 0
        self.stalls = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                down, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                up = socket.create_connection(self.target, timeout=2)
            except OSError:
                down.close()
                continue
            with self.lock:
                if self.closed.is_set():
                    down.close()
                    up.close()
                    return
                self.sockets += [down, up]
            for a, b in ((down, up), (up, down)):
                a.settimeout(0.2)
                pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue(self.QUEUE)
                threading.Thread(target=self._read, args=(a, pending, b), daemon=True).start()
                threading.Thread(target=self._write, args=(pending, b), daemon=True).start()

    def _due(self, now: float, last: float) -> float:
        """When a chunk received ``now`` is delivered (not before the previous one, ``last``)."""
        if not self.active.is_set():
            return max(now, last)
        e = self.effects
        with self.rng_lock:
            due = now + e.delay + self.rng.uniform(0, e.jitter)
            self.chunks += 1
            if self.rng.random() < e.stall_p:
                self.stalls += 1
                due += self.rng.uniform(*e.stall)
        return max(due, last)

    def _read(
        self,
        a: socket.socket,
        pending: queue.Queue[tuple[float, bytes] | None],
        b: socket.socket,
    ) -> None:
        last = 0.0
        try:
            while not self.closed.is_set():
                try:
                    data = a.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                last = self._due(time.monotonic(), last)
                while not self.closed.is_set():
                    try:
                        pending.put((last, data), timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except OSError:
            pass
        finally:
            with contextlib.suppress(queue.Full):
                pending.put(None, timeout=0.2)
            if self.closed.is_set():
                self._shut(a, b)

    def _write(self, pending: queue.Queue[tuple[float, bytes] | None], b: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                try:
                    item = pending.get(timeout=0.2)
                except queue.Empty:
                    continue
                if item is None:
                    break
                due, data = item
                while (wait := due - time.monotonic()) > 0 and not self.closed.is_set():
                    time.sleep(min(wait, 0.2))
                b.sendall(data)
        except OSError:
            pass
        finally:
            self._shut(b)

    @staticmethod
    def _shut(*sockets: socket.socket) -> None:
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop forwarding: the listener and every connection are closed."""
        self.closed.set()
        self.active.clear()
        with self.lock:
            sockets, self.sockets = self.sockets, []
        self.server.close()
        for s in sockets:
            self._shut(s)
            s.close()
