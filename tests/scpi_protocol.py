"""Exact-command checking for SCPI driver tests: a scripted ``TextTransport``.

Each exchange is ``(command, reply)``: reply ``None`` means a plain write, a ``str`` is a
query's answer line, ``bytes`` is the raw definite-length block a binary query gets, and
an exception instance is raised instead of answering (a timeout, say).
"""

from __future__ import annotations

from wattlab.drivers.scpi import decode_definite_block

Reply = str | bytes | BaseException | None


class ScriptedTextTransport:
    """A TextTransport that checks every command, in order, against a script."""

    def __init__(self, exchanges: list[tuple[str, Reply]], resource_name: str = "SCRIPTED") -> None:
        self.resource_name = resource_name
        self._exchanges = list(exchanges)
        self.sent: list[str] = []
        self.closed = False

    def _next(self, cmd: str, kind: str) -> Reply:
        self.sent.append(cmd)
        if not self._exchanges:
            raise AssertionError(f"driver sent {cmd!r} ({kind}) after the script ended")
        expected, reply = self._exchanges.pop(0)
        if cmd != expected:
            raise AssertionError(f"driver sent {cmd!r} ({kind}), expected {expected!r}")
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def write(self, cmd: str) -> None:
        reply = self._next(cmd, "write")
        if reply is not None:
            raise AssertionError(f"{cmd!r} was written but the script has a reply {reply!r}")

    def query(self, cmd: str) -> str:
        reply = self._next(cmd, "query")
        if not isinstance(reply, str):
            raise AssertionError(f"{cmd!r} was queried but the script has reply {reply!r}")
        return reply

    def query_binary_block(self, cmd: str) -> bytes:
        reply = self._next(cmd, "binary query")
        if not isinstance(reply, bytes):
            raise AssertionError(f"{cmd!r} was a binary query but the script has {reply!r}")
        return decode_definite_block(reply, self.resource_name, cmd)

    def close(self) -> None:
        self.closed = True

    def assert_consumed(self) -> None:
        if self._exchanges:
            raise AssertionError(f"exchanges never made: {self._exchanges[:3]!r}")
