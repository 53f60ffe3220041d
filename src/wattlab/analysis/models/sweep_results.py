"""Sweep results: one row per (workload, setting, repeat), from our sweeps or published tables.

Why one table type: ``wattlab fit`` must treat a sweep recorded here and the published data
(Zeus traces and profile windows, Kernel Tuner caches with NVML or PowerSensor3 energy) the
same way, so each loader turns its format into a ``SweepTable`` with SI/MHz units in names.

The sweep file (HDF5, written by ``wattlab sweep``)::

    /             attrs: format="wattlab-sweep", format_version, x_name, energy_source,
                         default_x, complete, interrupted, original_json, restored_json, ...
    /runs/<col>   one 1-D dataset per column (workload, x, repeat, runtime_s, status, ...)
    /runs/energy_j  n × sources, attrs["sources"] = JSON list of source names
    /features/<name>  numeric workload features (for models across workloads)
    /phases/<col>  one row per (run, phase name) where the workload marked phases:
                   run (row index in /runs), phase, count (occurrences summed), time_s,
                   energy_j (n × sources, attrs["sources"])
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from wattlab.analysis.energy import at_updates
from wattlab.errors import RunFileError, UsageError
from wattlab.output_files import create_temp
from wattlab.runfile import Run, SourceView, open_read_only

FloatArray = npt.NDArray[np.float64]
SWEEP_FORMAT = "wattlab-sweep"
SWEEP_FORMAT_VERSION = "1"
X_NAMES = {"power_limit": "power_limit_w", "sm_clock": "sm_clock_mhz", "mem_clock": "mem_clock_mhz"}
ZEUS_TRACE_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "power_limit",
                      "time_per_epoch", "average_power")
_FLOAT_COLUMNS = ("x", "runtime_s", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w")
_KT_AXES = {"nvml_gr_clock": "sm_clock_mhz", "nvml_mem_clock": "mem_clock_mhz",
            "nvml_pwr_limit": "power_limit_w"}


@dataclass
class PhaseTable:
    """Energy and time per phase of each run: one row per (run row, phase name).

    A phase that occurs several times in one run (a loop of ``wattlab.phase("step")``) is
    summed: ``count`` says how often it occurred, ``time_s`` and ``energies_j`` are totals.
    """

    run: npt.NDArray[np.int64]
    phase: list[str]
    count: npt.NDArray[np.int64]
    time_s: FloatArray
    energies_j: dict[str, FloatArray]

    def __len__(self) -> int:
        return len(self.phase)

    def names(self) -> list[str]:
        """Phase names in first-seen order."""
        return list(dict.fromkeys(self.phase))

    def take(self, rows: npt.NDArray[np.int64], run_map: dict[int, int]) -> PhaseTable:
        """These rows, their run indices renumbered by ``run_map`` (old -> new)."""
        return PhaseTable(np.array([run_map[int(self.run[i])] for i in rows], dtype=np.int64),
                          [self.phase[i] for i in rows], self.count[rows], self.time_s[rows],
                          {k: v[rows] for k, v in self.energies_j.items()})

    @classmethod
    def empty(cls) -> PhaseTable:
        return cls(np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0), {})


@dataclass
class SweepTable:
    """Rows of a sweep; ``energy_j`` is the energy of ``energy_source`` (J per run)."""

    x_name: str
    workload: list[str]
    x: FloatArray
    runtime_s: FloatArray
    energy_j: FloatArray
    energy_source: str = "energy"
    repeat: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    energies_j: dict[str, FloatArray] = field(default_factory=dict)
    sm_clock_mhz: FloatArray | None = None
    mem_clock_mhz: FloatArray | None = None
    power_limit_w: FloatArray | None = None
    status: list[str] = field(default_factory=list)
    features: dict[str, FloatArray] = field(default_factory=dict)
    default_x: float | None = None
    origin: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    phases: PhaseTable | None = None

    def __post_init__(self) -> None:
        n = len(self.workload)
        self.x = np.asarray(self.x, dtype=np.float64)
        self.runtime_s = np.asarray(self.runtime_s, dtype=np.float64)
        self.energy_j = np.asarray(self.energy_j, dtype=np.float64)
        if len(self.repeat) != n:
            self.repeat = _repeat_index(self.workload, self.x)
        if len(self.status) != n:
            self.status = ["ok"] * n
        for name in ("x", "runtime_s", "energy_j"):
            if getattr(self, name).shape != (n,):
                raise UsageError(f"{self.origin}: column {name} has {getattr(self, name).shape} "
                                 f"values for {n} rows")

    def __len__(self) -> int:
        return len(self.workload)

    @property
    def mean_power_w(self) -> FloatArray:
        """Mean power per run (W): energy over runtime."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(self.energy_j / self.runtime_s, dtype=np.float64)

    def workloads(self) -> list[str]:
        """Workload names in first-seen order."""
        return list(dict.fromkeys(self.workload))

    def column(self, name: str) -> FloatArray | None:
        """A float column by name (x, runtime_s, the clocks, the power limit) or None."""
        value = getattr(self, name, None)
        return None if value is None else np.asarray(value, dtype=np.float64)

    def select(self, mask: npt.NDArray[np.bool_]) -> SweepTable:
        """The rows where ``mask`` is true (a new table)."""
        idx = np.flatnonzero(mask)
        phases = None
        if self.phases is not None:
            run_map = {int(old): new for new, old in enumerate(idx)}
            keep = np.flatnonzero([int(r) in run_map for r in self.phases.run])
            phases = self.phases.take(keep, run_map)

        def pick(a: FloatArray | None) -> FloatArray | None:
            return None if a is None else np.asarray(a)[idx]

        return SweepTable(
            x_name=self.x_name, workload=[self.workload[i] for i in idx], x=self.x[idx],
            runtime_s=self.runtime_s[idx], energy_j=self.energy_j[idx],
            energy_source=self.energy_source, repeat=self.repeat[idx],
            energies_j={k: v[idx] for k, v in self.energies_j.items()},
            sm_clock_mhz=pick(self.sm_clock_mhz), mem_clock_mhz=pick(self.mem_clock_mhz),
            power_limit_w=pick(self.power_limit_w), status=[self.status[i] for i in idx],
            features={k: v[idx] for k, v in self.features.items()}, default_x=self.default_x,
            origin=self.origin, attrs=dict(self.attrs), phases=phases,
        )

    def usable(self) -> SweepTable:
        """Rows that finished and have a positive runtime and energy (what models fit)."""
        ok = np.array([s == "ok" for s in self.status], dtype=bool)
        ok &= np.isfinite(self.runtime_s) & np.isfinite(self.energy_j) & np.isfinite(self.x)
        ok &= (self.runtime_s > 0) & (self.energy_j > 0)
        return self.select(ok)

    def with_x(self, x_name: str) -> SweepTable:
        """The same rows against another axis (e.g. measured SM clock of a power-limit sweep)."""
        if x_name == self.x_name:
            return self
        values = self.column(x_name)
        if values is None or not np.any(np.isfinite(values)):
            raise UsageError(f"{self.origin}: this sweep varies {self.x_name}; it has no "
                             f"{x_name} values to fit against")
        out = self.select(np.ones(len(self), dtype=bool))
        out.x, out.x_name, out.default_x = values, x_name, None
        return out


def _repeat_index(workload: list[str], x: FloatArray) -> npt.NDArray[np.int64]:
    seen: dict[tuple[str, float], int] = {}
    out = np.zeros(len(workload), dtype=np.int64)
    for i, (w, v) in enumerate(zip(workload, x.tolist(), strict=True)):
        out[i] = seen.get((w, v), 0)
        seen[(w, v)] = int(out[i]) + 1
    return out


def _codes(values: list[str]) -> tuple[FloatArray, list[str]]:
    """Categorical strings as integer codes (trees split on them) and the code book."""
    book = sorted(set(values))
    index = {v: i for i, v in enumerate(book)}
    return np.array([index[v] for v in values], dtype=np.float64), book


# --------------------------------------------------------------------------- HDF5 file


def write_sweep(path: str, table: SweepTable, attrs: dict[str, Any] | None = None) -> None:
    """Write (or atomically replace) a sweep file, so partial results survive a crash."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = create_temp(folder, ".sweep-", ".h5.tmp")
    os.close(fd)
    try:
        with h5py.File(tmp, "w", locking=False) as f:
            root = {"format": SWEEP_FORMAT, "format_version": SWEEP_FORMAT_VERSION,
                    "x_name": table.x_name, "energy_source": table.energy_source,
                    "default_x": np.nan if table.default_x is None else table.default_x,
                    **table.attrs, **(attrs or {})}
            for k, v in root.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, dict | list) else v
            runs = f.create_group("runs")
            runs["workload"] = np.array(table.workload, dtype=h5py.string_dtype())
            runs["status"] = np.array(table.status, dtype=h5py.string_dtype())
            runs["repeat"] = table.repeat
            n = len(table)
            for name in _FLOAT_COLUMNS:
                col = table.column(name)
                runs[name] = np.full(n, np.nan) if col is None else col
            sources = list(table.energies_j) or [table.energy_source]
            energy = np.column_stack([table.energies_j.get(s, table.energy_j) for s in sources])
            ds = runs.create_dataset("energy_j", data=energy.reshape(n, len(sources)))
            ds.attrs["sources"] = json.dumps(sources)
            ds.attrs["unit"] = "J"
            feats = f.create_group("features")
            for k, v in table.features.items():
                feats[k] = v
            if table.phases is not None and len(table.phases):
                _write_phases(f.create_group("phases"), table.phases)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_phases(group: h5py.Group, phases: PhaseTable) -> None:
    group["run"] = phases.run
    group["phase"] = np.array(phases.phase, dtype=h5py.string_dtype())
    group["count"] = phases.count
    group["time_s"] = phases.time_s
    sources = list(phases.energies_j)
    n = len(phases)
    energy = (np.column_stack([phases.energies_j[s] for s in sources]) if sources
              else np.zeros((n, 0)))
    ds = group.create_dataset("energy_j", data=energy.reshape(n, len(sources)))
    ds.attrs["sources"] = json.dumps(sources)
    ds.attrs["unit"] = "J"


def _read_phases(path: str, group: h5py.Group, n_runs: int) -> PhaseTable:
    missing = [c for c in ("run", "phase", "count", "time_s", "energy_j") if c not in group]
    if missing:
        raise RunFileError(f"{path}: sweep file lacks /phases/{', /phases/'.join(missing)}")
    run = np.asarray(group["run"][:], dtype=np.int64)
    if run.size and (run.min() < 0 or run.max() >= n_runs):
        raise RunFileError(f"{path}: /phases/run refers to a run outside 0..{n_runs - 1}")
    sources = json.loads(group["energy_j"].attrs["sources"])
    energy = np.asarray(group["energy_j"][:], dtype=np.float64)
    return PhaseTable(run, [_s(p) for p in group["phase"][:]],
                      np.asarray(group["count"][:], dtype=np.int64),
                      np.asarray(group["time_s"][:], dtype=np.float64),
                      {s: energy[:, i] for i, s in enumerate(sources)})


def read_sweep(path: str) -> SweepTable:
    """Read a sweep file written by ``write_sweep``."""
    with open_read_only(path, swmr=False) as f:
        if f.attrs.get("format") != SWEEP_FORMAT or "runs" not in f:
            raise RunFileError(f"{path}: not a wattlab sweep file (format attribute "
                               f"{f.attrs.get('format')!r}, expected {SWEEP_FORMAT!r})")
        runs = f["runs"]
        missing = [c for c in ("workload", "x", "runtime_s", "energy_j") if c not in runs]
        if missing:
            raise RunFileError(f"{path}: sweep file lacks /runs/{', /runs/'.join(missing)}")
        sources = json.loads(runs["energy_j"].attrs["sources"])
        energy = np.asarray(runs["energy_j"][:], dtype=np.float64)
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        energy_source = str(attrs.pop("energy_source", sources[0]))
        default = float(attrs.pop("default_x", np.nan))
        x_name = str(attrs.pop("x_name"))
        energies = {s: energy[:, i] for i, s in enumerate(sources)}
        cols = {c: np.asarray(runs[c][:], dtype=np.float64) for c in _FLOAT_COLUMNS if c in runs}
        phases = (_read_phases(path, f["phases"], len(cols["x"])) if "phases" in f else None)
        return SweepTable(
            x_name=x_name, workload=[_s(w) for w in runs["workload"][:]], x=cols["x"],
            runtime_s=cols["runtime_s"],
            energy_j=energies.get(energy_source, energy[:, 0]), energy_source=energy_source,
            repeat=np.asarray(runs["repeat"][:], dtype=np.int64),
            energies_j=energies, sm_clock_mhz=cols.get("sm_clock_mhz"),
            mem_clock_mhz=cols.get("mem_clock_mhz"), power_limit_w=cols.get("power_limit_w"),
            status=[_s(s) for s in runs["status"][:]],
            features={k: np.asarray(v[:], dtype=np.float64) for k, v in f["features"].items()}
            if "features" in f else {},
            default_x=None if math.isnan(default) else default, origin=path, attrs=attrs,
            phases=phases,
        )


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- published


def _read_csv(path: str, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise RunFileError(f"{path}: missing column(s) {', '.join(missing)} "
                                   f"(has {', '.join(header)})")
            return list(reader)
    except OSError as e:
        raise RunFileError(f"{path}: cannot read ({e})") from e


def _float(path: str, row_no: int, row: dict[str, str], column: str) -> float:
    try:
        return float(row[column])
    except (TypeError, ValueError) as e:
        raise RunFileError(f"{path}: row {row_no}: column {column} = {row[column]!r} "
                           "is not a number") from e


def load_zeus_trace(path: str) -> SweepTable:
    """Zeus ``summary_power_*.csv``: energy per epoch = time_per_epoch × average_power."""
    rows = _read_csv(path, ZEUS_TRACE_COLUMNS)
    names = [f"{r['dataset']}/{r['network']}/bs{r['batch_size']}/{r['optimizer']}" for r in rows]
    t = np.array([_float(path, i + 2, r, "time_per_epoch") for i, r in enumerate(rows)])
    p = np.array([_float(path, i + 2, r, "average_power") for i, r in enumerate(rows)])
    x = np.array([_float(path, i + 2, r, "power_limit") for i, r in enumerate(rows)])
    features = {"log2_batch_size": np.log2(
        [max(_float(path, i + 2, r, "batch_size"), 1.0) for i, r in enumerate(rows)])}
    attrs: dict[str, Any] = {"format": "zeus-trace"}
    for cat in ("dataset", "network", "optimizer"):
        features[cat], attrs[f"{cat}_codes"] = _codes([r[cat] for r in rows])
    return SweepTable("power_limit_w", names, x, t, t * p, energy_source="zeus_average_power",
                      power_limit_w=x, features=features, origin=path, attrs=attrs)


_WINDOW = re.compile(r"_(\d+(?:\.\d+)?)$")


def load_zeus_profile(path: str) -> SweepTable:
    """Zeus profile windows (``tests/profile_data/*.csv``): measured J and s per power limit.

    The workload is the file name (``A40+resnet50+gpu0``); energy sums the GPUs' columns.
    """
    rows = _read_csv(path, ("window_name", "elapsed_time"))
    gpu_cols = [c for c in rows[0] if re.fullmatch(r"gpu\d+_energy", c)] if rows else []
    if not gpu_cols:
        raise RunFileError(f"{path}: missing column(s) gpu<N>_energy")
    stem = Path(path).stem
    xs: list[float] = []
    for i, r in enumerate(rows):
        m = _WINDOW.search(r["window_name"])
        if m is None:
            raise RunFileError(f"{path}: row {i + 2}: window name {r['window_name']!r} does not "
                               "end with a power limit")
        xs.append(float(m.group(1)))
    per_gpu = {c.removesuffix("_energy"): np.array(
        [_float(path, i + 2, r, c) for i, r in enumerate(rows)]) for c in gpu_cols}
    t = np.array([_float(path, i + 2, r, "elapsed_time") for i, r in enumerate(rows)])
    x = np.array(xs)
    parts = stem.split("+")
    gpus = parts[2].removeprefix("gpu").split(",") if len(parts) > 2 else ["0"]
    features = {"n_gpus": np.full(len(rows), float(len(gpus)))}
    total = np.sum(np.column_stack(list(per_gpu.values())), axis=1)
    return SweepTable("power_limit_w", [stem] * len(rows), x, t, total,
                      energy_source="zeus_gpu_energy", energies_j=per_gpu, power_limit_w=x,
                      features=features, origin=path,
                      attrs={"format": "zeus-profile", "gpu_model": parts[0]})


def load_kernel_tuner(path: str) -> SweepTable:
    """A Kernel Tuner cache; energy from ``ps_energy`` (PowerSensor3), else NVML.

    Energy per kernel run: ``ps_energy`` J, else ``nvml_energy`` J, else ``time`` ×
    ``nvml_power`` (or ``ps_power``). Each combination of the other tunables is a workload.
    """
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as e:
        raise RunFileError(f"{path}: not a readable JSON file ({e})") from e
    keys = data.get("tune_params_keys") if isinstance(data, dict) else None
    cache = data.get("cache") if isinstance(data, dict) else None
    if not isinstance(keys, list) or not isinstance(cache, dict):
        raise RunFileError(f"{path}: not a Kernel Tuner cache (no tune_params_keys / cache)")
    axes = [k for k in keys if k in _KT_AXES]
    if not axes:
        raise RunFileError(f"{path}: no swept NVML setting among tune_params_keys {keys} "
                           f"(expected one of {', '.join(_KT_AXES)})")
    axis = axes[0]
    others = [k for k in keys if k != axis]
    names: list[str] = []
    xs: list[float] = []
    ts: list[float] = []
    es: list[float] = []
    source = ""
    feats: dict[str, list[float]] = {k: [] for k in others}
    for entry in cache.values():
        t_ms = entry.get("time")
        if not isinstance(t_ms, int | float) or not math.isfinite(t_ms):
            continue  # failed or invalid configurations store strings here
        energy, src = _kt_energy(entry, float(t_ms))
        if energy is None:
            raise RunFileError(f"{path}: entry {entry.get(axis)} has no energy: needs "
                               "ps_energy, nvml_energy, nvml_power or ps_power")
        source = source or src
        names.append(",".join(f"{k}={entry.get(k)}" for k in others) or "kernel")
        xs.append(float(entry[axis]))
        ts.append(float(t_ms) / 1e3)
        es.append(energy)
        for k in others:
            v = entry.get(k)
            feats[k].append(float(v) if isinstance(v, int | float) else np.nan)
    if not names:
        raise RunFileError(f"{path}: no valid entries in the cache")
    x = np.array(xs)
    x_name = _KT_AXES[axis]
    return SweepTable(x_name, names, x, np.array(ts), np.array(es), energy_source=source,
                      features={k: np.array(v, dtype=np.float64) for k, v in feats.items()},
                      sm_clock_mhz=x if x_name == "sm_clock_mhz" else None,
                      mem_clock_mhz=x if x_name == "mem_clock_mhz" else None,
                      power_limit_w=x if x_name == "power_limit_w" else None, origin=path,
                      attrs={"format": "kernel-tuner", "device_name": data.get("device_name", ""),
                             "kernel_name": data.get("kernel_name", "")})


def _kt_energy(entry: dict[str, Any], t_ms: float) -> tuple[float | None, str]:
    for key in ("ps_energy", "nvml_energy"):
        if isinstance(entry.get(key), int | float):
            return float(entry[key]), key
    for key in ("nvml_power", "ps_power"):
        if isinstance(entry.get(key), int | float):
            return float(entry[key]) * t_ms / 1e3, f"time*{key}"
    return None, ""


SETTING_COLUMNS = ("power_limit_w", "sm_clock_mhz", "mem_clock_mhz")


def _one_of(path: str, header: list[str], wanted: tuple[str, ...]) -> str:
    """The first of ``wanted`` in the header, or an error naming the file and the columns."""
    for c in wanted:
        if c in header:
            return c
    raise RunFileError(f"{path}: missing column: one of {', '.join(wanted)} "
                       f"(has {', '.join(header)})")


def load_workload_csv(path: str) -> SweepTable:
    """A plain CSV: ``workload``, one setting column, ``runtime_s``, ``energy_j`` or ``power_w``.

    Why: a user's own measurements (e.g. a few settings of a new job beside full sweeps of
    others) in the simplest form a spreadsheet writes; one row per run, repeats allowed.
    """
    rows = _read_csv(path, ("workload", "runtime_s"))
    if not rows:
        raise RunFileError(f"{path}: no rows after the header")
    setting = _one_of(path, list(rows[0]), SETTING_COLUMNS)
    energy = _one_of(path, list(rows[0]), ("energy_j", "power_w"))
    x = np.array([_float(path, i + 2, r, setting) for i, r in enumerate(rows)])
    t = np.array([_float(path, i + 2, r, "runtime_s") for i, r in enumerate(rows)])
    e = np.array([_float(path, i + 2, r, energy) for i, r in enumerate(rows)])
    return SweepTable(setting, [r["workload"] for r in rows], x, t,
                      e if energy == "energy_j" else e * t, energy_source=energy,
                      origin=path, attrs={"format": "workload-csv"},
                      sm_clock_mhz=x if setting == "sm_clock_mhz" else None,
                      mem_clock_mhz=x if setting == "mem_clock_mhz" else None,
                      power_limit_w=x if setting == "power_limit_w" else None)


def load_table(path: str) -> SweepTable:
    """Any supported sweep table, by content: sweep HDF5, Zeus CSVs, Kernel Tuner JSON.

    A folder of Zeus profile CSVs loads as one table with one workload per file.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.csv"))
        if not files:
            raise RunFileError(f"{path}: folder holds no .csv profile files")
        return concat([load_table(str(f)) for f in files], origin=path)
    if not p.exists():
        raise RunFileError(f"{path}: no such file")
    with open(p, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"\x89HDF"):
        return read_sweep(path)
    if head.lstrip().startswith(b"{"):
        return load_kernel_tuner(path)
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    if "window_name" in first:
        return load_zeus_profile(path)
    if "time_per_epoch" in first or "average_power" in first:
        return load_zeus_trace(path)
    if "workload" in [c.strip() for c in first.split(",")]:
        return load_workload_csv(path)
    raise RunFileError(f"{path}: unknown sweep table format (expected a wattlab sweep file, "
                       "a Zeus summary_power/profile CSV, a CSV with a workload column or a "
                       "Kernel Tuner cache JSON)")


def concat(tables: list[SweepTable], origin: str = "") -> SweepTable:
    """Rows of several tables on the same axis as one table (features: the shared ones)."""
    if len({t.x_name for t in tables}) != 1:
        raise UsageError(f"{origin}: tables sweep different settings "
                         f"{sorted({t.x_name for t in tables})}")
    shared = set.intersection(*(set(t.features) for t in tables))
    feats = {k: np.concatenate([t.features[k] for t in tables]) for k in sorted(shared)}
    models = [str(t.attrs.get("gpu_model", "")) for t in tables for _ in range(len(t))]
    if any(models):
        feats["gpu_model"], _ = _codes(models)
    return SweepTable(
        tables[0].x_name, [w for t in tables for w in t.workload],
        np.concatenate([t.x for t in tables]), np.concatenate([t.runtime_s for t in tables]),
        np.concatenate([t.energy_j for t in tables]), energy_source=tables[0].energy_source,
        repeat=np.concatenate([t.repeat for t in tables]),
        features=feats, origin=origin, attrs={"format": "concatenated"},
    )


# --------------------------------------------------------------------------- our runs


class _Cumulative:
    """A stream's energy so far (J) against session time (ns), built once per stream.

    A counter is its own cumulative, its values at their updates where the reads pin them
    (``counter_ticks``); a power stream is summed in trapezoids.
    """

    def __init__(self, view: SourceView, channel: str, counter: bool) -> None:
        t = view.time_ns.astype(np.float64)
        v = view.channel(channel).astype(np.float64)
        ok = np.isfinite(v)
        t, v = t[ok], v[ok]
        if counter:
            t_s, v = at_updates(t * 1e-9, v)
            t = t_s * 1e9
        else:
            v = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * np.diff(t) * 1e-9)])
        self.t_ns, self.energy_j = t, v

    def between(self, a_ns: float, b_ns: float) -> float:
        """Energy between two session times; NaN unless the stream covers both."""
        t = self.t_ns
        if t.shape[0] < 2 or a_ns < t[0] or b_ns > t[-1]:
            return float("nan")
        e = np.interp([a_ns, b_ns], t, self.energy_j)
        return float(e[1] - e[0])


def _window_mean(view: SourceView, channel: str, a_ns: float, b_ns: float) -> float:
    t = view.time_ns
    inside = (t >= a_ns) & (t <= b_ns)
    v = view.channel(channel)[inside]
    return float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan")


# (name in the sweep file, source suffix, channel, is an energy counter)
RUN_ENERGY_SOURCES = (("nvml_energy", "energy", "energy_j", True),
                      ("nvml_samples", "samples", "power_w", False),
                      ("nvml_instant", "power", "instant_power_w", False),
                      ("nvml_average", "power", "average_power_w", False))


def _energy_streams(run: Run, gpu: int) -> list[tuple[str, _Cumulative]]:
    """(name in the sweep file, cumulative) of each energy source the GPU's run has."""
    out = []
    for name, sid, channel, counter in RUN_ENERGY_SOURCES:
        view = run.sources.get(f"gpu{gpu}.{sid}")
        if view is not None and channel in view.channel_names and len(view) > 1:
            out.append((name, _Cumulative(view, channel, counter)))
    return out


def measure_run(path: str, gpu: int, runtime_s: float | None,
                ) -> tuple[float, dict[str, float], dict[str, float]]:
    """(runtime s, energy J per source, mean clocks/limit) of the workload in a run file.

    The window starts at the session's begin marker and lasts ``runtime_s`` when given
    (simulated fixed work), else ends at the session's end marker (the command exited).
    """
    with Run(path) as run:
        marks = [m for m in run.markers if m.source == "session"]
        begin = next((m.time_ns for m in marks if m.kind == "begin"), None)
        end = next((m.time_ns for m in marks if m.kind == "end"), None)
        if begin is None:
            raise RunFileError(f"{path}: no session begin marker; cannot find the workload")
        b = float(begin)
        if runtime_s is not None:
            e = b + runtime_s * 1e9
        elif end is not None:
            e = float(end)
        else:
            raise RunFileError(f"{path}: no session end marker; cannot find the workload's end")
        energies = {name: c.between(b, e) for name, c in _energy_streams(run, gpu)}
        state: dict[str, float] = {}
        view = run.sources.get(f"gpu{gpu}.state")
        for channel, key, scale in (("sm_clock_hz", "sm_clock_mhz", 1e-6),
                                    ("mem_clock_hz", "mem_clock_mhz", 1e-6),
                                    ("power_limit_w", "power_limit_w", 1.0)):
            if view is not None and channel in view.channel_names:
                state[key] = _window_mean(view, channel, b, e) * scale
        return (e - b) / 1e9, energies, state


@dataclass
class PhaseMeasure:
    """One phase name in one run: occurrences, total time (s), total energy per source (J)."""

    phase: str
    count: int
    time_s: float
    energies_j: dict[str, float]


def measure_phases(path: str, gpu: int) -> list[PhaseMeasure]:
    """Energy and time per phase name of a run file, from the workload's begin/end markers.

    The session's own begin/end markers are not phases; occurrences of a name are summed.
    """
    from wattlab.analysis.energy import phases_from_markers

    with Run(path) as run:
        phases = phases_from_markers([m for m in run.markers if m.source != "session"])
        out: dict[str, PhaseMeasure] = {}
        streams = _energy_streams(run, gpu)
        for ph in phases:
            a_ns, b_ns = ph.t0_s * 1e9, ph.t1_s * 1e9
            row = out.setdefault(ph.name, PhaseMeasure(ph.name, 0, 0.0, {}))
            row.count += 1
            row.time_s += ph.t1_s - ph.t0_s
            for name, cumulative in streams:
                e = cumulative.between(a_ns, b_ns)
                row.energies_j[name] = row.energies_j.get(name, 0.0) + e
        return list(out.values())


def phase_table(phases_per_run: list[list[PhaseMeasure]]) -> PhaseTable:
    """The per-phase rows of a sweep from each run's ``measure_phases`` (run = list index)."""
    rows = [(i, p) for i, plist in enumerate(phases_per_run) for p in plist]
    sources: list[str] = []
    for _, p in rows:
        sources += [s for s in p.energies_j if s not in sources]
    return PhaseTable(
        np.array([i for i, _ in rows], dtype=np.int64), [p.phase for _, p in rows],
        np.array([p.count for _, p in rows], dtype=np.int64),
        np.array([p.time_s for _, p in rows], dtype=np.float64),
        {s: np.array([p.energies_j.get(s, np.nan) for _, p in rows], dtype=np.float64)
         for s in sources})


def table_from_runs(x_name: str, workload: str, runs: list[dict[str, Any]],
                    default_x: float | None = None,
                    phases: list[list[PhaseMeasure]] | None = None) -> SweepTable:
    """A table from the sweep runner's rows (dicts: x, repeat, status, runtime_s, energies_j).

    The first energy source other than the simulator's "true" is the primary one.
    """
    sources: list[str] = []
    for r in runs:
        sources += [s for s in r["energies_j"] if s not in sources]
    measured = [s for s in sources if s != "true"]
    primary = measured[0] if measured else (sources[0] if sources else "energy")
    n = len(runs)

    def col(key: str) -> FloatArray:
        return np.array([float(r.get(key, np.nan)) for r in runs], dtype=np.float64)

    energies = {s: np.array([r["energies_j"].get(s, np.nan) for r in runs], dtype=np.float64)
                for s in sources}
    return SweepTable(
        x_name, [workload] * n, col("x"), col("runtime_s"),
        energies.get(primary, np.full(n, np.nan)), energy_source=primary,
        repeat=np.array([int(r["repeat"]) for r in runs], dtype=np.int64), energies_j=energies,
        sm_clock_mhz=col("sm_clock_mhz"), mem_clock_mhz=col("mem_clock_mhz"),
        power_limit_w=col("power_limit_w"), status=[str(r["status"]) for r in runs],
        default_x=default_x,
        phases=None if phases is None or not any(phases) else phase_table(phases))
