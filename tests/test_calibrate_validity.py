"""`calibrate` carries the validity verdict: every figure it reports, valid or not, and why.

Each file is a 40 s synthetic recording written by the real RunFileWriter: a 1 kHz
reference meter, a GPU's held 100 ms average polled at 50 Hz (``gpu0.power``, the target)
and its 50 Hz samples, with three marked phases. One part is broken per test to make one
check fail (docs/validity.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import wattlab
from wattlab.analysis.calibration import calibrate, store_in_run
from wattlab.cli import main
from wattlab.runfile import CalibrationRecord, read_calibrations, schema
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

pytestmark = pytest.mark.fast

MS = 1_000_000
DURATION_S = 40.0
PHASES_S = (("low", 5.0, 15.0), ("high", 15.0, 25.0), ("mixed", 25.0, 35.0))
REF = "meter:power_w"
TARGET = "gpu0.power:average_power_w"


def _stream(w, sid, kind, channel, t_s, values, **config):
    w.add_source(SourceDescriptor(sid, kind, "GPU" if kind == "nvml" else "meter",
                                  (Channel(channel, "W"),), config=config))
    t_ns = np.round(np.asarray(t_s) * 1e9).astype(np.int64)
    w.append(sid, t_ns, t_ns, np.asarray(values, float).reshape(-1, 1),
             np.zeros(t_ns.size, np.uint8))


def _run(tmp_path: Path, *, keep_ref=None, samples_uuid="GPU-a",
         phases=PHASES_S) -> Path:
    """The good file; ``keep_ref`` (a mask on the reference's times) cuts the reference."""
    rng = np.random.default_rng(3)
    t_ref = np.arange(0, int(DURATION_S * 1000)) * 1e-3
    power = np.repeat(rng.choice([90.0, 300.0, 600.0], size=t_ref.size // 250 + 1), 250)
    power = power[:t_ref.size] + rng.normal(0, 2, t_ref.size)
    cum = np.concatenate(([0.0], np.cumsum(power) * 1e-3))
    edges = np.arange(t_ref.size + 1) * 1e-3
    polls = np.arange(0.013, DURATION_S - 0.05, 0.02)
    updates = np.floor(polls / 0.1) * 0.1  # the 1 s average, updated every 100 ms
    average = 1.05 * (np.interp(updates, edges, cum)
                      - np.interp(updates - 1.0, edges, cum)) + 4.0
    path = tmp_path / "cal.h5"
    w = RunFileWriter(str(path), {}, 0)
    keep = np.ones(t_ref.size, bool) if keep_ref is None else keep_ref(t_ref)
    _stream(w, "meter", "meter", "power_w", t_ref[keep], power[keep])
    _stream(w, "gpu0.power", "nvml", "average_power_w", polls, average, uuid="GPU-a")
    samples_t = np.arange(0.01, DURATION_S - 0.05, 0.02)
    _stream(w, "gpu0.samples", "nvml", "power_w", samples_t, np.interp(samples_t, t_ref, power),
            uuid=samples_uuid)
    w.add_markers([m for name, a, b in phases for m in (
        Marker(round(a * 1e3) * MS, name, "begin"), Marker(round(b * 1e3) * MS, name, "end"))])
    w.close()
    return path


def _record(path: Path) -> CalibrationRecord:
    with wattlab.open(str(path)) as run:
        return calibrate(run, REF, TARGET)


def _invalid(record: CalibrationRecord) -> dict[str, list[str]]:
    """Per invalid figure, its failed checks."""
    assert record.validity is not None
    return {f.figure: sorted(n for n, c in f.checks.items() if not c["ok"])
            for f in record.validity.figures if not f.valid}


def test_a_good_calibration_passes_every_check_on_every_figure(tmp_path):
    record = _record(_run(tmp_path))
    validity = record.validity
    assert validity is not None and validity.valid and validity.invalid_figures == 0
    names = [f.figure for f in validity.figures]
    assert names == ["params", "overall", "phase:low", "phase:high", "phase:mixed",
                     "mean_abs_error"]
    for figure in validity.figures:
        assert list(figure.checks) == ["coverage", "time", "identity", "counter_vs_integral",
                                       "no_silent_zero", "window"]
    params = validity.figures[0].checks["identity"]
    assert params["applies"] and "gpu0.power:average_power_w: one device: GPU-a" in \
        params["reason"]


def test_a_cut_reference_inside_a_phase_fails_coverage_there_and_in_the_fit(tmp_path):
    record = _record(_run(tmp_path, keep_ref=lambda t: (t < 20.0) | (t > 20.05)))
    bad = _invalid(record)
    assert bad == {"params": ["coverage"], "overall": ["coverage"],
                   "phase:high": ["coverage"], "mean_abs_error": ["coverage"]}
    high = next(f for f in record.validity.figures if f.figure == "phase:high")
    assert "meter:power_w: the window has 1 hole(s) longer than 3 spacings" in \
        high.checks["coverage"]["reason"]
    summary = record.validity.figures[-1]
    assert summary.invalid_parts == ["phase:high"]


def test_a_phase_past_the_end_is_listed_with_why_it_has_no_figure(tmp_path, capsys):
    phases = (*PHASES_S, ("late", 35.0, 45.0))
    path = _run(tmp_path, phases=phases)
    record = _record(path)
    assert [p.name for p in record.energy.phases] == ["low", "high", "mixed"]  # no error
    assert record.validity.valid and _invalid(record) == {}  # no figure is not a bad figure
    (late,) = record.validity.left_out
    assert (late.figure, late.valid) == ("phase:late", False)
    assert "ends 5.001 s after the stream's last row (39.999 s)" in \
        late.checks["coverage"]["reason"]
    assert main(["calibrate", "--no-store", "--strict", "--reference", REF, "--target", TARGET,
                 str(path)]) == 0
    assert "  no figure       phase:late: coverage: meter:power_w: the window ends 5.001 s" in \
        capsys.readouterr().out


def test_a_swapped_gpu_fails_identity_on_every_figure(tmp_path):
    record = _record(_run(tmp_path, samples_uuid="GPU-b"))
    bad = _invalid(record)
    assert set(bad) == {"params", "overall", "phase:low", "phase:high", "phase:mixed",
                        "mean_abs_error"}
    assert all(checks == ["identity"] for checks in bad.values())
    reason = record.validity.figures[0].checks["identity"]["reason"]
    assert reason.startswith("gpu0.power:average_power_w: the streams of gpu0 name 2 devices")


def test_time_going_backwards_is_refused_with_one_line_naming_the_stream(tmp_path, capsys):
    path = _run(tmp_path)
    with h5py.File(path, "r+") as f:
        time = f["sources/meter/time"]
        rows = time[20000:20003]
        time[20000:20003] = rows[::-1]
    status = main(["calibrate", "--no-store", "--reference", REF, "--target", TARGET,
                   str(path)])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert f"{path}: stream meter: time goes backwards, from 20.002" in err


@pytest.mark.parametrize(("strict", "status"), [(False, 0), (True, 1)])
def test_strict_exits_1_on_an_invalid_figure_and_the_text_says_why(tmp_path, capsys, strict,
                                                                  status):
    path = _run(tmp_path, keep_ref=lambda t: (t < 20.0) | (t > 20.05))
    argv = ["calibrate", "--no-store", "--reference", REF, "--target", TARGET, str(path)]
    assert main(argv + (["--strict"] if strict else [])) == status
    out = capsys.readouterr().out
    assert "INVALID         4 of 6 figures fail a validity check" in out
    assert "    phase:high: coverage: meter:power_w: the window has 1 hole(s)" in out
    assert main([*argv, "--json"] + (["--strict"] if strict else [])) == status
    doc = json.loads(capsys.readouterr().out)
    assert not doc["validity"]["valid"] and doc["validity"]["invalid_figures"] == 4


def test_strict_exits_0_on_a_valid_calibration(tmp_path, capsys):
    path = _run(tmp_path)
    assert main(["calibrate", "--no-store", "--strict", "--reference", REF, "--target", TARGET,
                 str(path)]) == 0
    assert "valid           all 6 figures" in capsys.readouterr().out


def test_the_stored_record_carries_the_verdict_and_an_older_one_still_loads(tmp_path):
    path = _run(tmp_path, samples_uuid="GPU-b")
    record = _record(path)
    where = store_in_run(str(path), record)
    with h5py.File(path, "r") as f:
        assert not f[where].attrs[schema.ALL_VALID]
    (stored,) = read_calibrations(str(path))
    assert stored.validity == record.validity
    older = record.to_json()
    del older["validity"]  # a record written before issue 37
    assert CalibrationRecord.from_json(older).validity is None
