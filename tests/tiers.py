"""Test tiers: every test is ``fast``, ``system``, ``bench`` or ``device``, and a fast test
proves it.

- ``fast``: pure functions, byte-exact protocols, analysis of small real files. No process
  started, no network or ZeroMQ socket, no serial or pseudo-terminal device.
- ``system``: real sockets, ptys, recorders and subprocesses, real Prometheus and Slurm
  where installed.
- ``bench``: each benchmark runs and writes its JSON (its numbers go to BENCHMARKS.md).
- ``device``: a real GPU (opt-in, ``WATTLAB_DEVICE=1``).

Why checked by behaviour and not by name: a marker that nobody checks drifts. A test
without a tier stops the collection; a fast test that starts a process or opens a socket
while its setup or call runs fails, naming what it did (session-scoped artefacts, built
once and only read by many tests, aside). A pure test over a second is ``system`` too: the
fast tier is the inner loop. Set ``WATTLAB_TIER_SURVEY=FILE`` to write, for every test,
what it did and how long its setup and call took (JSON lines): the evidence a tier rests on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("fast", "system", "bench", "device")
DESCRIPTIONS = {
    "fast": "pure functions, byte-exact protocols, small real files: no process, socket or "
            "device node (checked while it runs)",
    "system": "real sockets, ptys, recorders, subprocesses, or over a second",
    "bench": "a benchmark runs and writes its JSON",
    "device": "needs a real GPU (tests/with_device, opt-in)",
}
# A standing wall-time budget per tier on the 2-core machine, quiet, collection included;
# bench/tiers.py measures each tier against it and later work must keep it.
BUDGET_S = {"fast": 60.0, "system": 420.0, "bench": 120.0}
_PROCESS_EVENTS = {"subprocess.Popen": "started a process", "os.system": "started a process",
                   "os.posix_spawn": "started a process", "os.fork": "forked",
                   "os.exec": "exec'd a program"}
_SOCKET_EVENTS = {"socket.bind": "bound a socket", "socket.connect": "connected a socket"}
_DEVICE_PREFIXES = ("/dev/pts", "/dev/tty", "/dev/ptmx")


def tiers_of(item: pytest.Item) -> set[str]:
    """Every tier marker on the test, its own and its module's. Exactly one is right: ``-m``
    selects a test by any marker it carries, so a function's marker cannot override its
    module's (a module of mixed tiers marks each test instead)."""
    return {m.name for m in item.iter_markers() if m.name in TIERS}


class _Watch:
    """What the running test did that a fast test must not (one audit hook per process)."""

    def __init__(self) -> None:
        self.active = False
        self.seen: list[str] = []

    def _counts(self) -> bool:
        # only the test's own thread: a thread some earlier test left behind is not this one's
        return self.active and threading.current_thread() is threading.main_thread()

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._counts():
            return
        what = _PROCESS_EVENTS.get(event) or _SOCKET_EVENTS.get(event)
        if what is None and event == "open" and isinstance(args[0], str | os.PathLike):
            path = os.fspath(args[0])
            if isinstance(path, str) and path.startswith(_DEVICE_PREFIXES):
                what = f"opened {path}"
        if what is not None and what not in self.seen:
            self.seen.append(what)

    @contextmanager
    def watching(self, active: bool) -> Iterator[None]:
        """Watch (or not) for the duration of a phase or a fixture's setup."""
        before, self.active = self.active, active
        try:
            yield
        finally:
            self.active = before

    def zmq_socket(self) -> None:
        if self._counts() and "made a ZeroMQ socket" not in self.seen:
            self.seen.append("made a ZeroMQ socket")


class TierPlugin:
    """Registered by conftest: marker check at collection, watch while each test runs."""

    def __init__(self, survey_path: str | None) -> None:
        self.watch = _Watch()
        sys.addaudithook(self.watch)
        self._patch_zmq()
        self.survey_path = survey_path
        self.durations_s: dict[str, float] = {}
        self._ran_here: set[str] = set()  # xdist's controller sees reports of others' runs

    def _patch_zmq(self) -> None:
        import zmq

        original = zmq.Context.socket
        watch = self.watch

        def socket(context: Any, *args: Any, **kwargs: Any) -> Any:
            watch.zmq_socket()
            return original(context, *args, **kwargs)

        zmq.Context.socket = socket  # type: ignore[method-assign]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.survey_path:
            return
        wrong = [f"{item.nodeid}: {sorted(tiers_of(item)) or 'none'}" for item in items
                 if len(tiers_of(item)) != 1]
        if wrong:
            listed = "\n  ".join(wrong[:20])
            raise pytest.UsageError(
                f"{len(wrong)} test(s) carry no tier marker or more than one (one of "
                f"{', '.join(TIERS)}; see tests/tiers.py and docs/development.md):\n  {listed}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        self._ran_here.add(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        self.watch.seen.clear()
        with self.watch.watching(True):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[
            None, Any, Any]:
        # a session artefact (a recording made once, read by many) is not one test's doing
        with self.watch.watching(self.watch.active and fixturedef.scope != "session"):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        with self.watch.watching(True):
            result = yield
        if self.watch.seen and tiers_of(item) == {"fast"} and not self.survey_path:
            pytest.fail(f"{item.nodeid} is marked fast but it "
                        f"{'; '.join(self.watch.seen)}: mark it system", pytrace=False)
        return result

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.survey_path and report.nodeid in self._ran_here:
            self.durations_s[report.nodeid] = self.durations_s.get(report.nodeid, 0.0) + (
                report.duration)
            if report.when == "call":
                self._survey(report.nodeid)

    def _survey(self, nodeid: str) -> None:
        assert self.survey_path is not None
        with open(self.survey_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"test": nodeid, "did": sorted(set(self.watch.seen)),
                                  "setup_call_s": round(self.durations_s[nodeid], 3)}) + "\n")


def configure(config: pytest.Config) -> None:
    """Declare the tier markers and register the plugin (called from conftest)."""
    for name in TIERS:
        config.addinivalue_line("markers", f"{name}: {DESCRIPTIONS[name]}")
    config.pluginmanager.register(TierPlugin(os.environ.get("WATTLAB_TIER_SURVEY")),
                                  "wattlab-tiers")
