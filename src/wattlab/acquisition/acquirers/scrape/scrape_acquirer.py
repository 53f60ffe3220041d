"""A server's Prometheus counters as a source: ``wattlab record --scrape URL``.

Stream ``<id>`` (``scrape``) of kind ``counter``: one channel per series of the wanted
metrics present at the first scrape, named as Prometheus names it
(``vllm:generation_tokens_total{model_name="m"}``), value = the series' value as served
(float64, raw: a counter that drops after a server restart is stored as it is, and the
analysis counts it as a reset), time = host monotonic ns of the scrape's midpoint.
``config["series"]`` maps each channel to its metric and labels.

A scrape that fails (the server went away, an HTTP error, a sample that is not a number, a
series gone) starts an outage: one line on stderr, and when the server answers again (or
the recording stops) one gap row spanning the last good scrape to the next one, with the
first failure's reason. Rows resume on the first good scrape.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading, sleep_until_due
from wattlab.acquisition.acquirers.meter_registry import MeterKind, register
from wattlab.acquisition.acquirers.scrape.exposition import Series, metric_names, parse_exposition
from wattlab.acquisition.acquirers.scrape.http_get import KeptAliveGet
from wattlab.acquisition.acquirers.scrape.known_metrics import (
    DEFAULT_METRICS,
    meaning_of,
    unit_of,
)
from wattlab.errors import MeterError, UsageError
from wattlab.option_checks import positive_number, string_list
from wattlab.samples import Channel, Gap, SourceDescriptor

DEFAULT_HZ = 10.0
MAX_HZ = 100.0
DEFAULT_TIMEOUT_S = 1.0
POLL_STEP_S = 0.1
SHOWN_NAMES = 12  # metric names an error lists from what the endpoint serves


def check_url(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path?query) of an http(s) URL, or a UsageError saying why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--scrape {url!r}: not an http:// or https:// URL with a host "
                         "(e.g. http://localhost:8000/metrics)")
    try:
        port = parts.port
    except ValueError as e:
        raise UsageError(f"--scrape {url!r}: {e}") from None
    path = (parts.path or "/metrics") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def check_hz(hz: float) -> float:
    if not 0 < hz <= MAX_HZ:
        raise UsageError(f"--scrape-hz must be in (0, {MAX_HZ:g}], got {hz:g}")
    return hz


class ScrapeAcquirer:
    """Polls one endpoint at ``hz``; ``metrics`` empty: the known serving metrics present.

    ``clock_ns`` and ``sleep`` are injectable so tests can step time.
    """

    def __init__(self, url: str, source_id: str = "scrape", *, metrics: tuple[str, ...] = (),
                 hz: float = DEFAULT_HZ, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[int, float], bool] = sleep_until_due) -> None:
        self.scheme, self.host, self.port, self.path = check_url(url)
        self.url = url
        self.source_id = source_id
        self.named = tuple(dict.fromkeys(metrics))  # the user's, in order, once each
        self.metrics = self.named or DEFAULT_METRICS
        self.hz = check_hz(hz)
        self.timeout_s = timeout_s
        self._clock = clock_ns
        self._sleep = sleep
        self._http = KeptAliveGet(self.scheme, self.host, self.port, self.path, timeout_s)
        self._series: list[Series] = []
        self._unrecorded: set[Series] = set()
        self._last_ok_ns = 0
        self._due_ns = 0
        self._outage: tuple[int, str] | None = None  # (first failure ns, its reason)
        self._pending: list[Reading] = []

    # ------------------------------------------------------------------ HTTP

    def fetch(self) -> str:
        """The endpoint's exposition text, over one kept-alive connection."""
        try:
            status, reason, body = self._http.get()
        except (OSError, MeterError, ValueError) as e:
            raise MeterError(f"scrape of {self.url} failed: {type(e).__name__}: {e}") from None
        if status != 200:
            raise MeterError(f"scrape of {self.url} failed: HTTP {status} {reason}")
        return body.decode("utf-8", errors="replace")

    def scrape(self) -> tuple[int, dict[Series, float], str]:
        """(host time of the scrape's midpoint, the wanted samples, the text)."""
        t0 = self._clock()
        text = self.fetch()
        t_ns = (t0 + self._clock()) // 2
        return t_ns, parse_exposition(text, self.metrics, self.url), text

    # ------------------------------------------------------------------ the protocol

    def open(self) -> list[SourceDescriptor]:
        """Scrape once: the series found are the channels; a metric never seen is an error."""
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> list[SourceDescriptor]:
        try:
            t_ns, found, text = self.scrape()
        except MeterError as e:
            raise UsageError(f"--scrape {self.url}: {e}") from None
        self._series = sorted(found, key=lambda s: (self.metrics.index(s.metric), s.labels))
        seen = {s.metric for s in self._series}
        missing = [m for m in self.named if m not in seen]
        if missing or not self._series:
            served = metric_names(text)
            shown = ", ".join(served[:SHOWN_NAMES]) + (" ..." if len(served) > SHOWN_NAMES
                                                       else "")
            what = (f"metric(s) {', '.join(missing)} never seen" if missing else
                    "none of the known serving metrics (vLLM, SGLang, TGI: docs/scrape.md)")
            raise UsageError(f"--scrape {self.url}: {what}; it serves "
                             f"{len(served)} metric(s): {shown or 'none'}; name them with "
                             "--scrape-metric NAME")
        self.metrics = tuple(m for m in self.metrics if m in seen)  # what later scrapes read
        self._pending.append(self._row(t_ns, found))
        self._last_ok_ns = t_ns
        self._due_ns = t_ns + round(1e9 / self.hz)
        return [SourceDescriptor(
            source_id=self.source_id, kind="counter", model="Prometheus endpoint",
            channels=tuple(Channel(s.name, unit_of(s.metric), meaning_of(s.metric))
                           for s in self._series),
            transport=self.url, host=socket.gethostname(),
            config={"url": self.url, "hz": self.hz, "timeout_s": self.timeout_s,
                    "metrics": list(self.metrics if self.named else sorted(seen)),
                    "series": {s.name: {"metric": s.metric, "labels": dict(s.labels)}
                               for s in self._series}})]

    def _row(self, t_ns: int, found: Mapping[Series, float]) -> Chunk:
        values = np.array([[found[s] for s in self._series]], dtype=np.float64)
        return Chunk(self.source_id, np.array([t_ns], dtype=np.int64), values)

    def poll(self) -> list[Reading]:
        """One scrape when due: a row, or (after an outage) its gap row and then the row."""
        if not self._series:
            raise MeterError(f"scrape {self.url}: poll before open")
        pending, self._pending = self._pending, []
        if not self._sleep(self._due_ns, POLL_STEP_S):
            return pending
        return pending + self._read()

    def _read(self) -> list[Reading]:
        step = round(1e9 / self.hz)
        t_try = self._clock()
        self._due_ns = max(self._due_ns + step, t_try + step // 2)
        try:
            t_ns, found, _ = self.scrape()
            gone = [s.name for s in self._series if s not in found]
            if gone:
                raise MeterError(f"scrape of {self.url}: series {', '.join(gone)} gone "
                                 "from the endpoint")
        except MeterError as e:
            if self._outage is None:
                self._outage = (t_try, str(e))
                print(f"wattlab: {self.source_id}: {e}; no rows until a scrape works again "
                      f"(retrying at {self.hz:g} Hz)", file=sys.stderr, flush=True)
            return []
        self._warn_new(found)
        out: list[Reading] = self._end_outage(t_ns)
        out.append(self._row(t_ns, found))
        self._last_ok_ns = t_ns
        return out

    def _warn_new(self, found: Mapping[Series, float]) -> None:
        new = [s for s in found if s not in self._series and s not in self._unrecorded]
        if new:
            self._unrecorded.update(new)
            print(f"wattlab: scrape of {self.url}: series {', '.join(s.name for s in new)} "
                  "appeared after the recording began; not recorded (docs/scrape.md)",
                  file=sys.stderr, flush=True)

    def _end_outage(self, t_ns: int) -> list[Reading]:
        if self._outage is None:
            return []
        first_ns, reason = self._outage
        self._outage = None
        print(f"wattlab: {self.source_id}: {self.url} scraped again after "
              f"{(t_ns - first_ns) / 1e9:.1f} s; rows resume", file=sys.stderr, flush=True)
        return [Gap(self.source_id, f"{reason} (no scrape answered from here to the next row)",
                    t_first_ns=self._last_ok_ns, t_last_ns=t_ns)]

    def flush(self) -> list[Reading]:
        """The last scrape, so the counters run to the stop; an outage still open ends here."""
        if not self._series:
            return []
        pending, self._pending = self._pending, []
        out = pending + self._read()
        if self._outage is not None:
            out += self._end_outage(self._clock())
        return out

    def close(self) -> None:
        self._http.close()


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> ScrapeAcquirer:
    return ScrapeAcquirer(address, source_id, metrics=tuple(options.get("metrics") or ()),
                          hz=float(options.get("hz", DEFAULT_HZ)),
                          timeout_s=float(options.get("timeout_s", DEFAULT_TIMEOUT_S)))


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    """A simulated LLM server serving vLLM's counters until Ctrl-C."""
    from wattlab.hardware.simulated_server import serve_forever

    return serve_forever(seed)


KIND = register(MeterKind(
    kind="scrape", default_id="scrape", aliases=("prometheus",), address_key="url",
    help="a server's work counters (tokens, requests) from its Prometheus endpoint",
    build=_build,
    options={"metrics": (string_list, None), "hz": (positive_number, None),
             "timeout_s": (positive_number, None)},
    stream_rate=None,  # not measured: the disk budget counts its chunks only
    emulate=_emulate, emulate_as=("scrape", "vllm"),
    template="""
# A serving framework's work counters (vLLM, SGLang, TGI) from its Prometheus endpoint:
# tokens and requests for `wattlab energy --per token` (docs/scrape.md).
# [[device]]
# kind = "scrape"
# id = "scrape"
# url = "http://localhost:8000/metrics"
# metrics = ["vllm:generation_tokens_total", "vllm:prompt_tokens_total"]
# hz = 10
""",
))
