"""RAPL through powercap: the emulated tree, exact unwrapping, cadence, errors, the CLI."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

import wattlab
from wattlab.acquisition.acquirers.rapl_acquirer import RaplAcquirer
from wattlab.cli import main
from wattlab.drivers.powercap import discover
from wattlab.errors import MeterError
from wattlab.hardware.emulators.powercap_emulator import (
    INTEL_SERVER_UNIT_UJ,
    PowercapEmulator,
    Zone,
    intel_server,
)
from wattlab.samples import Gap


class FakeTime:
    """One clock for the emulator and the source; sleeping advances it and the files."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000
        self.emulator: PowercapEmulator | None = None

    def __call__(self) -> int:
        return self.now_ns

    def sleep_until(self, due_ns: int, step_s: float) -> bool:
        self.now_ns = max(self.now_ns, due_ns)
        assert self.emulator is not None
        self.emulator.update()
        return True


def stepped(tmp_path, zones):
    clock = FakeTime()
    emulator = PowercapEmulator(tmp_path, zones, clock_ns=clock)
    clock.emulator = emulator
    return clock, emulator, RaplAcquirer(str(tmp_path), clock_ns=clock, sleep=clock.sleep_until)


def rows(readings, stream):
    return np.concatenate([c.values for c in readings
                           if not isinstance(c, Gap) and c.source_id == stream])


@pytest.mark.fast
def test_energy_is_exact_to_the_microjoule_across_wraps(tmp_path):
    # 5 J range at 37.3 W: a wrap every 134 ms; the counter starts 0.2 J before one
    zones = [Zone("intel-rapl:0", "package-0", [(0.3, 37.3), (0.2, 90.1)],
                  max_energy_range_uj=5_000_000, start_uj=4_800_000, max_power_w=100.0,
                  children=[Zone("intel-rapl:0:0", "dram", [(1.0, 11.7)],
                                 max_energy_range_uj=3_000_000, max_power_w=40.0)])]
    _, emulator, rapl = stepped(tmp_path, zones)
    descriptors = rapl.open()
    assert [d.source_id for d in descriptors] == ["rapl.package-0"]
    assert descriptors[0].channel_names == ["package_energy_j", "dram_energy_j"]
    assert rapl.interval_s == pytest.approx(5e6 / 100e6 / 4)  # 12.5 ms: a quarter wrap
    readings = []
    for _ in range(400):  # 5 s: ~45 package wraps, ~20 DRAM wraps
        readings += rapl.poll()
    readings += rapl.flush()
    values = rows(readings, "rapl.package-0")
    first, last = emulator.log[0][1], emulator.log[-1][1]
    for column, zone in enumerate(("intel-rapl:0", "intel-rapl:0/intel-rapl:0:0")):
        assert round(values[-1, column] * 1e6) == last[zone] - first[zone]
    wraps = [u.wraps for _, u in rapl._packages["rapl.package-0"]]
    assert wraps[0] > 40 and wraps[1] > 15
    assert not [r for r in readings if isinstance(r, Gap)]


@pytest.mark.fast
def test_a_coarse_counter_unit_costs_less_than_one_unit_per_wrap(tmp_path):
    unit = INTEL_SERVER_UNIT_UJ
    zones = [Zone("intel-rapl:0", "package-0", [(1.0, 55.0)], energy_unit_uj=unit,
                  max_energy_range_uj=math.floor(round(4e6 / unit) * unit), max_power_w=100.0)]
    _, emulator, rapl = stepped(tmp_path, zones)
    rapl.open()
    readings = []
    for _ in range(200):
        readings += rapl.poll()
    zone = emulator.zones[0][1]
    wraps = rapl._packages["rapl.package-0"][0][1].wraps
    true_uj = (emulator.log[-1][1]["intel-rapl:0"] - emulator.log[0][1]["intel-rapl:0"]) * unit
    got_uj = rows(readings, "rapl.package-0")[-1, 0] * 1e6
    assert wraps >= 10
    assert abs(got_uj - true_uj) <= wraps * unit + 2 * unit  # truncation at both ends
    assert zone.states == round(4e6 / unit) + 1


@pytest.mark.fast
def test_a_late_read_is_reported_as_a_gap(tmp_path):
    zones = [Zone("intel-rapl:0", "package-0", [(1.0, 50.0)], max_energy_range_uj=2_000_000,
                  max_power_w=100.0)]
    clock, emulator, rapl = stepped(tmp_path, zones)
    rapl.open()
    clock.now_ns += 500_000_000  # a stalled host: 0.5 s, more than the 20 ms wrap time
    emulator.update()
    gaps = [r for r in rapl.poll() if isinstance(r, Gap)]
    assert len(gaps) == 1 and "whole wraps may be missing" in gaps[0].reason


@pytest.mark.fast
def test_zones_say_what_they_measure_and_what_is_a_part(tmp_path):
    zones = [Zone("intel-rapl:0", "package-0", [(1.0, 20.0)],
                  children=[Zone("intel-rapl:0:0", "core", [(1.0, 10.0)]),
                            Zone("intel-rapl:0:1", "uncore", [(1.0, 1.0)])]),
             Zone("intel-rapl:1", "psys", [(1.0, 40.0)])]
    PowercapEmulator(tmp_path, zones)
    (tmp_path / "intel-rapl-mmio:0").mkdir()  # a second view of package 0: never read
    found = discover(tmp_path)
    assert [z.path.name for z in found] == ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1",
                                            "intel-rapl:1"]
    descriptors = RaplAcquirer(str(tmp_path)).open()
    package, psys = descriptors
    assert package.config["zones"]["core_energy_j"]["part_of"] == "package_energy_j"
    assert package.config["zones"]["package_energy_j"]["part_of"] is None
    assert package.config["measures"] == "cpu" and psys.config["measures"] == "psys"
    assert "not its DRAM" in package.channels[0].meaning


@pytest.mark.fast
def test_no_zones_and_unreadable_counters_say_the_fix(tmp_path, monkeypatch):
    with pytest.raises(MeterError, match="virtual machine"):
        discover(tmp_path)
    with pytest.raises(MeterError, match="no such folder"):
        discover(tmp_path / "absent")
    PowercapEmulator(tmp_path, [Zone("intel-rapl:0", "package-0", [(1.0, 5.0)],
                                     readable=False)])
    if os.geteuid() == 0:  # root reads a mode-000 file: refuse the read as the kernel would
        read_text = Path.read_text

        def refused(self, *args, **kwargs):
            if self.name == "energy_uj":
                raise PermissionError(13, "Permission denied", str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refused)
    with pytest.raises(MeterError, match=r"root only \(CVE-2020-8694\).*chmod a\+r"):
        discover(tmp_path)


@pytest.mark.system
def test_record_rapl_records_the_emulated_tree(tmp_path, capsys):
    tree = tmp_path / "powercap"
    emulator = PowercapEmulator(tree, intel_server(packages=2)).start()
    out = tmp_path / "run.h5"
    try:
        code = main(["record", "--nvml", "none", "--rapl", str(tree), "--duration", "1.5",
                     "-o", str(out)])
    finally:
        emulator.stop()
    assert code == 0
    # Each stored energy is a counter value the emulator wrote; the rate is checked on the
    # emulator's own write times, as its thread may lag the reads on a loaded machine.
    with wattlab.open(str(out)) as run:
        for i, power_w in ((0, 120.0), (1, 130.0)):
            view = run.source(f"rapl.package-{i}")
            assert view.channel_names == ["package_energy_j", "dram_energy_j"]
            energy = view.channel("package_energy_j")
            assert (view.time_ns[-1] - view.time_ns[0]) / 1e9 > 1.2
            first_uj = view.descriptor["config"]["zones"]["package_energy_j"]["first_energy_uj"]
            written_ns = {counted[f"intel-rapl:{i}"]: t for t, counted in emulator.log}
            units = first_uj + np.rint(energy * 1e6).astype(np.int64)
            assert set(units.tolist()) <= set(written_ns)
            written_s = (written_ns[int(units[-1])] - written_ns[int(units[0])]) / 1e9
            assert written_s > 1.0
            assert energy[-1] == pytest.approx(power_w * written_s, abs=2e-6)
    assert "rapl.package-1" in capsys.readouterr().out
