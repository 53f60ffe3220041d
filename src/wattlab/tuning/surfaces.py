"""Energy/time surfaces over GPU settings, built from published measurements.

Why: an online tuner can only be judged against a known optimum. Each surface gives, for
every setting of one workload, the energy and time of one iteration as a published table
measured them, so the oracle (the best setting under the slowdown bound) is exact and a
simulated training run can follow the surface at whatever setting the tuner applies.

Sources (tests/data/public): Zeus A40/V100 power-limit traces (time per epoch × average
power), the Kernel Tuner caches of an RTX 4000 Ada (PowerSensor3 energy) and an A100
(synthetic tutorial kernel) over locked SM clocks, and the Ulisboa GTX Titan X board power
over (core, memory) clock pairs. The Titan X table has no times, so its time per iteration
is modelled from the kernel's own DRAM utilisation counter: the DRAM-bound share scales
with the memory clock, the rest with the core clock (the surface says so in its ``note``).
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from wattlab.analysis.models import SweepTable, load_kernel_tuner, load_zeus_trace
from wattlab.device_models import SettingResponse
from wattlab.errors import RunFileError

FloatArray = npt.NDArray[np.float64]
Setting = dict[str, float]


@dataclass(frozen=True)
class Surface:
    """Energy and time of one iteration at every setting on a grid of knobs.

    ``axes``: knob name (``sm_clock``, ``mem_clock``, ``power_limit``) → ascending values;
    ``energy_j`` / ``time_s`` have one dimension per axis; the default is the top value of
    every axis (a GPU runs unlocked clocks and its full power limit out of the box).
    """

    name: str
    axes: dict[str, tuple[float, ...]]
    energy_j: FloatArray
    time_s: FloatArray
    note: str = ""

    @property
    def default(self) -> tuple[int, ...]:
        return tuple(len(v) - 1 for v in self.axes.values())

    def setting(self, index: tuple[int, ...]) -> Setting:
        return {k: v[i] for (k, v), i in zip(self.axes.items(), index, strict=True)}

    def indices(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(len(v)) for v in self.axes.values())))

    def response(self) -> SettingResponse:
        """The surface as a simulated GPU follows it: ratios to the default per setting."""
        return SettingResponse.of_table(self.name, self.axes, self.energy_j, self.time_s)

    def truth(self, setting: Setting) -> tuple[float, float]:
        """(slowdown, energy saving) per iteration at a setting, against the default."""
        t_ratio, e_ratio = self.response().ratios(setting)
        return t_ratio - 1.0, 1.0 - e_ratio

    def oracle(self, objective: str, max_slowdown: float) -> tuple[int, ...]:
        """The setting with the lowest objective whose time is within the bound."""
        t_ref = self.time_s[self.default]
        best = self.default
        for idx in self.indices():
            if self.time_s[idx] <= t_ref * (1 + max_slowdown) + 1e-12 and (
                    objective_value(objective, self.energy_j[idx], self.time_s[idx])
                    < objective_value(objective, self.energy_j[best], self.time_s[best])):
                best = idx
        return best


def objective_value(objective: str, energy_j: float, time_s: float) -> float:
    """Energy (J) or energy-delay product (J·s) of one iteration."""
    return float(energy_j if objective == "energy" else energy_j * time_s)


def _one_axis(table: SweepTable, knob: str, prefix: str) -> list[Surface]:
    """One surface per workload of a one-knob table (rows averaged per setting)."""
    out = []
    names = np.array(table.workload, dtype=object)
    for w in table.workloads():
        rows = np.flatnonzero(names == w)
        xs = np.unique(table.x[rows])
        if xs.shape[0] < 3:
            continue
        t = np.array([table.runtime_s[rows][table.x[rows] == x].mean() for x in xs])
        e = np.array([table.energy_j[rows][table.x[rows] == x].mean() for x in xs])
        out.append(Surface(f"{prefix}/{w}", {knob: tuple(float(x) for x in xs)}, e, t))
    return out


def zeus_surfaces(trace_csv: Path, gpu: str) -> list[Surface]:
    """Power-limit surfaces, one per Zeus workload (dataset/network/batch/optimizer)."""
    return _one_axis(load_zeus_trace(str(trace_csv)), "power_limit", f"zeus-{gpu}")


def kernel_tuner_surfaces(cache_json: Path, prefix: str) -> list[Surface]:
    """SM-clock surfaces, one per kernel configuration of a Kernel Tuner cache."""
    return _one_axis(load_kernel_tuner(str(cache_json)), "sm_clock", prefix)


def ulisboa_surfaces(micro_csv: Path) -> list[Surface]:
    """(SM clock, memory clock) surfaces of the Titan X micro-benchmarks.

    Rows: power W, core MHz, memory MHz, then utilisation counters (DRAM last). Board power
    is measured; the time is modelled from the DRAM share (see the module docstring).
    """
    try:
        with open(micro_csv, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as e:
        raise RunFileError(f"{micro_csv}: cannot read ({e})") from e
    data = [r for r in rows if len(r) >= 4 and _is_number(r[0])]
    if not data:
        raise RunFileError(f"{micro_csv}: no rows of power, core clock, memory clock")
    arr = np.array([[float(v) for v in r] for r in data])
    cores = tuple(float(c) for c in np.unique(arr[:, 1]))
    mems = tuple(float(m) for m in np.unique(arr[:, 2]))
    per_grid = len(cores) * len(mems)
    out = []
    for k in range(arr.shape[0] // per_grid):
        block = arr[k * per_grid:(k + 1) * per_grid]
        power = np.full((len(cores), len(mems)), np.nan)
        for p, c, m in block[:, :3]:
            power[cores.index(c), mems.index(m)] = p
        if np.isnan(power).any():
            continue
        dram = float(np.clip(block[-1, -1], 0.0, 1.0))
        fc = np.array(cores)[:, None] / cores[-1]
        fm = np.array(mems)[None, :] / mems[-1]
        time_s = (1.0 - dram) / fc + dram / fm
        # memory clock first: the order the search takes them (docs/tune.md says why)
        out.append(Surface(f"ulisboa-titanx/bench{k:03d}", {"mem_clock": mems,
                           "sm_clock": cores}, (power * time_s).T.copy(), time_s.T.copy(),
                           note="time modelled from the DRAM utilisation counter"))
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def public_surfaces(public: Path) -> dict[str, list[Surface]]:
    """Every surface of the published tables under ``public`` (tests/data/public), by source."""
    trace = public / "zeus/examples/research_reproducibility/zeus_nsdi23/trace"
    return {
        "zeus-a40": zeus_surfaces(trace / "summary_power_a40.csv", "a40"),
        "zeus-v100": zeus_surfaces(trace / "summary_power_v100.csv", "v100"),
        "kt-rtx4000ada": kernel_tuner_surfaces(
            public / "powersensor3-results/GPU-tuning/"
            "AD4000_wmma_complex_gemm_opt_16bit_1x4096x4096x4096.json", "kt-rtx4000ada"),
        "kt-a100": kernel_tuner_surfaces(
            public / "kernel_tuner_tutorial/energy/data/"
            "synthetic_fp32_cache_NVIDIA_A100-PCIE-40GB.json", "kt-a100"),
        "ulisboa-titanx": ulisboa_surfaces(
            public / "hpc-ulisboa-gpupowermodel/v2.0_TPDS2019/example_files/micro_gtxtitanx.csv"),
    }
