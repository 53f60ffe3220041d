"""A scripted SCPI instrument: a ``TextTransport`` checking every command, in order.

Each exchange is ``(command, reply)``: reply ``None`` means a plain write, a ``str`` is a
query's answer line, ``bytes`` is the raw definite-length block a binary query gets, and an
exception instance is raised instead of answering (a timeout, say). A command that differs,
or a write where the script has a query (or the other way round), fails at once naming the
exchange; ``assert_consumed`` fails while an exchange is unmade.
"""

from __future__ import annotations

from collections.abc import Sequence

from wattlab.drivers.scpi import decode_definite_block

Reply = str | bytes | BaseException | None
TextExchange = tuple[str, Reply]
"""``(command, reply)``: see the module's description for what each kind of reply means."""


class ScriptedTextTransport:
    """A ``TextTransport`` that plays a script of commands and replies."""

    def __init__(self, exchanges: Sequence[TextExchange],
                 resource_name: str = "SCRIPTED") -> None:
        self.resource_name = resource_name
        self.exchanges = list(exchanges)
        self.done = 0  # exchanges made
        self.sent: list[str] = []
        self.closed = False

    def _next(self, cmd: str, kind: str) -> Reply:
        __tracebackhide__ = True  # pytest shows the driver's call, not this frame
        self.sent.append(cmd)
        index = self.done
        if index == len(self.exchanges):
            raise AssertionError(f"driver sent {cmd!r} ({kind}) after the script ended "
                                 f"({len(self.exchanges)} exchange(s), all made)")
        expected, reply = self.exchanges[index]
        if cmd != expected:
            raise AssertionError(f"exchange {index}: driver sent {cmd!r} ({kind}), "
                                 f"expected {expected!r}")
        self.done += 1
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def write(self, cmd: str) -> None:
        __tracebackhide__ = True  # pytest shows the driver's call, not this frame
        reply = self._next(cmd, "write")
        if reply is not None:
            raise AssertionError(f"exchange {self.done - 1}: {cmd!r} was written but the "
                                 f"script has a reply {reply!r}")

    def query(self, cmd: str) -> str:
        __tracebackhide__ = True  # pytest shows the driver's call, not this frame
        reply = self._next(cmd, "query")
        if not isinstance(reply, str):
            raise AssertionError(f"exchange {self.done - 1}: {cmd!r} was queried but the "
                                 f"script has reply {reply!r}")
        return reply

    def query_binary_block(self, cmd: str) -> bytes:
        __tracebackhide__ = True  # pytest shows the driver's call, not this frame
        reply = self._next(cmd, "binary query")
        if not isinstance(reply, bytes):
            raise AssertionError(f"exchange {self.done - 1}: {cmd!r} was a binary query but "
                                 f"the script has {reply!r}")
        return decode_definite_block(reply, self.resource_name, cmd)

    def close(self) -> None:
        self.closed = True

    def assert_consumed(self) -> None:
        """Fail unless every exchange was made."""
        __tracebackhide__ = True  # pytest shows where the test ended, not this frame
        if self.done < len(self.exchanges):
            left = len(self.exchanges) - self.done
            more = f" and {left - 1} more" if left > 1 else ""
            raise AssertionError(f"script not finished: exchange {self.done} of "
                                 f"{len(self.exchanges)} never made: "
                                 f"{self.exchanges[self.done]!r}{more}")
