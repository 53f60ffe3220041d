"""`wattlab record --scrape`: the exposition parser, the scraper against a real local HTTP
endpoint (outages, resets, bad samples), and the options' bad input (docs/scrape.md)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.conftest import free_port
from wattlab.acquisition.acquirers import Chunk
from wattlab.acquisition.acquirers.scrape import ScrapeAcquirer, Series, check_url, unit_of
from wattlab.acquisition.acquirers.scrape.exposition import parse_exposition
from wattlab.acquisition.meters.scrape_flags import PLAIN_ID, metric_list
from wattlab.cli import main
from wattlab.errors import MeterError, UsageError
from wattlab.hardware.metrics_endpoint import MetricsEndpoint
from wattlab.samples import Gap

VLLM = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 1234.0
vllm:generation_tokens_total_created{model_name="m"} 1.7e9
vllm:prompt_tokens_total{model_name="m"} 5.6e+03 1700000000000
vllm:request_success_total{finished_reason="stop",model_name="m"} 3
vllm:request_success_total{model_name="m",finished_reason="length"} 4
vllm:num_requests_running{model_name="m"} +Inf
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 1.0
"""
WANTED = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
          "vllm:request_success_total", "vllm:num_requests_running")


@pytest.mark.fast
def test_exposition_reads_the_wanted_series_with_labels_and_skips_the_rest() -> None:
    found = parse_exposition(VLLM, WANTED)
    assert found[Series("vllm:generation_tokens_total", (("model_name", "m"),))] == 1234.0
    assert found[Series("vllm:prompt_tokens_total", (("model_name", "m"),))] == 5600.0
    length = Series("vllm:request_success_total",
                    (("finished_reason", "length"), ("model_name", "m")))
    assert found[length] == 4.0  # labels sorted, whatever order the server wrote them in
    assert length.name == 'vllm:request_success_total{finished_reason="length",model_name="m"}'
    assert math.isinf(found[Series("vllm:num_requests_running", (("model_name", "m"),))])
    assert len(found) == 5  # not the _created line sharing a prefix, nor the histogram


@pytest.mark.fast
def test_exposition_unescapes_label_values() -> None:
    text = 'x_total{path="a\\"b\\\\c\\nd",b="{,}"} 2\n'
    (series,) = parse_exposition(text, ("x_total",))
    assert dict(series.labels) == {"path": 'a"b\\c\nd', "b": "{,}"}
    assert parse_exposition(series.name + " 2\n", ("x_total",)) == {series: 2.0}


@pytest.mark.fast
@pytest.mark.parametrize(("line", "message"), [
    ('x_total{model="m"} twelve', "line 2: sample value 'twelve' is not a number"),
    ('x_total{model=m} 1', "line 2: labels"),
    ("x_total", "line 2: cannot read"),
])
def test_a_bad_wanted_line_is_an_error_naming_it(line: str, message: str) -> None:
    with pytest.raises(MeterError, match=message):
        parse_exposition(f"# TYPE x_total counter\n{line}\n", ("x_total",), "http://h/metrics")
    assert parse_exposition(f"{line}\ny 1\n", ("y",)) == {Series("y"): 1.0}  # not wanted


@pytest.mark.fast
def test_units_from_the_known_table_and_the_naming_conventions() -> None:
    assert unit_of("vllm:generation_tokens_total") == "token"
    assert unit_of("tgi_request_success") == "request"
    assert unit_of("vllm:num_requests_running") == "1"
    assert unit_of("my_images_samples_total") == "sample"
    assert unit_of("queue_depth") == "1"


@pytest.mark.fast
@pytest.mark.parametrize("url", ["ftp://h/metrics", "localhost:8000/metrics", "http://",
                                 "http://h:99999/metrics", "/metrics"])
def test_a_url_that_is_not_http_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="--scrape"):
        check_url(url)


@pytest.mark.fast
def test_urls_and_metric_names_keep_their_colons() -> None:
    assert check_url("http://h:8000/metrics?x=1") == ("http", "h", 8000, "/metrics?x=1")
    assert check_url("https://h") == ("https", "h", None, "/metrics")
    assert PLAIN_ID.match("http://h:8000/metrics?a=b") is None  # '=' in a query: not an id
    assert PLAIN_ID.match("llm=http://h:8000/metrics").groups() == ("llm",
                                                                   "http://h:8000/metrics")
    assert metric_list(["vllm:a_total,vllm:b", "c"]) == ["vllm:a_total", "vllm:b", "c"]
    with pytest.raises(UsageError, match="'9lives'"):
        metric_list(["9lives"])


class Served:
    """What the test endpoint serves; changed by the test as it goes."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.extra = ""

    def text(self) -> str:
        return (f'vllm:generation_tokens_total{{model_name="m"}} {self.tokens}\n'
                f'vllm:num_requests_running{{model_name="m"}} 2\n{self.extra}')


def scraper(url: str, **kwargs: object) -> ScrapeAcquirer:
    return ScrapeAcquirer(url, "scrape", sleep=lambda due_ns, step_s: True,
                          timeout_s=2.0, **kwargs)  # type: ignore[arg-type]


def rows(readings: list[object]) -> list[float]:
    """The first channel of every row (a Chunk holds a batch of rows)."""
    return [float(v) for r in readings if isinstance(r, Chunk) for v in r.values[:, 0]]


@pytest.mark.system
def test_scraper_reads_counters_from_a_real_endpoint_as_a_counter_stream() -> None:
    served = Served()
    with MetricsEndpoint(served.text) as endpoint:
        acq = scraper(endpoint.url)
        (desc,) = acq.open()
        served.tokens = 7.0
        first = acq.poll()
        served.tokens = 3.0  # the server restarted: stored raw, the analysis sees a reset
        second = acq.poll()
        last = acq.flush()  # the rows held for their batch, and the stop's own scrape
        acq.close()
    assert desc.kind == "counter"
    assert desc.channel_names == ['vllm:generation_tokens_total{model_name="m"}',
                                  'vllm:num_requests_running{model_name="m"}']
    assert [c.unit for c in desc.channels] == ["token", "1"]
    assert desc.config["series"][desc.channel_names[0]] == {
        "metric": "vllm:generation_tokens_total", "labels": {"model_name": "m"}}
    assert rows(first)[:1] == [0.0] and rows(first + second + last) == [0.0, 7.0, 3.0, 3.0]
    times = [int(t) for r in first + second + last if isinstance(r, Chunk) for t in r.t_host_ns]
    assert len(times) == 4 and times == sorted(times)


def gone_after_one_scrape(served: Served) -> tuple[MetricsEndpoint, ScrapeAcquirer]:
    """A scraper that read its endpoint at open and once more, then the endpoint stopped:
    the failed GET handed over the row held for its batch and began the outage."""
    endpoint = MetricsEndpoint(served.text).start()
    acq = scraper(endpoint.url)
    acq.open()
    read = acq.poll()
    endpoint.stop()
    read += acq.poll()
    assert rows(read) == [0.0, 0.0]
    return endpoint, acq


@pytest.mark.system
def test_a_server_that_goes_away_leaves_one_gap_and_rows_resume(capsys) -> None:
    served = Served()
    endpoint, acq = gone_after_one_scrape(served)
    assert acq.poll() == [] and acq.poll() == []  # no rows, no crash
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scrape of http://127.0.0.1" in err, err
    endpoint.start()  # the same port again
    served.tokens = 9.0
    back = acq.poll()
    endpoint.stop()
    acq.close()
    gaps = [r for r in back if isinstance(r, Gap)]
    assert len(gaps) == 1 and "scrape of" in gaps[0].reason
    assert gaps[0].t_first_ns < gaps[0].t_last_ns
    assert rows(back) == [9.0]
    assert "scraped again" in capsys.readouterr().err


@pytest.mark.system
def test_an_outage_still_open_at_the_stop_is_a_gap_row() -> None:
    _, acq = gone_after_one_scrape(Served())
    acq.poll()
    tail = acq.flush()
    acq.close()
    assert [type(r) for r in tail] == [Gap]


@pytest.mark.system
def test_a_non_numeric_sample_mid_run_is_a_gap_and_at_open_a_usage_error() -> None:
    served = Served()
    with MetricsEndpoint(served.text) as endpoint:
        acq = scraper(endpoint.url)
        acq.open()
        served.extra = 'vllm:generation_tokens_total{model_name="n"} lots\n'
        assert rows(acq.poll()) == [0.0]  # only the row read at open
        served.extra = ""
        back = acq.poll() + acq.flush()  # the pages held for their batch read at the stop
        acq.close()
        assert "'lots' is not a number" in next(r for r in back if isinstance(r, Gap)).reason
        served.extra = 'vllm:generation_tokens_total{model_name="n"} lots\n'
        with pytest.raises(UsageError, match="line 3: sample value 'lots'"):
            scraper(endpoint.url).open()


@pytest.mark.system
def test_a_metric_never_seen_is_named_with_what_the_server_serves() -> None:
    with MetricsEndpoint(Served().text) as endpoint:
        acq = scraper(endpoint.url, metrics=("vllm:generation_tokens_total", "sglang:x"))
        with pytest.raises(UsageError, match=r"metric\(s\) sglang:x never seen; it serves 2 "
                                             r"metric\(s\): vllm:generation_tokens_total, "):
            acq.open()
    with MetricsEndpoint(lambda: "up 1\n") as endpoint, \
            pytest.raises(UsageError, match="none of the known serving metrics"):
        scraper(endpoint.url).open()


@pytest.mark.system
def test_nobody_answering_at_open_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="ConnectionRefusedError"):
        scraper(f"http://127.0.0.1:{free_port()}/metrics").open()


def record(out: Path, url: str, *extra: str) -> int:
    return main(["record", "--nvml", "none", "--scrape", url, "--duration", "1.5",
                 "-o", str(out), "--no-live", *extra])


@pytest.mark.system
def test_record_scrape_writes_the_counters_on_the_runs_timebase(tmp_path: Path) -> None:
    served = Served()
    with MetricsEndpoint(lambda: (setattr(served, "tokens", served.tokens + 1)
                                  or served.text())) as endpoint:
        code = record(tmp_path / "s.h5", endpoint.url, "--scrape-metric",
                      "vllm:generation_tokens_total", "--scrape-hz", "20")
    assert code == 0
    with wattlab.open(str(tmp_path / "s.h5")) as run:
        stream = run.source("scrape")
        tokens = stream.channel('vllm:generation_tokens_total{model_name="m"}')
        assert run.sources["scrape"].kind == "counter"
        rate_hz = (len(tokens) - 1) / (np.ptp(stream.time_ns) / 1e9)
        assert len(tokens) >= 20 and 17 < rate_hz < 21  # 20 Hz for 1.5 s and the edges
        assert np.all(np.diff(tokens) > 0) and np.all(np.diff(stream.time_ns) > 0)


@pytest.mark.system
def test_record_scrape_in_its_own_source_process(tmp_path: Path) -> None:
    with MetricsEndpoint(Served().text) as endpoint:
        code = record(tmp_path / "p.h5", endpoint.url, "--source-processes",
                      "--scrape-metric", "vllm:num_requests_running")
    assert code == 0
    with wattlab.open(str(tmp_path / "p.h5")) as run:
        assert run.sources["scrape"].channel_names == [
            'vllm:num_requests_running{model_name="m"}']
        assert len(run.source("scrape")) >= 10


class GoesAway:
    """An endpoint that goes away after its ``after``-th scrape for ``away_s``, then returns."""

    def __init__(self, after: int, away_s: float) -> None:
        self.served = Served()
        self.after, self.away_s = after, away_s
        self.endpoint = MetricsEndpoint(self.text)
        self.outage = threading.Thread(target=self.go_away)

    def text(self) -> str:
        if self.endpoint.requests == self.after:
            self.outage.start()  # not from the handler's own thread: it must answer first
        return self.served.text()

    def go_away(self) -> None:
        self.endpoint.stop()
        threading.Event().wait(self.away_s)
        self.endpoint.start()


@pytest.mark.system
def test_record_through_an_outage_keeps_recording_and_exits_1(tmp_path: Path, capsys) -> None:
    server = GoesAway(after=5, away_s=0.4)  # the probe, the open, three polls
    server.endpoint.start()
    try:
        code = record(tmp_path / "o.h5", server.endpoint.url)
    finally:
        server.outage.join()
        server.endpoint.stop()
    err = capsys.readouterr().err
    assert code == 1, err
    with wattlab.open(str(tmp_path / "o.h5")) as run:
        (gap,) = [g for g in run.gaps if g.source == "scrape"]
        t = run.source("scrape").time_ns
        assert "scrape of" in gap.reason
        assert t[0] < gap.time_first_ns and t[-1] > gap.time_last_ns  # rows on both sides
        assert gap.time_last_ns - gap.time_first_ns > 0.4e9
    assert "Traceback" not in err
    assert sum("no rows until a scrape works again" in line for line in err.splitlines()) == 1


@pytest.mark.system
@pytest.mark.parametrize(("argv", "names"), [
    (["--scrape", "http://127.0.0.1:FREE/metrics"], "ConnectionRefusedError"),
    (["--scrape", "URL/nowhere"], "HTTP 404"),
    (["--scrape", "HTML"], "none of the known serving metrics"),
    (["--scrape", "ftp://h/metrics"], "--scrape 'ftp://h/metrics'"),
    (["--scrape-metric", "vllm:x"], "--scrape-metric and --scrape-hz need --scrape"),
    (["--scrape", "URL", "--scrape-metric", "vllm:nope"], "vllm:nope never seen"),
])
def test_bad_scrape_options_exit_2_with_one_line(argv: list[str], names: str, tmp_path: Path,
                                                 capsys) -> None:
    with MetricsEndpoint(Served().text) as endpoint, \
            MetricsEndpoint(lambda: "<html>hello</html>\n") as html:
        argv = [a.replace("URL", endpoint.url).replace("HTML", html.url)
                .replace("FREE", str(free_port())) for a in argv]
        code = main(["record", "--nvml", "none", "--duration", "1", "-o",
                     str(tmp_path / "n.h5"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and names in err[0], err
    assert list(tmp_path.iterdir()) == []


def raw_server(responses: list[bytes]) -> tuple[int, threading.Thread]:
    """A TCP server answering each request with the next of ``responses`` (one per connection
    where a response ends by closing)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            for n, response in enumerate(responses, 1):
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                conn.sendall(response)
                if b"chunked" not in response and n < len(responses):
                    conn.close()
                    conn, _ = listener.accept()
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.system
def test_the_get_reads_chunked_and_close_delimited_bodies() -> None:
    from wattlab.acquisition.acquirers.scrape.http_get import KeptAliveGet

    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"6\r\nup 1\nx\r\n3;ext=1\r\n 2\n\r\n0\r\n\r\n")
    closing = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nup 3\n"
    port, thread = raw_server([chunked, chunked, closing])
    get = KeptAliveGet("http", "127.0.0.1", port, "/metrics", 2.0)
    assert get.get() == (200, "OK", b"up 1\nx 2\n")
    assert get.get() == (200, "OK", b"up 1\nx 2\n")  # the same connection, kept alive
    assert get.get() == (200, "OK", b"up 3\n")
    get.close()
    thread.join()


@pytest.mark.system
def test_the_get_reconnects_to_servers_that_close_after_each_answer_or_when_idle() -> None:
    """Found on the lent GPU: against Python's http.server (HTTP/1.0, closes after each
    answer) every other scrape failed ("closed the connection mid-response", 874 gap rows
    in 175 s): the connection was kept because no "Connection: close" came. A server that
    closes an idle kept-alive connection (a keep-alive timeout) cost one failed scrape too."""
    import http.server

    from wattlab.acquisition.acquirers.scrape.http_get import KeptAliveGet

    class OnePointZero(http.server.BaseHTTPRequestHandler):  # protocol_version "HTTP/1.0"
        def do_GET(self) -> None:
            body = b"up 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnePointZero)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        get = KeptAliveGet("http", "127.0.0.1", server.server_address[1], "/metrics", 2.0)
        assert [get.get() for _ in range(4)] == [(200, "OK", b"up 1\n")] * 4
        get.close()
    finally:
        server.shutdown()
        server.server_close()
    # keep-alive, then the server closes the idle connection before the next request
    kept = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nup 2\n"
    port, served = raw_server([kept, kept])  # closes after the first: "idle timeout"
    get = KeptAliveGet("http", "127.0.0.1", port, "/metrics", 2.0)
    assert get.get() == (200, "OK", b"up 2\n")
    assert get.get() == (200, "OK", b"up 2\n")
    get.close()
    served.join()


@pytest.mark.system
def test_a_cut_connection_is_no_traceback_but_another_error_still_is(capsys) -> None:
    """The loaded fresh-clone run printed a socketserver traceback when the outage test's
    endpoint stopped mid-answer: a cut connection is the endpoint's own doing, not news."""
    with MetricsEndpoint(lambda: "x 1\n") as endpoint:
        server = endpoint._server
        assert server is not None
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except OSError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real defect")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real defect" in capsys.readouterr().err
