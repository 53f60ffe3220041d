"""Byte-exact protocol checking for driver tests (our own take on "expected protocol").

A test lists the exchanges it expects, in order: what the driver must write, and what
the instrument answers. Any other byte written, a read past what the instrument sent, or
an exchange left unconsumed fails the test.
"""

from __future__ import annotations

from wattlab.errors import MeterTimeoutError


class ExpectedProtocol:
    """A ByteTransport that checks the driver's writes against a script of exchanges."""

    def __init__(self, exchanges: list[tuple[bytes | None, bytes]]) -> None:
        self._exchanges = list(exchanges)
        self._pending_reply = bytearray()
        self.written: list[bytes] = []
        self.closed = False
        self._advance_unprompted()

    def _advance_unprompted(self) -> None:
        # (None, reply) entries are bytes the instrument sends without being asked.
        while self._exchanges and self._exchanges[0][0] is None:
            self._pending_reply += self._exchanges.pop(0)[1]

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))
        if not self._exchanges:
            raise AssertionError(f"driver wrote {data!r} after the script ended")
        expected, reply = self._exchanges[0]
        assert expected is not None
        if not expected.startswith(data):
            raise AssertionError(f"driver wrote {data!r}, expected {expected!r}")
        rest = expected[len(data):]
        if rest:
            self._exchanges[0] = (rest, reply)
            return
        self._exchanges.pop(0)
        self._pending_reply += reply
        self._advance_unprompted()

    def read(self, n: int) -> bytes:
        if len(self._pending_reply) < n:
            raise MeterTimeoutError(
                f"driver read {n} bytes, instrument sent only {len(self._pending_reply)}"
            )
        out = bytes(self._pending_reply[:n])
        del self._pending_reply[:n]
        return out

    def read_available(self, max_n: int) -> bytes:
        out = bytes(self._pending_reply[:max_n])
        del self._pending_reply[:max_n]
        return out

    def reset_input(self) -> None:
        self._pending_reply.clear()

    def close(self) -> None:
        self.closed = True

    def assert_consumed(self) -> None:
        if self._exchanges:
            raise AssertionError(f"exchanges never made: {self._exchanges[:3]!r}")
        if self._pending_reply:
            raise AssertionError(f"reply bytes never read: {bytes(self._pending_reply[:32])!r}")
