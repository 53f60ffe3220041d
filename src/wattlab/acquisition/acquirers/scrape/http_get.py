"""One HTTP/1.1 GET, repeated over a kept-alive connection, with as little work as can be.

Why not http.client: a scrape at 10 Hz must cost under 0.1 % of a core (~100 µs a scrape),
and http.client parses every response's headers through the email package (~0.5 ms on a
busy host). This reads the status line and the two headers that frame the body
(Content-Length, or chunked Transfer-Encoding; else the body runs to the connection's
close) and nothing else. A failure of any kind closes the connection; the next GET opens a
new one. The connection is kept only where the server keeps it (HTTP/1.1 without
``Connection: close``, HTTP/1.0 only with ``Connection: keep-alive``: Python's http.server
and many small exporters answer HTTP/1.0 and close). A kept connection the server closed
while idle (keep-alive timeouts: uvicorn's is 5 s) is retried once on a new one, as HTTP
clients do for a GET.
"""

from __future__ import annotations

import socket
import ssl

from wattlab.errors import MeterError

CHUNK = 65536
MAX_BODY = 64 * 2**20  # a metrics page larger than this is not one


class ServerClosed(MeterError):
    """The server closed the connection before answering anything."""


class KeptAliveGet:
    """GET ``path`` from ``host:port`` (TLS for https) with ``timeout_s`` on every read."""

    def __init__(self, scheme: str, host: str, port: int | None, path: str,
                 timeout_s: float) -> None:
        self.tls = scheme == "https"
        self.host = host
        self.port = port or (443 if self.tls else 80)
        self.timeout_s = timeout_s
        authority = host if port is None else f"{host}:{port}"
        if ":" in host:  # an IPv6 literal
            authority = f"[{host}]" if port is None else f"[{host}]:{port}"
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain\r\n"
                        "User-Agent: wattlab\r\n\r\n").encode()
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()

    def get(self) -> tuple[int, str, bytes]:
        """(status, reason, body); OSError or MeterError after closing the connection."""
        reused = self._sock is not None
        try:
            return self._get()
        except (OSError, ServerClosed):
            self.close()
            if not reused:
                raise
        except BaseException:
            self.close()
            raise
        try:  # the kept connection was closed by the server before it answered: once more
            return self._get()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        return sock

    def _get(self) -> tuple[int, str, bytes]:
        if self._sock is None:
            self._sock = self._connect()
        self._sock.sendall(self.request)
        self._fill(ServerClosed)  # the first bytes of the answer: none means it had closed
        head = self._until(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise MeterError(f"not an HTTP response: {status_line[:80]!r}")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif "chunked" in headers.get("transfer-encoding", ""):
            body = self._chunked()
        else:
            body = self._to_close()
        connection = headers.get("connection", "")
        if connection == "close" or (parts[0] == "HTTP/1.0" and connection != "keep-alive"):
            self.close()
        return int(parts[1]), parts[2] if len(parts) > 2 else "", body

    def _fill(self, closed: type[MeterError] = MeterError) -> None:
        assert self._sock is not None
        data = self._sock.recv(CHUNK)
        if not data:
            raise closed("the server closed the connection mid-response")
        if len(self._buf) + len(data) > MAX_BODY:
            raise MeterError(f"response larger than {MAX_BODY // 2**20} MiB")
        self._buf += data

    def _until(self, mark: bytes) -> bytes:
        while (at := self._buf.find(mark)) < 0:
            self._fill()
        out = bytes(self._buf[:at])
        del self._buf[:at + len(mark)]
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                while self._until(b"\r\n"):  # trailers, then the empty line
                    pass
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._until(b"\r\n")

    def _to_close(self) -> bytes:
        assert self._sock is not None
        while data := self._sock.recv(CHUNK):
            if len(self._buf) + len(data) > MAX_BODY:
                raise MeterError(f"response larger than {MAX_BODY // 2**20} MiB")
            self._buf += data
        body = bytes(self._buf)
        self.close()
        return body
