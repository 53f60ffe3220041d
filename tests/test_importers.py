"""Imports: other tools' logs become run files; malformed lines are named by number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import wattlab
import wattlab.analysis.energy.source_energy
from tests.data_files import H100_CAPTURE as H100
from tests.data_files import PMT_LOG as PMT
from wattlab.cli import main
from wattlab.errors import RunFileError, UsageError
from wattlab.importers.power_logs import import_files

pytestmark = pytest.mark.fast


def test_nvml_npz_capture_imports_every_view_and_the_load_markers(tmp_path):
    out = tmp_path / "h100.h5"
    ids = import_files("nvml-npz", [str(H100)], str(out))
    assert ids == [f"h100_nvml_seed11.{k}" for k in
                   ("samples", "instant", "average", "energy", "sm_clock")]
    with wattlab.open(str(out)) as run:
        samples = run.source("h100_nvml_seed11.samples")
        rate = (len(samples) - 1) / np.ptp(samples.time_s)
        assert 45 < rate < 55
        assert samples.descriptor["time_raw"] == "device_unix_us"
        assert samples.descriptor["config"]["driver_version"] == "580.159.04"
        avg = run.source("h100_nvml_seed11.average")
        assert 300 < float(np.mean(avg.channel("average_power_w"))) < 700
        markers = run.markers
        assert len(markers) == 2 * 130 and {m.name for m in markers} == {"idle", "half", "full"}
        assert markers[0].time_ns == 0  # the session starts at the first load edge
    with pytest.raises(UsageError, match="already exists"):
        import_files("nvml-npz", [str(H100)], str(out))


def test_pmt_log_with_markers(tmp_path):
    log = tmp_path / "pmt.log"
    log.write_text("timestamp gpu_instant gpu_average\n"
                   "100.0 10.0 11.0\n100.5 20.0 12.0\nM 0.7 \"start\"\n101.0 30.0 13.0\n"
                   "M 1.2 \"end\"\n101.5 40.0 14.0\nM 1.4 \"note here\"\n")
    out = tmp_path / "pmt.h5"
    assert import_files("pmt", [str(log)], str(out), names=["ad4000"]) == ["ad4000"]
    with wattlab.open(str(out)) as run:
        view = run.source("ad4000")
        assert view.channel_names == ["gpu_instant_w", "gpu_average_w"]
        assert view.units == ["W", "W"]
        np.testing.assert_allclose(view.time_s, [0, 0.5, 1.0, 1.5])
        marks = [(m.name, m.kind, round(m.time_ns / 1e6)) for m in run.markers]
        assert marks == [("marked", "begin", 700), ("marked", "end", 1200),
                         ("note here", "point", 1400)]


def test_real_pmt_log(tmp_path):
    out = tmp_path / "pmt.h5"
    import_files("pmt", [str(PMT)], str(out))
    with wattlab.open(str(out)) as run:
        assert len(run.source("pmt-nvml")) > 500
        assert sum(m.kind == "begin" for m in run.markers) == 4


def test_malformed_pmt_line_is_named(tmp_path):
    log = tmp_path / "bad.log"
    log.write_text("timestamp a b\n1.0 2.0 3.0\n1.1 2.0\n")
    with pytest.raises(RunFileError, match=r"bad.log:3: 2 fields"):
        import_files("pmt", [str(log)], str(tmp_path / "x.h5"))


def test_csv_units_from_suffix_bracket_and_option(tmp_path):
    csv = tmp_path / "meter.csv"
    csv.write_text("t_ms,gpu_w,board [mW],volts\n0,100,5000,12\n10,110,5500,12.1\n"
                   "20,120,,12.2\n")
    out = tmp_path / "csv.h5"
    assert main(["import", "csv", str(csv), "-o", str(out), "--time-unit", "ms",
                 "--unit", "volts=V", "--source", "bench"]) == 0
    with wattlab.open(str(out)) as run:
        view = run.source("bench")
        assert view.channel_names == ["gpu_w", "board_w", "volts"]
        assert view.units == ["W", "W", "V"]
        np.testing.assert_allclose(view.channel("board_w")[:2], [5.0, 5.5])
        assert np.isnan(view.channel("board_w")[2])
        np.testing.assert_allclose(view.time_s, [0, 0.01, 0.02])


def test_csv_errors_name_the_column_or_line(tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("t,power\n0,1\n")
    with pytest.raises(RunFileError, match="column 'power' has no unit"):
        import_files("csv", [str(csv)], str(tmp_path / "a.h5"))
    csv.write_text("t,power_w\n0,1\n1,abc\n")
    with pytest.raises(RunFileError, match=r"m.csv:3: not a number"):
        import_files("csv", [str(csv)], str(tmp_path / "b.h5"))
    assert main(["import", "csv", str(csv), "-o", str(tmp_path / "c.h5")]) == 2


def test_nvidia_smi_log_splits_gpus(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text("timestamp, index, power.draw [W], clocks.sm [MHz], name\n"
                   "2024/05/01 12:00:00.000, 0, 250.50 W, 1980 MHz, H100\n"
                   "2024/05/01 12:00:00.000, 1, [N/A], 1500 MHz, H100\n"
                   "2024/05/01 12:00:00.100, 0, 260.00 W, 1965 MHz, H100\n"
                   "2024/05/01 12:00:00.100, 1, 100.00 W, 1500 MHz, H100\n")
    out = tmp_path / "smi.h5"
    assert import_files("nvidia-smi", [str(log)], str(out)) == ["smi.gpu0", "smi.gpu1"]
    with wattlab.open(str(out)) as run:
        g0 = run.source("smi.gpu0")
        assert g0.channel_names == ["power_draw_w", "clocks_sm_hz"]
        np.testing.assert_allclose(g0.channel("power_draw_w"), [250.5, 260.0])
        np.testing.assert_allclose(g0.channel("clocks_sm_hz"), [1.98e9, 1.965e9])
        np.testing.assert_allclose(g0.time_s, [0, 0.1])
        assert np.isnan(run.source("smi.gpu1").channel("power_draw_w")[0])
    log.write_text("timestamp, power.draw [W]\n2024/05/01 12:00:00.000, 250 W\nbad, 1 W\n")
    with pytest.raises(RunFileError, match=r"smi.csv:3:"):
        import_files("nvidia-smi", [str(log)], str(tmp_path / "y.h5"))


def test_several_files_become_several_sources(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("t,p_w\n0,1\n1,1\n")
    b.write_text("t,p_w\n0.5,2\n1.5,2\n")
    out = tmp_path / "ab.h5"
    assert import_files("csv", [str(a), str(b)], str(out)) == ["a", "b"]
    with wattlab.open(str(out)) as run:
        np.testing.assert_allclose(run.source("b").time_s, [0.5, 1.5])
    with pytest.raises(UsageError, match="unknown import format"):
        import_files("xls", [str(a)], str(tmp_path / "z.h5"))


def write_psrun_dump(path: Path, frames: int = 2000) -> None:
    """A dump as upstream ``PowerSensor::dump`` writes it: pairs 0 and 2 active, 20 kHz.

    Power steps from ~60 W to ~300 W at frame 1000; a one-character marker precedes frame
    500 and an interval marker ``M t0 t1 tag "name"`` covers frames 1000..1999.
    """
    lines = ["marker time dt_micro device_timestamp current0 voltage0 power0 "
             "current2 voltage2 power2 power_total"]
    for k in range(frames):
        t = 0.000213 + k * 50e-6
        i0, v0 = (4.0, 12.1) if k < 1000 else (8.5, 12.0)
        i2, v2 = (1.0, 12.05) if k < 1000 else (16.5, 11.9)
        if k == 500:
            lines.append("M A")
        lines.append(f"S {t:.6f} {50 if k else 213} {(213 + 50 * k) % 1024} {i0:g} {v0:g} "
                     f"{i0 * v0:g} {i2:g} {v2:g} {i2 * v2:g} {i0 * v0 + i2 * v2:g}")
    t0, t1 = 0.000213 + 1000 * 50e-6, 0.000213 + (frames - 1) * 50e-6
    lines.append(f'M {t0:.6f} {t1:.6f} 7 "gemm kernel"')
    path.write_text("\n".join(lines) + "\n")


def test_psrun_dump_imports_pairs_markers_and_raw_device_time(tmp_path):
    dump = tmp_path / "ps3dump.txt"
    write_psrun_dump(dump)
    out = tmp_path / "ps.h5"
    assert main(["import", "psrun", str(dump), "-o", str(out), "--source", "ps3"]) == 0
    with wattlab.open(str(out)) as run:
        view = run.source("ps3")
        assert view.channel_names == ["current0_a", "voltage0_v", "power0_w", "current2_a",
                                      "voltage2_v", "power2_w", "power_total_w"]
        assert view.units == ["A", "V", "W", "A", "V", "W", "W"]
        assert view.kind == "powersensor3" and len(view) == 2000
        np.testing.assert_allclose(np.diff(view.time_s), 50e-6, atol=1e-9)
        assert int(view.time_raw[1]) == 263 and int(np.max(view.time_raw)) < 1024
        total = view.channel("power_total_w")
        np.testing.assert_allclose(total[[0, -1]], [4 * 12.1 + 12.05, 8.5 * 12 + 16.5 * 11.9])
        assert int(view.flags[500]) & 16 and int(np.sum(view.flags != 0)) == 1
        marks = [(m.name, m.kind, round(m.time_ns / 1e3)) for m in run.markers]
        assert marks[0] == ("A", "point", 500 * 50)  # the frame the device marked
        assert marks[1:] == [("gemm kernel", "begin", 1000 * 50),
                             ("gemm kernel", "end", 1999 * 50)]
        report = wattlab.analysis.energy.source_energy.energy_report(run, by_marker=True)
    gemm = next(r for r in report["rows"] if r["phase"] == "gemm kernel"
                and r["channel"] == "power_total_w")
    assert gemm["mean_power_w"] == pytest.approx(8.5 * 12 + 16.5 * 11.9, rel=1e-6)


@pytest.mark.parametrize(("text", "match"), [
    ("time power\nS 0 0 0 1\n", r"d.txt:1: expected a PowerSensor3 dump header"),
    ("marker time dt_micro device_timestamp current0 voltage0 power_total\nS 0 0 0 1 2 3\n",
     r"d.txt:1: 2 pair columns"),
    ("marker time dt_micro device_timestamp current0 voltage1 power0 power_total\n",
     r"d.txt:1: columns \['current0', 'voltage1', 'power0'\]"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n"
     "S 0.1 50 100 1 12 12 12\nS 0.2 50 150 1 12\n", r"d.txt:3: 6 fields, the header has 8"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n"
     "\nS 0.1 50 100 1 12 12 x\n", r"d.txt:3: not a number"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n"
     "S 0.2 50 100 1 12 12 12\nS 0.1 50 150 1 12 12 12\n", r"d.txt:3: time 0.1 s goes back"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n"
     "S 0.1 50 100 1 12 12 12\nM 0.3 0.2 1 \"x\"\n", r"d.txt:3: malformed marker"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n"
     "S 0.1 50 100 1 12 12 12\nX 1\n", r"d.txt:3: line starts with 'X'"),
    ("marker time dt_micro device_timestamp current0 voltage0 power0 power_total\n",
     r"no 'S' sample lines"),
])
def test_malformed_psrun_dump_is_named_by_line(tmp_path, text, match):
    dump = tmp_path / "d.txt"
    dump.write_text(text)
    with pytest.raises(RunFileError, match=match):
        import_files("psrun", [str(dump)], str(tmp_path / "d.h5"))
