"""A scripted byte port: a serial driver's writes checked byte for byte against a script.

The script lists the exchanges in order: what the driver must write, and what the
instrument answers. ``(None, reply)`` is what the instrument sends unprompted (a stream
already running, a banner). A write that differs fails at once, naming the exchange and
both byte strings; a read of more bytes than the instrument has sent raises
``MeterTimeoutError``, as a real port would, so a driver's timeout handling is testable;
``assert_consumed`` fails while an exchange is unmade or a reply byte unread.
"""

from __future__ import annotations

from collections.abc import Sequence

from wattlab.errors import MeterTimeoutError

ByteExchange = tuple[bytes | None, bytes]
"""``(what the driver writes, what the instrument answers)``; ``None``: sent unprompted."""

_SHOWN_BYTES = 32  # of a reply left unread


class ExpectedProtocol:
    """A ``ByteTransport`` that plays a script of exchanges and checks every write."""

    def __init__(self, exchanges: Sequence[ByteExchange]) -> None:
        self.exchanges: list[ByteExchange] = []
        for index, (write, reply) in enumerate(exchanges):
            if write is not None and not write:
                raise ValueError(f"exchange {index}: an empty write matches nothing; "
                                 "(None, reply) is a reply sent unprompted")
            self.exchanges.append((None if write is None else bytes(write), bytes(reply)))
        self.done = 0  # exchanges made: their reply was sent
        self._matched = 0  # bytes of the next exchange's write already written
        self._pending_reply = bytearray()
        self.written: list[bytes] = []
        self.closed = False
        self._send_unprompted()

    def _send_unprompted(self) -> None:
        while self.done < len(self.exchanges) and self.exchanges[self.done][0] is None:
            self._pending_reply += self.exchanges[self.done][1]
            self.done += 1

    def write(self, data: bytes) -> None:
        __tracebackhide__ = True  # pytest shows the driver's call, not this frame
        data = bytes(data)
        self.written.append(data)
        if self.done == len(self.exchanges):
            raise AssertionError(f"driver wrote {data!r} after the script ended "
                                 f"({len(self.exchanges)} exchange(s), all made)")
        expected, reply = self.exchanges[self.done]
        assert expected is not None  # unprompted replies were sent when reached
        rest = expected[self._matched:]
        if not rest.startswith(data):
            part = f" (the rest of {expected!r})" if self._matched else ""
            raise AssertionError(f"exchange {self.done}: driver wrote {data!r}, "
                                 f"expected {rest!r}{part}")
        self._matched += len(data)
        if self._matched < len(expected):
            return
        self._matched = 0
        self.done += 1
        self._pending_reply += reply
        self._send_unprompted()

    def read(self, n: int) -> bytes:
        if len(self._pending_reply) < n:
            if self.done == len(self.exchanges):
                where = "and the script has ended"
            else:
                where = f"until exchange {self.done} ({self.exchanges[self.done][0]!r}) is written"
            raise MeterTimeoutError(f"scripted port: driver read {n} bytes, the instrument "
                                    f"sent {len(self._pending_reply)} {where}")
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
        """Fail unless every exchange was made and every reply byte read."""
        __tracebackhide__ = True  # pytest shows where the test ended, not this frame
        problems = []
        if self.done < len(self.exchanges):
            left = len(self.exchanges) - self.done
            more = f" and {left - 1} more" if left > 1 else ""
            written = f", {self._matched} bytes of it written" if self._matched else ""
            problems.append(f"exchange {self.done} of {len(self.exchanges)} never made"
                            f"{written}: {self.exchanges[self.done]!r}{more}")
        if self._pending_reply:
            shown = bytes(self._pending_reply[:_SHOWN_BYTES])
            cut = "..." if len(self._pending_reply) > _SHOWN_BYTES else ""
            problems.append(f"{len(self._pending_reply)} reply bytes never read: {shown!r}{cut}")
        if problems:
            raise AssertionError("script not finished: " + "; ".join(problems))
