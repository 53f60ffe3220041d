"""The scraper reads its kept pages in batches (issue 40: a page read warm costs a fraction of
one read after a 100 ms sleep): the rows, gap rows and stderr lines must be those of
reading each page at once, only later (docs/scrape.md)."""

from __future__ import annotations

import pytest

from wattlab.acquisition.acquirers import Chunk, Reading
from wattlab.acquisition.acquirers.scrape import ScrapeAcquirer
from wattlab.acquisition.acquirers.scrape.scrape_acquirer import BATCH_S
from wattlab.samples import Gap

URL = "http://127.0.0.1:9/metrics"  # never connected: the GET is the script's
GET_NS = 2_000_000  # what each scripted GET takes of the scripted clock


def page(tokens: float, extra: str = "") -> bytes:
    return (f'vllm:generation_tokens_total{{model_name="m"}} {tokens}\n'
            f'vllm:num_requests_running{{model_name="m"}} {tokens % 3}\n{extra}').encode()


BAD = page(5.0, 'vllm:generation_tokens_total{model_name="n"} lots\n')
GONE = b'vllm:num_requests_running{model_name="m"} 1\n'
NEW = page(9.0, 'vllm:num_requests_running{model_name="other"} 4\n')
REFUSED = ConnectionRefusedError(111, "Connection refused")
DOWN = (503, "Service Unavailable", b"")
Answer = bytes | OSError | tuple[int, str, bytes]


class Script:
    """An endpoint and a clock for one scraper: each GET answers the next of ``answers``
    (a page, an exception to raise, or a (status, reason, body)) and takes ``GET_NS``; the
    sleep moves the clock toward the due time as the real one does, capped at a step, and
    wakes a little late, by an amount that varies."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.now = 5 * 10**9
        self.wakes = 0

    def clock(self) -> int:
        return self.now

    def sleep(self, due_ns: int, step_s: float) -> bool:
        wait_ns, step_ns = due_ns - self.now, round(step_s * 1e9)
        if wait_ns > 0:
            self.wakes += 1
            self.now += min(wait_ns, step_ns) + 31_000 * (self.wakes % 7)
            if wait_ns > step_ns:
                return False
        return True

    def get(self) -> tuple[int, str, bytes]:
        self.now += GET_NS
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer if isinstance(answer, tuple) else (200, "OK", answer)

    def scraper(self, **kwargs: float) -> ScrapeAcquirer:
        return ScrapeAcquirer(URL, "scrape", clock_ns=self.clock, sleep=self.sleep,
                              get=self.get, **kwargs)  # type: ignore[arg-type]


def run(answers: list[Answer], **kwargs: float) -> tuple[list[list[Reading]], list[Reading]]:
    """Open on the first answer, poll until all but the last are used, flush on the last:
    (what each poll returned, what the flush returned)."""
    script = Script(answers)
    acq = script.scraper(**kwargs)
    acq.open()
    polls = []
    while len(script.answers) > 1:
        polls.append(acq.poll())
    tail = acq.flush()
    acq.close()
    return polls, tail


def flat(readings: list[Reading]) -> list[tuple[object, ...]]:
    """Every row and gap row, in order: (t, values) or ("gap", first, last, reason)."""
    out: list[tuple[object, ...]] = []
    for r in readings:
        if isinstance(r, Chunk):
            assert r.values.shape == (len(r.t_host_ns), 2) and r.values.dtype == "float64"
            out += [(int(t), tuple(map(float, v))) for t, v in zip(r.t_host_ns, r.values,
                                                                    strict=True)]
        else:
            assert isinstance(r, Gap)
            out.append(("gap", r.t_first_ns, r.t_last_ns, r.reason))
    return out


def everything(polls: list[list[Reading]], tail: list[Reading]) -> list[Reading]:
    return [r for p in polls for r in p] + tail


# 10 Hz for ~4 s: a parse failure, a series that appears, a refused GET and an HTTP error
# back to back, a series gone, and an outage still open at the stop
SCENARIO: list[Answer] = ([page(0.0)] + [page(float(k)) for k in range(1, 6)] + [BAD]
                          + [page(float(k)) for k in range(7, 9)] + [NEW, NEW]
                          + [page(float(k)) for k in range(11, 14)] + [REFUSED, DOWN]
                          + [page(float(k)) for k in range(16, 20)] + [GONE]
                          + [page(float(k)) for k in range(21, 40)] + [BAD, BAD])


@pytest.mark.fast
def test_batched_rows_gaps_and_warnings_are_those_of_reading_each_page_at_once(capsys) -> None:
    polls_at_once, tail_at_once = run(SCENARIO, batch_s=0)
    err_at_once = capsys.readouterr().err
    polls, tail = run(SCENARIO)
    err = capsys.readouterr().err
    assert flat(everything(polls, tail)) == flat(everything(polls_at_once, tail_at_once))
    assert err == err_at_once  # the same lines, in the same order
    # what reading at once gives, as before batching: 4 outages, each one gap row
    rows = flat(everything(polls_at_once, tail_at_once))
    gaps = [r for r in rows if r[0] == "gap"]
    fragments = ["line 3: sample value 'lots' is not a number", "ConnectionRefusedError",
                 'series vllm:generation_tokens_total{model_name="m"} gone',
                 "line 3: sample value 'lots' is not a number"]
    assert len(gaps) == len(fragments)
    assert all(f in str(g[3]) for f, g in zip(fragments, gaps, strict=True)), gaps
    values = [r[1][0] for r in rows if r[0] != "gap"]  # type: ignore[index]
    assert values == [0.0, 1, 2, 3, 4, 5, 7, 8, 9, 9, 11, 12, 13, *range(16, 20),
                      *range(21, 40)]
    assert err.count("appeared after the recording began") == 1
    assert err.count("no rows until a scrape works again") == 4
    # batched: fewer, longer Chunks, and the polls between batches return nothing
    chunks = [r for r in everything(polls, tail) if isinstance(r, Chunk)]
    assert len(chunks) < len([r for r in everything(polls_at_once, tail_at_once)
                              if isinstance(r, Chunk)]) / 3
    assert sum(p == [] for p in polls) > len(polls) / 2


@pytest.mark.fast
def test_a_parse_failure_mid_batch_gives_the_gap_row_it_gave_before(capsys) -> None:
    answers = [page(0.0), page(1.0), page(2.0), BAD, BAD, page(5.0), page(6.0), page(7.0)]
    polls, tail = run(answers)
    assert [len(p) for p in polls] == [1, 0, 0, 0, 0, 0]  # only the row read at open
    readings = everything(polls, tail)
    (gap,) = [r for r in readings if isinstance(r, Gap)]
    times = [int(t) for r in readings if isinstance(r, Chunk) for t in r.t_host_ns]
    # from the last good scrape to the next good one, with the first failure's reason
    assert (gap.t_first_ns, gap.t_last_ns) == (times[2], times[3])
    assert gap.reason == (f"{URL} line 3: sample value 'lots' is not a number (no scrape "
                          "answered from here to the next row)")
    assert [type(r) for r in readings] == [Chunk, Chunk, Gap, Chunk]  # rows before, after
    err = capsys.readouterr().err
    # the outage began at the first bad scrape's try, 0.2 s before the next good one
    assert "no rows until" in err and "scraped again after 0.2 s; rows resume" in err
    at_once, at_once_tail = run(answers, batch_s=0)
    assert flat(readings) == flat(everything(at_once, at_once_tail))


@pytest.mark.fast
def test_flush_delivers_the_held_rows_and_the_last_scrape() -> None:
    polls, tail = run([page(float(k)) for k in range(6)])
    assert [flat(p) for p in polls] == [[(5_000_000_000 + GET_NS // 2, (0.0, 0.0))], [], [],
                                        []]
    (chunk,) = tail  # one Chunk: the four held rows and the flush's own scrape
    assert [float(v) for v in chunk.values[:, 0]] == [1.0, 2.0, 3.0, 4.0, 5.0]
    steps = [int(d) for d in chunk.t_host_ns[1:] - chunk.t_host_ns[:-1]]
    assert all(99_000_000 < d < 102_000_000 for d in steps[:-1]), steps  # 10 Hz
    assert steps[-1] == GET_NS  # the flush scrapes at once, not at the next due time


@pytest.mark.fast
def test_a_failed_get_hands_over_the_held_rows_and_starts_its_outage_at_once(capsys) -> None:
    script = Script([page(0.0), page(1.0), page(2.0), REFUSED, page(4.0), page(5.0)])
    acq = script.scraper()
    acq.open()
    assert len(acq.poll()) == 1 and acq.poll() == []  # the open row; 1.0 and 2.0 held
    assert capsys.readouterr().err == ""
    (held,) = acq.poll()  # the GET is refused: the held rows at once, and one line
    assert isinstance(held, Chunk) and list(held.values[:, 0]) == [1.0, 2.0]
    assert "ConnectionRefusedError" in capsys.readouterr().err
    gap, row = acq.poll()  # an outage's end is read at once too
    assert isinstance(gap, Gap) and gap.t_first_ns == held.t_host_ns[-1]
    assert isinstance(row, Chunk) and gap.t_last_ns == row.t_host_ns[0]
    assert "scraped again after 0.1 s" in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize(("hz", "most_rows"), [(10.0, 10), (20.0, 19), (1.0, 1), (2.0, 2)])
def test_a_row_waits_at_most_a_batch_before_it_leaves(hz: float, most_rows: int) -> None:
    """The crash-loss bound of the scrape stream: BATCH_S held, then the recorder's flush."""
    script = Script([page(float(k)) for k in range(round(6 * hz))])
    acq = script.scraper(hz=hz)
    acq.open()
    sizes = []
    while len(script.answers) > 1:
        for r in acq.poll():
            assert isinstance(r, Chunk)
            sizes.append(len(r.t_host_ns))
            assert script.now - int(r.t_host_ns[0]) <= BATCH_S * 1e9 + 2 * GET_NS
    assert max(sizes) == most_rows and sizes[1:-1] == [most_rows] * (len(sizes) - 2)


@pytest.mark.fast
def test_a_held_page_that_failed_begins_the_outage_before_a_failed_get(capsys) -> None:
    script = Script([page(0.0), page(1.0), BAD, REFUSED, page(4.0), page(5.0)])
    acq = script.scraper()
    acq.open()
    acq.poll()
    assert acq.poll() == []  # the bad page is held: no outage yet
    (held,) = acq.poll()  # the GET is refused: the held pages are read first
    assert list(held.values[:, 0]) == [1.0]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'lots' is not a number" in err, err
    gap, _ = acq.poll()
    assert isinstance(gap, Gap) and "'lots' is not a number" in gap.reason  # the first failure
    assert "scraped again after 0.2 s" in capsys.readouterr().err  # from the bad page's try
