"""Sweep tables: published-data loaders, the sweep HDF5 file, bad input."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.data_files import KT_A100, ZEUS_TRACE
from tests.data_files import PS3_TUNING as PS3
from tests.data_files import ZEUS_PROFILE as PROFILE
from wattlab.analysis.models.sweep_results import (
    SweepTable,
    load_table,
    load_zeus_trace,
    read_sweep,
    write_sweep,
)
from wattlab.errors import RunFileError, UsageError

pytestmark = pytest.mark.fast


def test_round_trip(tmp_path: Path) -> None:
    t = SweepTable("power_limit_w", ["a", "a", "b"], np.array([100.0, 100.0, 200.0]),
                   np.array([2.0, 2.1, 1.0]), np.array([200.0, 210.0, 150.0]),
                   energy_source="nvml_energy",
                   energies_j={"nvml_energy": np.array([200.0, 210.0, 150.0]),
                               "true": np.array([199.0, 211.0, 151.0])},
                   status=["ok", "ok", "failed"], features={"bs": np.array([1.0, 1.0, 2.0])},
                   default_x=200.0)
    path = str(tmp_path / "s.h5")
    write_sweep(path, t, {"complete": True})
    back = read_sweep(path)
    assert back.workload == t.workload and back.status == t.status
    assert list(back.repeat) == [0, 1, 0]
    np.testing.assert_allclose(back.energies_j["true"], [199.0, 211.0, 151.0])
    np.testing.assert_allclose(back.mean_power_w, [100.0, 100.0, 150.0])
    assert back.default_x == 200.0 and back.attrs["complete"]
    assert len(back.usable()) == 2
    assert load_table(path).energy_source == "nvml_energy"
    write_sweep(path, t.select(np.array([True, False, False])))  # atomic replace
    assert len(read_sweep(path)) == 1
    assert list(tmp_path.iterdir()) == [tmp_path / "s.h5"]  # no temp file left


def test_sweep_file_gets_the_users_umask(tmp_path: Path) -> None:
    t = SweepTable("power_limit_w", ["a"], np.array([100.0]), np.array([2.0]),
                   np.array([200.0]))
    previous = os.umask(0o027)
    try:
        write_sweep(str(tmp_path / "s.h5"), t)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "s.h5").stat().st_mode) == 0o640


def test_missing_column_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "summary_power_x.csv"
    bad.write_text("dataset,network,batch_size,optimizer,power_limit,time_per_epoch\n"
                   "c,n,1,adam,100,2.0\n")
    with pytest.raises(RunFileError, match=r"missing column.*average_power"):
        load_zeus_trace(str(bad))
    with pytest.raises(RunFileError, match="unknown sweep table format"):
        (tmp_path / "x.csv").write_text("a,b\n1,2\n")
        load_table(str(tmp_path / "x.csv"))
    (tmp_path / "w.csv").write_text("window_name,elapsed_time,gpu0_energy\nfoo,1,2\n")
    with pytest.raises(RunFileError, match=r"row 2.*does not end with a power limit"):
        load_table(str(tmp_path / "w.csv"))
    (tmp_path / "n.csv").write_text(bad.read_text().replace("epoch\n", "epoch,average_power\n")
                                    .replace("2.0\n", "2.0,abc\n"))
    with pytest.raises(RunFileError, match="row 2: column average_power"):
        load_table(str(tmp_path / "n.csv"))
    with pytest.raises(RunFileError, match="no such file"):
        load_table(str(tmp_path / "nope.h5"))


def test_with_x_needs_the_column() -> None:
    t = SweepTable("power_limit_w", ["a"], np.array([1.0]), np.array([1.0]), np.array([1.0]))
    with pytest.raises(UsageError, match="no sm_clock_mhz values"):
        t.with_x("sm_clock_mhz")


def test_zeus_profile_a40_resnet50_energies() -> None:
    t = load_table(str(PROFILE / "A40+resnet50+gpu0.csv"))
    e = dict(zip(t.x.tolist(), t.energy_j.tolist(), strict=True))
    assert round(e[175.0]) == 4867 and round(e[300.0]) == 6225 and round(e[100.0]) == 8034
    assert t.x[np.argmin(t.energy_j)] == 175.0
    multi = load_table(str(PROFILE / "A40+resnet50+gpu0,1,2,3.csv"))
    assert set(multi.energies_j) == {"gpu0", "gpu1", "gpu2", "gpu3"}
    np.testing.assert_allclose(multi.energy_j, sum(multi.energies_j.values()))
    folder = load_table(str(PROFILE))
    assert len(folder.workloads()) == 12 and "gpu_model" in folder.features


def test_zeus_trace_energy_is_time_times_power() -> None:
    t = load_table(str(ZEUS_TRACE / "summary_power_a40.csv"))
    assert len(t) == 453 and len(t.workloads()) == 53
    row = next(i for i, w in enumerate(t.workload)
               if w == "cifar100/shufflenetv2/bs1024/adadelta" and t.x[i] == 100.0)
    assert t.energy_j[row] == pytest.approx(27.13 * 106.88881213499654)


def test_kernel_tuner_caches() -> None:
    a100 = load_table(str(KT_A100))
    assert a100.x_name == "sm_clock_mhz" and a100.energy_source == "time*nvml_power"
    assert a100.x[np.argmin(a100.energy_j)] == 1005.0
    assert a100.x[np.argmin(a100.energy_j * a100.runtime_s)] == 1140.0
    ps3 = load_table(str(PS3))
    assert ps3.energy_source == "ps_energy" and len(ps3.workloads()) == 469
    assert sorted(set(ps3.x.tolist())) == [1485, 1515, 1560, 1590, 1635, 1665, 1710, 1740,
                                            1785, 1815]
