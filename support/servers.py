"""Redis topologies for tests and benchmarks, all on free ports of 127.0.0.1.

Every process here is a :class:`celery_redlock.testing.RedisServer` (the one redis-server
wrapper), or a subclass that changes its command line (:meth:`~RedisServer.command`) and how
its first ``PING`` is sent (:meth:`~RedisServer.client`). Beyond one plain server:

* :class:`SentinelGroup`: a primary, a replica and one Sentinel (``redis-server --sentinel``)
  with short timeouts, and a forced failover that returns once clients can follow it;
* :class:`ClusterNodes`: a 3-primary Redis Cluster built with ``redis-cli --cluster create``;
* :func:`make_certs` and :class:`TlsServer`: an ``openssl``-made CA with server and client
  certificates, and a TLS-only server that requires client certificates and a password;
* :class:`DelayProxy`: a TCP proxy that delays all traffic, to give loopback a real latency.

Every wait polls a condition with a deadline (:func:`wait_until`); nothing sleeps a guessed
amount of time.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import queue
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redlock.testing import RedisServer, free_port, redis_server_binary, wait_until

#: The sockets that keep :func:`dead_port`'s ports, for as long as the test process runs.
_DEAD: list[socket.socket] = []


def dead_port() -> int:
    """A loopback port where nothing listens, and nothing will while the tests run: bound,
    never listening, by this process. A port that :func:`free_port` found free may be given
    to the next ``redis-server`` a parallel test starts, and a "dead" lock URL then answers
    (the likely cause of an outage test's one failure in a ``-n 2`` run, not seen again)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _DEAD.append(sock)
    return int(sock.getsockname()[1])


def client(port: int, **kwargs: Any) -> redis_py.Redis:
    """A plain client for a test server, failing fast (no retries) when it is down."""
    return redis_py.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


def info_field(port: int, section: str, field: str, **kwargs: Any) -> str | None:
    """One field of ``INFO <section>`` (``None`` when the server does not answer)."""
    c = client(port, **kwargs)
    try:
        return str(c.info(section).get(field))
    except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError):
        return None
    finally:
        c.close()


# -- Sentinel -----------------------------------------------------------------------------------

SERVICE = "redlock-primary"


class _Started(abc.ABC):
    """A group of servers used as ``with Group(...) as group:``; stopped even if start fails."""

    @abc.abstractmethod
    def start(self) -> Any: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Any:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SentinelServer(RedisServer):
    """``redis-server <dir>/sentinel.conf --sentinel``, watching ``primary`` as :data:`SERVICE`.

    The configuration file is written when it starts (a Sentinel rewrites it as it learns, and a
    restart forgets that).
    """

    def __init__(self, primary: RedisServer, bind: str = "127.0.0.1") -> None:
        super().__init__()
        self.primary = primary
        self.bind = bind
        self.conf = Path(self._dir) / "sentinel.conf"

    def command(self) -> list[str]:
        self.conf.write_text(
            f"port {self.port}\nbind {self.bind}\ndir {self._dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 2000\n"
        )
        return [redis_server_binary(), str(self.conf), "--sentinel"]

    def client(self) -> redis_py.Redis:
        return client(self.port)


class SentinelGroup(_Started):
    """A primary, one replica and one Sentinel watching them as :data:`SERVICE`.

    Diskless replication without delay makes a (re)sync immediate; Sentinel timeouts are short
    so that a failover completes in a few seconds. ``sentinel_bind`` is the Sentinel's ``bind``
    line (``"127.0.0.1 ::1"`` to reach it over IPv6 too).
    """

    def __init__(self, sentinel_bind: str = "127.0.0.1") -> None:
        repl = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        self.primary = RedisServer(args=repl)
        self.replica = RedisServer(args=repl)
        self.sentinel = SentinelServer(self.primary, sentinel_bind)
        self.port = self.sentinel.port

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.args += ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        wait_until(
            lambda: info_field(self.replica.port, "replication", "master_link_status") == "up",
            10,
            "the replica to sync",
        )
        self.sentinel.start()
        wait_until(self._replica_known, 10, "the Sentinel to see the replica")
        return self

    def _sentinel_call(self, *args: Any) -> Any:
        c = client(self.port, decode_responses=True)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def _replica_known(self) -> bool:
        replicas = self._sentinel_call("SENTINEL", "REPLICAS", SERVICE)
        # redis-py < 8 leaves this reply unparsed: a flat [field, value, ...] list per replica.
        replicas = [
            r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True)) for r in replicas
        ]
        return any(r["flags"] == "slave" and r["master-link-status"] == "ok" for r in replicas)

    def primary_port(self) -> int:
        """The primary's port according to the Sentinel."""
        host, port = self._sentinel_call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        assert host == "127.0.0.1"
        return int(port)

    def failover(self, timeout: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """``SENTINEL FAILOVER``; return ``(new primary, old primary)`` once clients follow.

        Clients connected to the old primary learn about the failover when the Sentinel turns
        the old primary into a replica: it then also kills their connections (CLIENT KILL TYPE
        normal), and redis-py asks the Sentinel for the new address on reconnect. Sentinel waits
        a few seconds (4 x its 2 s publish period) before that conversion, so wait for it here.
        """
        old = self.primary if self.primary.port == self.primary_port() else self.replica
        new = self.replica if old is self.primary else self.primary
        assert self._sentinel_call("SENTINEL", "FAILOVER", SERVICE) == "OK"
        wait_until(lambda: self.primary_port() == new.port, timeout, "the Sentinel to switch")
        wait_until(
            lambda: info_field(new.port, "replication", "role") == "master",
            timeout,
            "the new primary to take the role",
        )
        wait_until(
            lambda: info_field(old.port, "replication", "master_link_status") == "up",
            timeout,
            "the old primary to become a synced replica",
        )
        return new, old

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.primary):
            server.__exit__(None, None, None)


# -- Cluster ------------------------------------------------------------------------------------


class ClusterNodes(_Started):
    """Three cluster-enabled primaries joined with ``redis-cli --cluster create``."""

    def __init__(self, size: int = 3, extra: Sequence[str] = ()) -> None:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            *extra,
        ]
        self._args = args
        self.nodes = [RedisServer(port=cluster_port(), args=args) for _ in range(size)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def start(self) -> ClusterNodes:
        for index in range(len(self.nodes)):
            self._start_node(index)
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is needed to create a Redis Cluster")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        for node in self.nodes:
            ok = functools.partial(cluster_ok, node.port)
            wait_until(ok, 10, f"cluster_state:ok on {node.port}")
        return self

    def _start_node(self, index: int, attempts: int = 5) -> None:
        """Start node ``index``; one that finds its port pair taken gets a new pair.

        :func:`cluster_port` checks the pair, then the node binds it: another test process
        that starts a node between the two, on the same random pair, takes it first (the node
        exits with 1, or another server answers). Nothing else binds these ports: they are
        below the kernel's range for ``bind(0)`` and outgoing connections.
        """
        for attempt in range(attempts):
            try:
                self.nodes[index].start()
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                self.nodes[index].__exit__(None, None, None)
                self.nodes[index] = RedisServer(port=cluster_port(), args=self._args)

    def stop(self) -> None:
        for node in self.nodes:
            node.__exit__(None, None, None)


def cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too.

    Both lie below 32768, where Linux's default ``ip_local_port_range`` starts: neither
    :func:`~celery_redlock.testing.free_port` (``bind(0)``) nor a client's outgoing connection
    is given one of them, so only another cluster node of a parallel run competes for them.
    """
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(12000, 22768)
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 10000):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


def cluster_ok(port: int) -> bool:
    return info_cluster(port).get("cluster_state") == "ok"


def info_cluster(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` of one node, as a dict."""
    c = client(port, decode_responses=True)
    try:
        text = c.execute_command("CLUSTER", "INFO")
    finally:
        c.close()
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


# -- TLS ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    """Paths of a test PKI: a CA, a server certificate for 127.0.0.1, a client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_certs(directory: str) -> Certs:
    """Generate a CA and the certificates signed by it with ``openssl`` (EC P-256, 1 day)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is needed to generate test certificates")
    d = Path(directory)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=30)

    key_opts = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req",
        "-x509",
        *key_opts,
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
        "-days",
        "1",
        "-subj",
        "/CN=celery-redlock test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    for name, usage, san in (
        ("server", "serverAuth", "IP:127.0.0.1"),
        ("client", "clientAuth", "DNS:redlock-client"),
    ):
        ext = d / f"{name}.ext"
        ext.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            f"extendedKeyUsage={usage}\nsubjectAltName={san}\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        run(
            "req",
            *key_opts,
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
            "-subj",
            f"/CN={san.split(':', 1)[1]}",
        )
        run(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(ext),
            "-out",
            str(d / f"{name}.crt"),
        )
    return Certs(
        ca=str(d / "ca.crt"),
        server_cert=str(d / "server.crt"),
        server_key=str(d / "server.key"),
        client_cert=str(d / "client.crt"),
        client_key=str(d / "client.key"),
    )


class _TlsOnly(RedisServer):
    """The process of a :class:`TlsServer`: no plain port, TLS on :attr:`port`."""

    def __init__(self, certs: Certs, admin: Callable[[], redis_py.Redis], args: list[str]) -> None:
        super().__init__(args=args)
        self.certs = certs
        self.admin = admin

    def command(self) -> list[str]:
        # Later arguments win: ``--port 0`` closes the plain port the base command opened.
        return [
            *super().command(),
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            self.certs.server_cert,
            "--tls-key-file",
            self.certs.server_key,
            "--tls-ca-cert-file",
            self.certs.ca,
            "--tls-auth-clients",
            "yes",
        ]

    def client(self) -> redis_py.Redis:
        return self.admin()


class TlsServer:
    """A TLS-only ``redis-server`` (``--port 0``) that requires a client certificate.

    :param certs: from :func:`make_certs`.
    :param admin_password: password of the ``default`` user.
    :param users: ACL ``user`` lines (without the word ``user``), e.g. ``"app on >pw ~* +@all"``.
    """

    def __init__(self, certs: Certs, admin_password: str, users: Sequence[str] = ()) -> None:
        self.certs = certs
        self.admin_password = admin_password
        args = ["--requirepass", admin_password]
        for line in users:
            args += ["--user", *line.split()]
        self.server = _TlsOnly(certs, self.admin, args)
        self.port = self.server.port

    def url(self, user: str = "", password: str = "", *, client_cert: bool = True) -> str:
        """A ``rediss://`` URL of this server, with the CA and (by default) the client cert."""
        auth = f"{user}:{password}@" if user or password else ""
        query = f"ssl_ca_certs={self.certs.ca}&ssl_cert_reqs=required"
        if client_cert:
            query += f"&ssl_certfile={self.certs.client_cert}&ssl_keyfile={self.certs.client_key}"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?{query}"

    def admin(self, **kwargs: Any) -> redis_py.Redis:
        """A client authenticated as the ``default`` user (all permissions)."""
        return self.connect(password=self.admin_password, **kwargs)

    def connect(self, **kwargs: Any) -> redis_py.Redis:
        """A client over TLS with the client certificate; ``kwargs`` add credentials."""
        return redis_py.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=2,
            socket_connect_timeout=2,
            ssl=True,
            ssl_ca_certs=self.certs.ca,
            ssl_certfile=self.certs.client_cert,
            ssl_keyfile=self.certs.client_key,
            **kwargs,
        )

    def __enter__(self) -> TlsServer:
        self.server.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.__exit__(exc_type, exc, tb)


def tls_supported() -> str | None:
    """``None`` if ``redis-server`` was built with TLS, else the reason it was not."""
    out = subprocess.run(
        [
            redis_server_binary(),
            "--port",
            "0",
            "--tls-port",
            str(free_port()),
            "--tls-cert-file",
            "/nonexistent",
            "--tls-key-file",
            "/nonexistent",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # Redis 6.2 reports the bad directive on stderr
        text=True,
        timeout=10,
    ).stdout
    if "not supported" in out or "Bad directive" in out:
        return f"{redis_server_binary()} was built without TLS support: {out.strip()[-200:]}"
    return None


# -- latency ------------------------------------------------------------------------------------


class DelayProxy:
    """A TCP proxy to ``127.0.0.1:target`` that delays every chunk it forwards by ``delay`` s.

    It turns loopback into a network with a known round-trip time (2 x ``delay``), which makes
    "N nodes in parallel cost one round trip" measurable. Forwarding keeps order and timing:
    a chunk read at t is written at t + ``delay``.
    """

    def __init__(self, target: int, delay: float) -> None:
        self.target = target
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._guard = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._guard:
                self._sockets.append(downstream)
                if self._closed.is_set():
                    downstream.close()
                    return
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target))
                except OSError:
                    downstream.close()
                    continue
                self._sockets.append(upstream)
                for sock in (downstream, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(src, chunks), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, chunks), daemon=True).start()

    def _read(self, src: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                chunks.put((time.monotonic() + self.delay, data))
        chunks.put((0.0, b""))

    def _write(self, dst: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while True:
                due, data = chunks.get()
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                self._closed.wait(max(due - time.monotonic(), 0.0))  # the injected latency
                dst.sendall(data)

    def close(self) -> None:
        with self._guard:
            self._closed.set()
            self._listener.close()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
