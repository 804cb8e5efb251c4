"""A loopback listener that plays a server going wrong, for tests that need a peer which accepts
connections and then misbehaves (a hung broker, a registry resetting every request)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def listener(on_accept: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[int]]]:
    """("127.0.0.1:port", [connections accepted so far]); each accepted connection goes to
    `on_accept`. Connections it does not close are held open, and closed at the end."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list[socket.socket] = []
    accepted = [0]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted[0] += 1
            held.append(conn)
            on_accept(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        t.join()
        for c in [*held, server]:
            with contextlib.suppress(OSError):
                c.close()


def hold(_conn: socket.socket) -> None:
    """Take the connection and never answer: a SIGSTOPped server, as a client sees one."""


def reset(conn: socket.socket) -> None:
    """Close with an RST at once: the request fails as on a server that just went away."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()
