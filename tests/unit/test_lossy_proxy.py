"""chaos.lossy.Proxy on real loopback sockets: while active, every chunk is forwarded intact
and in order with its effects counted; close() ends the connections it carries."""

from __future__ import annotations

import socket
import threading

from chaos.lossy import Effects, Proxy


def test_an_active_proxy_forwards_every_byte_in_order_and_close_ends_the_connection() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    upstream.settimeout(10)
    received: list[bytes] = []

    def echo() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.settimeout(10)
            while data := conn.recv(65536):
                received.append(data)
                conn.sendall(data)

    server = threading.Thread(target=echo, daemon=True)
    server.start()
    effects = Effects(delay=0.001, jitter=0.002, stall_p=1.0, stall=(0.005, 0.01))
    proxy = Proxy("127.0.0.1", upstream.getsockname(), effects, seed="test")
    proxy.active.set()
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sent = b"".join(f"{i:04d}".encode() for i in range(50))
        echoed = b""
        for i in range(50):
            client.sendall(sent[4 * i : 4 * i + 4])
            while len(echoed) < 4 * (i + 1):
                echoed += client.recv(65536)
        assert echoed == sent and b"".join(received) == sent
        assert proxy.chunks >= 100 and proxy.stalls == proxy.chunks
    finally:
        proxy.close()
    assert client.recv(65536) == b""
    client.close()
    server.join(timeout=10)
    assert not server.is_alive()
    upstream.close()
