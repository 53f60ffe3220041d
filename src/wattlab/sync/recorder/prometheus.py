"""Prometheus exposition of a recording: ``--prometheus HOST:PORT`` on `record` and `agent`.

The exporter is a thread in the process that already holds the rows (the recorder, or an
agent), fed by :class:`~wattlab.sync.recorder.stream_metrics.StreamMetrics`. It computes nothing
between scrapes and sleeps in one ``select`` until a scraper connects (no polling
interval), so an unscraped exporter costs nothing and a scrape costs one snapshot.
``prometheus-client`` is an optional dependency (``pip install -e '.[prometheus]'``).
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from wattlab.errors import UsageError
from wattlab.sync.recorder.live_energy import MAX_SERIES, ProcessFigures
from wattlab.sync.recorder.stream_metrics import MetricsSnapshot, StreamMetrics

LOOPBACK = "127.0.0.1"
SCRAPE_TIMEOUT_S = 5.0
# scrapes served at once, one thread each; more connections are closed at once (a slowloris
# client held 204 threads, issue 36): scrapers are one or two Prometheus servers
MAX_SCRAPES_IN_FLIGHT = 8


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (loopback unless a host is given)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or LOOPBACK
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UsageError(f"--prometheus {text!r}: expected HOST:PORT with a port from 0 to "
                         "65535, e.g. 127.0.0.1:9464")
    return host, port


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_free(text: str) -> None:
    """Fail early, before a recording starts, if the exporter's address cannot be bound."""
    host, port = parse_address(text)
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(f"--prometheus {text}: cannot listen there: {e.strerror}") from e


def require_client() -> None:
    """A clear usage error where the optional dependency is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise UsageError("--prometheus needs the prometheus-client package: "
                         "pip install 'wattlab[prometheus]'") from e


class WattlabCollector:
    """Turns a metrics snapshot into Prometheus metric families at each scrape."""

    def __init__(self, metrics: StreamMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        return iter(families(self.metrics.snapshot(), CounterMetricFamily, GaugeMetricFamily))


def families(snap: MetricsSnapshot, counter: Any, gauge: Any) -> list[Any]:
    """The wattlab metric families of one snapshot."""
    power = gauge("wattlab_power_watts", "Last power reading of a stream's channel",
                  labels=["source", "channel"])
    energy = counter("wattlab_energy_joules", "Energy integrated over the stream's samples "
                     "(trapezoids, as wattlab energy)", labels=["source", "channel"])
    samples = counter("wattlab_samples", "Samples received", labels=["source"])
    gaps = counter("wattlab_gaps", "Gaps recorded (lost or missing data)", labels=["source"])
    last = gauge("wattlab_last_sample_timestamp_seconds",
                 "Wall time of the stream's newest sample (unix s)", labels=["source"])
    valid = gauge("wattlab_power_valid", "1 while the stream's energy so far passes the "
                  "validity checks made live (no gap, time never backwards, every value "
                  "finite; docs/validity.md), else 0", labels=["source"])
    for s in snap.streams:
        valid.add_metric([s.source], int(s.valid))
        for ch, p_w, e_j in zip(s.channels, s.power_w, s.energy_j, strict=True):
            power.add_metric([s.source, ch], p_w)
            energy.add_metric([s.source, ch], e_j)
        samples.add_metric([s.source], s.samples)
        gaps.add_metric([s.source], s.gaps)
        if s.last_unix_s is not None:
            last.add_metric([s.source], s.last_unix_s)
    offset = gauge("wattlab_clock_offset_seconds",
                   "Agent host's clock minus the recorder's (clock service)", labels=["host"])
    for host, offset_s in sorted(snap.clock_offsets_s.items()):
        offset.add_metric([host], offset_s)
    keys = ["source", "kind", "model", "driver", "firmware", "serial", "host"]
    info = gauge("wattlab_info", "The instrument behind each stream: GPU or meter model, "
                 "driver version", labels=keys)
    for labels in snap.info:
        info.add_metric([labels.get(k, "") for k in keys], 1)
    out = [power, energy, samples, gaps, last, offset, info, valid]
    if snap.processes is not None:
        out += process_families(snap.processes, counter, gauge)
    return out


KEPLER_HELP = ("by Kepler's rule, live: the GPU's power above its live idle and static "
               "estimates, shared by SM-utilisation share each second; idle and static not "
               "charged. `wattlab energy RUN --by-process` after the run is the better figure "
               "(Kepler's rule erred by up to +317 % on a small share, 20 points, on the "
               "measured pairs of BENCHMARKS.md). Dropped after the last process left "
               "(docs/fleet.md)")


def process_families(figures: ProcessFigures, counter: Any, gauge: Any) -> list[Any]:
    """Per-pod and per-job energy on each GPU, and what makes them honest."""
    pod_keys = ["gpu", "pod_uid", "pod_name", "namespace"]
    pods = counter("wattlab_gpu_pod_energy_joules", "A Kubernetes pod's GPU energy "
                   + KEPLER_HELP, labels=pod_keys)
    for labels, energy_j in figures.pods:
        pods.add_metric([labels[k] for k in pod_keys], energy_j)
    jobs = counter("wattlab_gpu_job_energy_joules", "A Slurm job's GPU energy " + KEPLER_HELP,
                   labels=["gpu", "slurm_job"])
    for labels, energy_j in figures.jobs:
        jobs.add_metric([labels["gpu"], labels["slurm_job"]], energy_j)
    refused = counter("wattlab_gpu_process_series_refused", "Pod or job series not created: "
                      f"{MAX_SERIES} were live (their energy is in no series)")
    refused.add_metric([], figures.refused)
    idle = gauge("wattlab_gpu_idle_watts", "The live idle estimate behind the pod and job "
                 "counters: the lowest 1 s mean with no process present (absent: not yet "
                 "known, and no counter grows)", labels=["gpu"])
    for gpu, idle_w in sorted(figures.idle_w.items()):
        idle.add_metric([gpu], idle_w)
    missing = gauge("wattlab_gpu_processes_missing", "1 for a GPU without a per-process "
                    "stream (its driver refused the query): no pod or job series for it",
                    labels=["gpu", "reason"])
    for gpu, reason in sorted(figures.missing.items()):
        missing.add_metric([gpu, reason], 1)
    late = counter("wattlab_gpu_process_rows_late", "Per-process rows that arrived after "
                   "their second was charged (once the power rows passed it by 3 s): "
                   "their utilisation charged nobody; growing, the per-process stream is late",
                   labels=["gpu"])
    for gpu, rows in sorted(figures.late_rows.items()):
        late.add_metric([gpu], rows)
    shared = counter("wattlab_gpu_instance_shared_energy_joules", "A MIG instance's energy "
                     "(Kepler's rule, as the pod and job counters) charged to no pod "
                     "(owner=pod) or no job (owner=job): processes of several, or of one and "
                     "of none, ran in it since it was last empty (energy --by-pod/--by-job "
                     "rule the same way after the run)", labels=["gpu", "gi", "owner"])
    for (gpu, gi, owner), energy_j in sorted(figures.shared_j.items()):
        shared.add_metric([gpu, str(gi), owner], energy_j)
    return [pods, jobs, refused, idle, missing, late, shared]


class _Quiet(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # a client that connects and never asks cannot hold close()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not news."""


class Exporter:
    """The HTTP endpoint (``/metrics``, any path) in a daemon thread; ``close()`` ends it."""

    def __init__(self, address: str, metrics: StreamMetrics) -> None:
        require_client()
        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        host, port = parse_address(address)
        self.refused_connections = 0  # closed at once: MAX_SCRAPES_IN_FLIGHT were served

        slots = threading.BoundedSemaphore(MAX_SCRAPES_IN_FLIGHT)
        exporter = self

        class Server(ThreadingWSGIServer):
            address_family = _family(host)
            # close() waits for scrapes in flight: a process that ends mid-reply would hand
            # the scraper a status line without headers or body
            daemon_threads = False
            block_on_close = True

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):
                    exporter.refused_connections += 1
                    self.shutdown_request(request)
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        registry = CollectorRegistry(auto_describe=False)
        registry.register(WattlabCollector(metrics))
        try:
            self._httpd = make_server(host, port, make_wsgi_app(registry), Server,
                                      handler_class=_Quiet)
        except OSError as e:
            raise UsageError(f"--prometheus {address}: cannot listen there: {e.strerror}") from e
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="prometheus", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._httpd.socket, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj == self._wake_r:
                        return
                    self._httpd.handle_request()

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        self._httpd.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)
