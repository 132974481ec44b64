"""The metrics HTTP server: prometheus_client's WSGI app behind limits no network peer can exhaust.

The server runs inside the training process, on a port the cluster network can reach, so what
any peer sends must not cost training descriptors, memory, threads or stderr lines:

- at most :data:`MAX_CONNECTIONS` connections at once (one thread and one descriptor each); one
  past that is closed as soon as it is accepted;
- each read or write waits at most :data:`IO_TIMEOUT_S`, and a connection lives at most
  :data:`CONNECTION_DEADLINE_S` however slowly it trickles bytes in or reads them out;
- a request (its line and headers) is read up to :data:`MAX_REQUEST_BYTES`, then the connection
  is closed;
- nothing a peer causes is printed: errors in a request are dropped with its connection.

Imported only when metrics start (it imports ``prometheus_client``).
"""

from __future__ import annotations

import io
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

__all__ = ["CONNECTION_DEADLINE_S", "IO_TIMEOUT_S", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "start_server"]

MAX_CONNECTIONS = 16
IO_TIMEOUT_S = 5.0
CONNECTION_DEADLINE_S = 15.0
MAX_REQUEST_BYTES = 16 * 1024
_POLL_S = 0.5  # how often the accept loop closes connections past their deadline


class _RequestTooLarge(Exception):
    """A request's line and headers went past MAX_REQUEST_BYTES: its connection is dropped."""


class _CappedReader:
    """The request stream, refusing to read more than ``limit`` bytes in all."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def _take(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise _RequestTooLarge
        return data

    def readline(self, size: int = -1) -> bytes:
        size = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        return self._take(self._raw.readline(size))

    def read(self, size: int = -1) -> bytes:
        size = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        return self._take(self._raw.read(size))

    def close(self) -> None:
        self._raw.close()


class _Handler(WSGIRequestHandler):
    timeout = IO_TIMEOUT_S  # StreamRequestHandler: the socket's timeout for every read and write

    def setup(self) -> None:
        super().setup()
        self.rfile = _CappedReader(self.rfile, MAX_REQUEST_BYTES)  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing a peer sends is logged into training's stderr."""

    def get_stderr(self) -> io.StringIO:
        # wsgiref prints an application error's traceback here: keep it out of training's stderr.
        return io.StringIO()


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them, each with a deadline."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # the kernel's backlog: a burst of scrapers waits there, costing us nothing

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self._open: dict[Any, float] = {}  # connection -> the monotonic time it must be gone by
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._open_lock:
            if len(self._open) >= MAX_CONNECTIONS:
                return False  # socketserver closes it at once
            self._open[request] = time.monotonic() + CONNECTION_DEADLINE_S
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        # Called by serve_forever's loop every _POLL_S: a connection past its deadline is shut
        # down, which wakes its thread out of any read or write with an error.
        now = time.monotonic()
        with self._open_lock:
            late = [request for request, deadline in self._open.items() if deadline < now]
        for request in late:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer's broken request (a timeout, a reset, an oversized header) only closes its
        connection: socketserver would print a traceback into training's stderr."""


def start_server(addr: str, port: int, registry: Any) -> MetricsServer:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread; raises OSError
    (a port in use, an address that is not this host's) when it cannot listen."""
    family, host = _family(addr, port)
    server = MetricsServer((host, port), family)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": _POLL_S},
        name="torchstep_prof metrics server",
        daemon=True,
    )
    thread.start()
    return server


def _family(addr: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and numeric address to bind (``::`` needs IPv6, a host name resolves)."""
    infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    host = str(sockaddr[0])
    return family, host or addr
