"""`wattlab export`: the obvious query gives one energy per stream (issue 38, item 5).

Summing every channel of a stream counts a PowerSensor3's pairs and their total (and an
NVML stream's two readings) together: twice the truth. The ``stream_total`` column marks
the one channel whose energy is the stream's, so docs/fleet.md's query is right as written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.data_files import data_file
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.analysis.report import TableWriter, tidy_rows
from wattlab.runfile.reader import Run

DEMO = data_file("demo/demo24.h5")
# the query docs/fleet.md shows, with the table's name put in
FLEET_QUERY = ("SELECT source, sum(energy_j) AS energy_j FROM '{table}' "
               "WHERE phase = 'run' AND stream_total GROUP BY ALL")


def run_energy(source: str, channel: str) -> float:
    """The truth: `wattlab energy`'s whole-run figure of one stream's channel."""
    with Run(str(DEMO)) as run:
        rows = energy_report(run, by_marker=False)["rows"]
    return next(r["energy_j"] for r in rows
                if (r["source"], r["channel"], r["phase"]) == (source, channel, "run"))


@pytest.mark.system
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_the_fleet_query_gives_each_stream_its_own_total(tmp_path: Path, fmt: str) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="pyarrow is not installed (the parquet extra)")
    table = tmp_path / f"runs.{fmt}"
    writer = TableWriter(str(table), fmt)
    writer.write(tidy_rows(str(DEMO)))
    writer.close()
    got = dict(duckdb.sql(FLEET_QUERY.format(table=table)).fetchall())
    assert got["ps3"] == pytest.approx(run_energy("ps3", "power_total_w"), rel=1e-9)
    assert got["gpu0.power"] == pytest.approx(run_energy("gpu0.power", "instant_power_w"),
                                              rel=1e-9)
    assert got["gpu0.energy"] == pytest.approx(run_energy("gpu0.energy", "energy_j"),
                                               rel=1e-9)
    assert set(got) == {"gpu0.energy", "gpu0.power", "gpu0.samples", "ps3", "wall"}


@pytest.mark.system
def test_every_stream_has_exactly_one_total_channel_per_phase() -> None:
    rows = tidy_rows(str(DEMO))
    keys = {(r["source"], r["phase"]) for r in rows}
    totals = [(r["source"], r["phase"]) for r in rows if r["stream_total"]]
    assert sorted(totals) == sorted(keys)
    ps3 = {r["channel"] for r in rows if r["source"] == "ps3" and not r["stream_total"]}
    assert ps3 == {f"power{p}_w" for p in range(4)}


@pytest.mark.fast
def test_the_remote_host_column_is_the_run_files_attribute(tmp_path: Path) -> None:
    """The column is the stream's ``remote_host`` attribute (the host that sent it), as
    `wattlab info` reads it, never a guess from a descriptor key a run file need not hold."""
    from wattlab.runfile.writer import RunFileWriter
    from wattlab.samples import Channel, SourceDescriptor

    path = tmp_path / "two_hosts.h5"
    w = RunFileWriter(str(path), {}, 0)
    for sid, host in (("local", ""), ("far", "nodeB")):
        w.add_source(SourceDescriptor(sid, "meter", "meter", (Channel("power_w", "W"),)),
                     remote_host=host)
        t_ns = np.arange(0, 2_000_000_000, 10_000_000, dtype=np.int64)
        w.append(sid, t_ns, t_ns, np.full((t_ns.size, 1), 50.0), np.zeros(t_ns.size, np.uint8),
                 t_sender_ns=t_ns if host else None)
    w.close()
    hosts = {r["source"]: r["remote_host"] for r in tidy_rows(str(path))}
    assert hosts == {"local": "", "far": "nodeB"}
