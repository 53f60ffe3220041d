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

Each due scrape only GETs the page and keeps it; the kept pages are read, and their rows
built as one Chunk, once per ``BATCH_S`` (and at ``flush``): the same rows, gaps and
warnings as reading each page at once, in the same order. A failed GET starts its outage
at once (the kept pages are read first: one of them may have failed before it).
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
# How long a scraped page may wait before it is read and its row sent. Why batch: reading a
# page and building its row right after a 100 ms sleep finds a cold cache and costs several
# times what it costs in a batch, and each batch is one bus message and one piece of
# recorder work instead of one a row (a recording of the scrape alone: 1.6 -> 0.6-0.7 % of
# a core; BENCHMARKS.md, "What `record --scrape` costs"). Why 0.9 s:
# the NVML reader's default emit, so the scrape stream's crash-loss bound (what it holds +
# the recorder's 0.5 s flush) stays the whole recording's, emit + 0.5 s (docs/reliability.md,
# "What a crash of the whole recording costs").
BATCH_S = 0.9


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

    ``clock_ns``, ``sleep`` and ``get`` (the GET: status, reason, body) are injectable so
    tests can step time and serve pages without a socket; ``batch_s`` 0 reads each page at
    once.
    """

    def __init__(self, url: str, source_id: str = "scrape", *, metrics: tuple[str, ...] = (),
                 hz: float = DEFAULT_HZ, timeout_s: float = DEFAULT_TIMEOUT_S,
                 batch_s: float = BATCH_S,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[int, float], bool] = sleep_until_due,
                 get: Callable[[], tuple[int, str, bytes]] | None = None) -> None:
        self.scheme, self.host, self.port, self.path = check_url(url)
        self.url = url
        self.source_id = source_id
        self.named = tuple(dict.fromkeys(metrics))  # the user's, in order, once each
        self.metrics = self.named or DEFAULT_METRICS
        self.hz = check_hz(hz)
        self.timeout_s = timeout_s
        self._step_ns = round(1e9 / self.hz)
        self._batch_ns = round(batch_s * 1e9)
        self._clock = clock_ns
        self._sleep = sleep
        self._http = KeptAliveGet(self.scheme, self.host, self.port, self.path, timeout_s)
        self._get = get or self._http.get
        self._held: list[tuple[int, int, bytes]] = []  # (t_try, t_ns, body) not yet read
        self._series: list[Series] = []
        self._unrecorded: set[Series] = set()
        self._last_ok_ns = 0
        self._due_ns = 0
        self._outage: tuple[int, str] | None = None  # (first failure ns, its reason)
        self._pending: list[Reading] = []

    # ------------------------------------------------------------------ HTTP

    def fetch(self) -> tuple[int, bytes]:
        """(host time of the GET's midpoint, the page), over one kept-alive connection."""
        t0 = self._clock()
        try:
            status, reason, body = self._get()
        except (OSError, MeterError, ValueError) as e:
            raise MeterError(f"scrape of {self.url} failed: {type(e).__name__}: {e}") from None
        if status != 200:
            raise MeterError(f"scrape of {self.url} failed: HTTP {status} {reason}")
        return (t0 + self._clock()) // 2, body

    def scrape(self) -> tuple[int, dict[Series, float], str]:
        """(host time of the scrape's midpoint, the wanted samples, the text)."""
        t_ns, body = self.fetch()
        text = body.decode("utf-8", errors="replace")
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
        self._pending.append(self._chunk([t_ns], [[found[s] for s in self._series]]))
        self._last_ok_ns = t_ns
        self._due_ns = t_ns + self._step_ns
        return [SourceDescriptor(
            source_id=self.source_id, kind="counter", model="Prometheus endpoint",
            channels=tuple(Channel(s.name, unit_of(s.metric), meaning_of(s.metric))
                           for s in self._series),
            transport=self.url, host=socket.gethostname(),
            config={"url": self.url, "hz": self.hz, "timeout_s": self.timeout_s,
                    "metrics": list(self.metrics if self.named else sorted(seen)),
                    "series": {s.name: {"metric": s.metric, "labels": dict(s.labels)}
                               for s in self._series}})]

    def _chunk(self, times: list[int], rows: list[list[float]]) -> Chunk:
        """One Chunk of many rows: one pair of numpy arrays a batch, not a pair a row."""
        return Chunk(self.source_id, np.array(times, dtype=np.int64),
                     np.array(rows, dtype=np.float64))

    def poll(self) -> list[Reading]:
        """One scrape when due; the rows (and gap rows) of the kept pages once a batch is due."""
        if not self._series:
            raise MeterError(f"scrape {self.url}: poll before open")
        pending, self._pending = self._pending, []
        if not self._sleep(self._due_ns, POLL_STEP_S):
            return pending
        return pending + self._read()

    def _read(self) -> list[Reading]:
        """GET the page and keep it; read the kept pages once a batch is due.

        Due when waiting for the next scrape would keep the oldest page longer than
        ``BATCH_S``; at once in an outage (its end is news).
        """
        t_try = self._clock()
        self._due_ns = max(self._due_ns + self._step_ns, t_try + self._step_ns // 2)
        try:
            t_ns, body = self.fetch()
        except MeterError as e:
            out = self._take()  # a kept page may have failed first: its outage comes first
            self._fail(t_try, e)
            return out
        self._held.append((t_try, t_ns, body))
        if self._outage is not None or self._due_ns > self._held[0][0] + self._batch_ns:
            return self._take()
        return []

    def _take(self) -> list[Reading]:
        """Read every kept page in scrape order, as if each had been read when scraped.

        Each gives its row, or the outage it starts (at its t_try) or ends (a gap row);
        consecutive rows make one Chunk.
        """
        held, self._held = self._held, []
        out: list[Reading] = []
        times: list[int] = []
        rows: list[list[float]] = []
        for t_try, t_ns, body in held:
            try:
                found = parse_exposition(body.decode("utf-8", errors="replace"), self.metrics,
                                         self.url)
                row = [found[s] for s in self._series]
            except KeyError:
                gone = [s.name for s in self._series if s not in found]
                self._fail(t_try, MeterError(f"scrape of {self.url}: series "
                                             f"{', '.join(gone)} gone from the endpoint"))
                continue
            except MeterError as e:
                self._fail(t_try, e)
                continue
            if len(found) > len(row):  # every recorded series is there: more are new
                self._warn_new(found)
            if self._outage is not None:
                if times:
                    out.append(self._chunk(times, rows))
                    times, rows = [], []
                out += self._end_outage(t_ns)
            times.append(t_ns)
            rows.append(row)
            self._last_ok_ns = t_ns
        if times:
            out.append(self._chunk(times, rows))
        return out

    def _fail(self, t_try: int, e: MeterError) -> None:
        """A failed scrape: the first of an outage starts it, with one line on stderr."""
        if self._outage is None:
            self._outage = (t_try, str(e))
            print(f"wattlab: {self.source_id}: {e}; no rows until a scrape works again "
                  f"(retrying at {self.hz:g} Hz)", file=sys.stderr, flush=True)

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
        """The kept pages' rows and the last scrape's: the counters run to the stop.

        An outage still open ends here.
        """
        if not self._series:
            return []
        pending, self._pending = self._pending, []
        out = pending + self._read()
        out += self._take()
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
