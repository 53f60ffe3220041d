"""A real local HTTP endpoint serving Prometheus text: what a scraper is tested against.

Why a module of its own: the simulated server serves its counters here, and the scraper's
tests serve whatever text they need (an outage, a counter reset, a non-numeric sample) from
the very same endpoint, on a port of loopback the system picks.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class QuietServer(ThreadingHTTPServer):
    """A server for which a cut connection is not an error worth a traceback on stderr.

    ``stop`` shuts kept-alive connections down, and a scraper may go away mid-answer; the
    handler's thread then meets an OSError that the standard server prints in full.
    """

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class MetricsEndpoint:
    """Serves ``text()`` at ``http://127.0.0.1:PORT/metrics`` from a thread, keep-alive.

    ``port`` 0 lets the system pick one; ``stop`` then ``start`` again serves on the same
    port (a server that went away and came back). Use as a context manager.
    """

    def __init__(self, text: Callable[[], str], port: int = 0, path: str = "/metrics") -> None:
        self.text = text
        self.port = port
        self.path = path
        self.requests = 0
        self._open: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> MetricsEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # headers and body in one send: no Nagle wait between them

            def setup(self) -> None:
                super().setup()
                endpoint._open.add(self.connection)

            def finish(self) -> None:
                endpoint._open.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:
                endpoint.requests += 1
                if self.path.split("?")[0] != endpoint.path:
                    self.send_error(404)
                    return
                body = endpoint.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every 100 ms is not news

        server = QuietServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="metrics-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and close the port (open connections are cut)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            for conn in list(self._open):  # a kept-alive scraper must see the server go
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> MetricsEndpoint:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
