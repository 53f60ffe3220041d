"""Board power from core clock, memory clock and utilisation counters, cross-validated.

Why: a sweep measures a few settings; a power model that knows how each hardware unit's
activity costs power at each (core, memory) clock pair predicts the rest, and says which
units dominate. The published reference is Guerreiro et al. (HPCA'18, TPDS'19: gpmTOOL),
whose GTX Titan X data (micro-benchmarks at 16 × 4 clock pairs with 12 utilisation
counters, and the authors' fitted model) we read here. Their files (all CSV):

- training (``micro_*.csv``): line 1 number of clock domains, 2 default clock per domain
  (MHz), 3 components per domain, 4 component names, then one row per measurement:
  power W, one clock per domain (MHz), one utilisation (0..1) per component;
- applications (``real_*.csv``): the same 4 header lines, then ``name, utilisations…``
  measured at the default clocks (no power: the paper's measured power is not published);
- model (``model_*.csv``): the header, the core clocks, the memory clocks, the parameters
  (β0..β3 then one ω per component), then voltages relative to the default's: either one
  row per memory clock of core voltages per core clock (HPCA'18, memory voltage 1), or one
  row of core voltages per core clock and one of memory voltages per memory clock (TPDS'19).
  Power = β0·Vc + β1·Vm + β2·Vc²·fc + β3·Vm²·fm + Σcore ωi·Vc²·fc·Ui + Σmem ωj·Vm²·fm·Uj.

Our model makes no voltage assumption: P = c(fc, fm) + sc(fc)·Σcore ωi·Ui + sm(fm)·Σmem ωj·Uj,
with an idle power per clock pair, a dynamic-power scale per core clock and per memory clock
(1 at the default; physically V²f relative to the default) and one cost per unit, fitted by
alternating least squares (each half-step is linear). Its error is measured by leaving each
micro-benchmark out (all its clock pairs), refitting, and predicting it: that is the error
on an unseen kernel, the use the model is for.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wattlab.errors import RunFileError, UsageError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class GpmHeader:
    """The 4 header lines every gpmTOOL file starts with."""

    default_mhz: tuple[int, ...]
    components: tuple[int, ...]  # per clock domain (core first, then memory)
    names: tuple[str, ...]

    @property
    def n_core(self) -> int:
        return self.components[0]


@dataclass
class PowerSamples:
    """Measured board power with clocks and utilisations (a training file)."""

    header: GpmHeader
    power_w: FloatArray
    core_mhz: FloatArray
    mem_mhz: FloatArray
    util: FloatArray  # n × components
    benchmark: IntArray  # rows with the same utilisation vector: one micro-benchmark
    origin: str = ""

    def __len__(self) -> int:
        return int(self.power_w.shape[0])

    def select(self, rows: IntArray) -> PowerSamples:
        return PowerSamples(self.header, self.power_w[rows], self.core_mhz[rows],
                            self.mem_mhz[rows], self.util[rows], self.benchmark[rows],
                            self.origin)


@dataclass
class AppUtilisations:
    """Applications' utilisations at the default clocks (a predictions file)."""

    header: GpmHeader
    names: list[str]
    util: FloatArray
    origin: str = ""


def _rows(path: str) -> list[list[str]]:
    try:
        with open(path, newline="") as fh:
            return [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except OSError as e:
        raise RunFileError(f"{path}: cannot read ({e})") from e
    except (UnicodeDecodeError, csv.Error) as e:  # an HDF5 or other binary file
        raise RunFileError(f"{path}: not a gpmTOOL CSV file: not text ({e})") from e


def _numbers(path: str, line_no: int, cells: list[str], what: str) -> FloatArray:
    try:
        return np.array([float(c) for c in cells], dtype=np.float64)
    except ValueError as e:
        raise RunFileError(f"{path}: line {line_no}: {what}: {e}") from e


def _header(path: str, rows: list[list[str]]) -> GpmHeader:
    if len(rows) < 4:
        raise RunFileError(f"{path}: a gpmTOOL file needs 4 header lines, has {len(rows)}")
    n = _numbers(path, 1, rows[0], "number of clock domains")
    if n.shape != (1,) or n[0] != 2:
        raise RunFileError(f"{path}: line 1: expected 2 clock domains (core, memory), "
                           f"got {','.join(rows[0])}")
    default = _numbers(path, 2, rows[1], "default clocks")
    comps = _numbers(path, 3, rows[2], "components per domain")
    if default.shape != (2,) or comps.shape != (2,):
        raise RunFileError(f"{path}: lines 2-3 need one value per clock domain (2)")
    names = tuple(c.strip() for c in rows[3])
    if len(names) != int(comps.sum()):
        raise RunFileError(f"{path}: line 4 names {len(names)} components, line 3 says "
                           f"{int(comps.sum())}")
    return GpmHeader((int(default[0]), int(default[1])), (int(comps[0]), int(comps[1])), names)


def load_gpm_training(path: str) -> PowerSamples:
    """A gpmTOOL training file: power, core MHz, memory MHz, utilisations per row."""
    rows = _rows(path)
    h = _header(path, rows)
    width = 3 + len(h.names)
    data = []
    for i, r in enumerate(rows[4:]):
        if len(r) != width:
            raise RunFileError(f"{path}: line {i + 5}: {len(r)} values, expected {width} "
                               "(power, core MHz, memory MHz, one utilisation per component)")
        data.append(_numbers(path, i + 5, r, "measurement"))
    if not data:
        raise RunFileError(f"{path}: no measurements after the header")
    a = np.vstack(data)
    _, bench = np.unique(a[:, 3:], axis=0, return_inverse=True)
    return PowerSamples(h, a[:, 0], a[:, 1], a[:, 2], a[:, 3:],
                        np.asarray(bench, dtype=np.int64).ravel(), path)


def load_gpm_apps(path: str) -> AppUtilisations:
    """A gpmTOOL predictions file: application name and utilisations per row."""
    rows = _rows(path)
    h = _header(path, rows)
    names, utils = [], []
    for i, r in enumerate(rows[4:]):
        if len(r) != 1 + len(h.names):
            raise RunFileError(f"{path}: line {i + 5}: {len(r)} values, expected a name and "
                               f"{len(h.names)} utilisations")
        names.append(r[0].strip())
        utils.append(_numbers(path, i + 5, r[1:], "utilisations"))
    if not names:
        raise RunFileError(f"{path}: no applications after the header")
    return AppUtilisations(h, names, np.vstack(utils), path)


@dataclass
class PublishedModel:
    """The gpmTOOL model (see the module doc for the equation and the file layout)."""

    header: GpmHeader
    core_mhz: FloatArray
    mem_mhz: FloatArray
    params: FloatArray
    core_voltage: FloatArray  # n_mem × n_core, relative to the default
    mem_voltage: FloatArray  # n_mem
    origin: str = ""

    def _index(self, grid: FloatArray, f: FloatArray, what: str) -> IntArray:
        idx = np.searchsorted(grid, f)
        bad = (idx >= grid.shape[0]) | (grid[np.minimum(idx, grid.shape[0] - 1)] != f)
        if np.any(bad):
            raise UsageError(f"{self.origin}: the model has no voltage for {what} clock(s) "
                             f"{sorted(set(f[bad].tolist()))} MHz (has {grid.tolist()})")
        return np.asarray(idx, dtype=np.int64)

    def predict(self, core_mhz: FloatArray, mem_mhz: FloatArray, util: FloatArray) -> FloatArray:
        """Power (W) at each row's clock pair with that row's utilisations."""
        fc = np.asarray(core_mhz, dtype=np.float64)
        fm = np.asarray(mem_mhz, dtype=np.float64)
        ic = self._index(self.core_mhz, fc, "core")
        im = self._index(self.mem_mhz, fm, "memory")
        vc, vm = self.core_voltage[im, ic], self.mem_voltage[im]
        b, k = self.params, self.header.n_core
        u = np.atleast_2d(util)
        core = (u[:, :k] @ b[4:4 + k]) * vc ** 2 * fc
        mem = (u[:, k:] @ b[4 + k:]) * vm ** 2 * fm
        return np.asarray(b[0] * vc + b[1] * vm + b[2] * vc ** 2 * fc + b[3] * vm ** 2 * fm
                          + core + mem, dtype=np.float64)


    def core_scale(self) -> dict[str, float]:
        """Vc²·fc relative to the default clocks: the published counterpart of our sc(fc)."""
        f0, m0 = self.header.default_mhz
        jm = int(np.argmin(np.abs(self.mem_mhz - m0)))
        jc = int(np.argmin(np.abs(self.core_mhz - f0)))
        v = self.core_voltage[jm]
        ref = v[jc] ** 2 * self.core_mhz[jc]
        return {f"{f:g}": float(x ** 2 * f / ref)
                for f, x in zip(self.core_mhz, v, strict=True)}


def load_gpm_model(path: str) -> PublishedModel:
    """A gpmTOOL model file, either voltage layout (HPCA'18 matrix or TPDS'19 two rows)."""
    rows = _rows(path)
    h = _header(path, rows)
    if len(rows) < 8:
        raise RunFileError(f"{path}: a model file needs clocks, parameters and voltages after "
                           "the header")
    fc = _numbers(path, 5, rows[4], "core clocks")
    fm = _numbers(path, 6, rows[5], "memory clocks")
    params = _numbers(path, 7, rows[6], "parameters")
    if params.shape[0] != 4 + len(h.names):
        raise RunFileError(f"{path}: line 7: {params.shape[0]} parameters, expected "
                           f"{4 + len(h.names)} (β0..β3 and one ω per component)")
    volts = [_numbers(path, 8 + i, r, "voltages") for i, r in enumerate(rows[7:])]
    nc, nm = fc.shape[0], fm.shape[0]
    if len(volts) == nm and all(v.shape[0] == nc for v in volts):
        core_v, mem_v = np.vstack(volts), np.ones(nm)
    elif len(volts) == 2 and volts[0].shape[0] == nc and volts[1].shape[0] == nm:
        core_v, mem_v = np.repeat(volts[0][None, :], nm, axis=0), volts[1]
    else:
        raise RunFileError(f"{path}: voltage lines: expected {nm} rows of {nc} core voltages, "
                           f"or one row of {nc} core and one of {nm} memory voltages")
    order_c, order_m = np.argsort(fc), np.argsort(fm)
    return PublishedModel(h, fc[order_c], fm[order_m], params,
                          core_v[order_m][:, order_c], mem_v[order_m], path)


# --------------------------------------------------------------------------- models


class PowerModel(Protocol):
    """What cross-validation needs: fit on samples, predict power."""

    def fit(self, s: PowerSamples) -> PowerModel: ...

    def predict(self, core_mhz: FloatArray, mem_mhz: FloatArray,
                util: FloatArray) -> FloatArray: ...


def _solve(x: FloatArray, y: FloatArray) -> FloatArray:
    """Least squares by normal equations (tiny ridge for the unidentified directions)."""
    a = x.T @ x
    a[np.diag_indices_from(a)] += 1e-9 * max(float(np.trace(a)) / a.shape[0], 1e-12)
    return np.asarray(np.linalg.solve(a, x.T @ y), dtype=np.float64)


@dataclass
class ScaledPowerModel:
    """P = c(fc, fm) + sc(fc)·Σcore ωi·Ui + sm(fm)·Σmem ωj·Uj (see the module doc)."""

    max_iter: int = 30
    tol: float = 1e-7
    core_grid: FloatArray = field(default_factory=lambda: np.zeros(0))
    mem_grid: FloatArray = field(default_factory=lambda: np.zeros(0))
    idle_w: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))  # n_mem × n_core
    core_scale: FloatArray = field(default_factory=lambda: np.zeros(0))
    mem_scale: FloatArray = field(default_factory=lambda: np.zeros(0))
    omega_w: FloatArray = field(default_factory=lambda: np.zeros(0))  # W at util 1, default
    n_core: int = 0
    iterations: int = 0

    def fit(self, s: PowerSamples) -> ScaledPowerModel:
        self.n_core = k = s.header.n_core
        self.core_grid, ic = np.unique(s.core_mhz, return_inverse=True)
        self.mem_grid, im = np.unique(s.mem_mhz, return_inverse=True)
        nc, nm, n = self.core_grid.shape[0], self.mem_grid.shape[0], len(s)
        cfg = im * nc + ic
        ncfg = nc * nm
        size = np.maximum(np.bincount(cfg, minlength=ncfg), 1).astype(np.float64)

        def demean(a: FloatArray) -> FloatArray:
            """Remove each clock pair's mean: the idle power per pair drops out (FWL)."""
            if a.ndim == 1:
                return np.asarray(a - (np.bincount(cfg, a, ncfg) / size)[cfg])
            means = np.stack([np.bincount(cfg, a[:, j], ncfg) for j in range(a.shape[1])], 1)
            return np.asarray(a - (means / size[:, None])[cfg])

        p_dm = demean(s.power_w)
        u_dm = demean(s.util)  # utilisations are linear: demean once
        sc = self.core_grid / self.core_grid.max()  # start: dynamic power ∝ f
        sm = self.mem_grid / self.mem_grid.max()
        rows = np.arange(n)
        sse_prev = np.inf
        omega = np.zeros(s.util.shape[1])
        for it in range(self.max_iter):
            # scales fixed: linear in the unit costs (within a pair the scale is constant)
            x1 = np.hstack([u_dm[:, :k] * sc[ic, None], u_dm[:, k:] * sm[im, None]])
            omega = _solve(x1, p_dm)
            a_core, a_mem = u_dm[:, :k] @ omega[:k], u_dm[:, k:] @ omega[k:]
            # costs fixed: linear in the scale of each core clock and each memory clock
            x2 = np.zeros((n, nc + nm))
            x2[rows, ic] = a_core
            x2[rows, nc + im] = a_mem
            theta = _solve(x2, p_dm)
            sc, sm = theta[:nc], theta[nc:]
            sse = float(np.sum((x2 @ theta - p_dm) ** 2))
            self.iterations = it + 1
            if sse_prev - sse <= self.tol * max(sse, 1e-12):
                break
            sse_prev = sse
        dyn = sc[ic] * (s.util[:, :k] @ omega[:k]) + sm[im] * (s.util[:, k:] @ omega[k:])
        idle = np.bincount(cfg, s.power_w - dyn, ncfg) / size
        # scale 1 at the default clocks (or the nearest measured), the units' cost absorbs it
        jc = int(np.argmin(np.abs(self.core_grid - s.header.default_mhz[0])))
        jm = int(np.argmin(np.abs(self.mem_grid - s.header.default_mhz[1])))
        c0 = sc[jc] if sc[jc] != 0 else 1.0
        m0 = sm[jm] if sm[jm] != 0 else 1.0
        self.core_scale, self.mem_scale = sc / c0, sm / m0
        self.omega_w = np.concatenate([omega[:k] * c0, omega[k:] * m0])
        self.idle_w = idle.reshape(nm, nc)
        return self

    def _index(self, grid: FloatArray, f: FloatArray, what: str) -> IntArray:
        idx = np.clip(np.searchsorted(grid, f), 0, grid.shape[0] - 1)
        if np.any(grid[idx] != f):
            raise UsageError(f"power model: {what} clock(s) "
                             f"{sorted(set(f[grid[idx] != f].tolist()))} MHz were not in the "
                             f"training data (has {grid.tolist()})")
        return np.asarray(idx, dtype=np.int64)

    def predict(self, core_mhz: FloatArray, mem_mhz: FloatArray,
                util: FloatArray) -> FloatArray:
        ic = self._index(self.core_grid, np.asarray(core_mhz, dtype=np.float64), "core")
        im = self._index(self.mem_grid, np.asarray(mem_mhz, dtype=np.float64), "memory")
        u, k = np.atleast_2d(util), self.n_core
        return np.asarray(self.idle_w[im, ic] + self.core_scale[ic] * (u[:, :k] @ self.omega_w[:k])
                          + self.mem_scale[im] * (u[:, k:] @ self.omega_w[k:]), dtype=np.float64)


@dataclass
class LinearPowerModel:
    """Baseline: P = a + b·fc + c·fm + d·fc² + Σcore ωi·Ui·fc + Σmem ωj·Uj·fm (one regression)."""

    n_core: int = 0
    coef: FloatArray = field(default_factory=lambda: np.zeros(0))

    def _design(self, fc: FloatArray, fm: FloatArray, u: FloatArray) -> FloatArray:
        k = self.n_core
        fc_g, fm_g = fc / 1e3, fm / 1e3
        return np.column_stack([np.ones_like(fc), fc_g, fm_g, fc_g ** 2,
                                u[:, :k] * fc_g[:, None], u[:, k:] * fm_g[:, None]])

    def fit(self, s: PowerSamples) -> LinearPowerModel:
        self.n_core = s.header.n_core
        self.coef = _solve(self._design(s.core_mhz, s.mem_mhz, s.util), s.power_w)
        return self

    def predict(self, core_mhz: FloatArray, mem_mhz: FloatArray,
                util: FloatArray) -> FloatArray:
        x = self._design(np.asarray(core_mhz, dtype=np.float64),
                         np.asarray(mem_mhz, dtype=np.float64), np.atleast_2d(util))
        return np.asarray(x @ self.coef, dtype=np.float64)


MODELS: dict[str, Callable[[], PowerModel]] = {
    "scaled": ScaledPowerModel,
    "linear": LinearPowerModel,
}


# --------------------------------------------------------------------------- validation


def _mape(pred: FloatArray, true: FloatArray) -> float:
    return float(100.0 * np.mean(np.abs(pred - true) / np.abs(true)))


def leave_one_benchmark_out(s: PowerSamples, make: Callable[[], PowerModel]) -> FloatArray:
    """Each row's power predicted by a model fitted without its micro-benchmark."""
    out = np.full(len(s), np.nan)
    for b in np.unique(s.benchmark):
        held = np.flatnonzero(s.benchmark == b)
        model = make().fit(s.select(np.flatnonzero(s.benchmark != b)))
        out[held] = model.predict(s.core_mhz[held], s.mem_mhz[held], s.util[held])
    return out


@dataclass
class ModelScore:
    """Errors of one model on the training file (MAPE %, and the 95th percentile APE)."""

    model: str
    loo_mape: float | None
    loo_p95: float | None
    in_sample_mape: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PowerModelReport:
    """What ``wattlab power-model`` prints."""

    origin: str
    n_rows: int
    n_benchmarks: int
    n_clock_pairs: int
    scores: list[ModelScore]
    chosen: str
    core_scale: dict[str, float]
    mem_scale: dict[str, float]
    omega_w: dict[str, float]
    published_origin: str | None = None
    published_core_scale: dict[str, float] = field(default_factory=dict)
    apps_origin: str | None = None
    apps_vs_published_mape: float | None = None
    apps_vs_published_by_app: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["scores"] = [s.to_json() for s in self.scores]
        return out


def power_model_report(training: str, published: str | None = None,
                       apps: str | None = None,
                       models: tuple[str, ...] = tuple(MODELS)) -> PowerModelReport:
    """Cross-validate our models on a training file; compare with a published model.

    The published model is scored on the same rows, but it was fitted on them (its error
    is in-sample, an optimistic figure); ours is given both ways. With ``apps`` the two
    models' predictions for those applications at every clock pair are compared (no
    measured power exists for them in the published files).
    """
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise UsageError(f"unknown power model(s) {', '.join(unknown)}; known: "
                         f"{', '.join(MODELS)}")
    s = load_gpm_training(training)
    # every file is read before the slow fits: a bad one is refused at once
    pub = None if published is None else load_gpm_model(published)
    app_utils = None if apps is None or pub is None else load_gpm_apps(apps)
    scores = []
    fitted: dict[str, PowerModel] = {}
    for name in models:
        loo = leave_one_benchmark_out(s, MODELS[name])
        ape = 100 * np.abs(loo - s.power_w) / s.power_w
        fitted[name] = MODELS[name]().fit(s)
        in_sample = fitted[name].predict(s.core_mhz, s.mem_mhz, s.util)
        scores.append(ModelScore(name, float(np.mean(ape)), float(np.percentile(ape, 95)),
                                 _mape(in_sample, s.power_w)))
    chosen = min(scores, key=lambda sc: sc.loo_mape or np.inf).model
    report = PowerModelReport(training, len(s), int(np.unique(s.benchmark).shape[0]),
                              int(np.unique(np.column_stack([s.core_mhz, s.mem_mhz]),
                                            axis=0).shape[0]),
                              scores, chosen, {}, {}, {})
    scaled = fitted.get("scaled")
    if isinstance(scaled, ScaledPowerModel):
        report.core_scale = {f"{f:g}": float(v) for f, v in
                             zip(scaled.core_grid, scaled.core_scale, strict=True)}
        report.mem_scale = {f"{f:g}": float(v) for f, v in
                            zip(scaled.mem_grid, scaled.mem_scale, strict=True)}
        report.omega_w = {n: float(w) for n, w in
                          zip(s.header.names, scaled.omega_w, strict=True)}
    if pub is not None:
        if pub.header != s.header:
            raise UsageError(f"{published}: its header (clocks, components) does not match "
                             f"{training}'s")
        p = pub.predict(s.core_mhz, s.mem_mhz, s.util)
        ape = 100 * np.abs(p - s.power_w) / s.power_w
        report.scores.append(ModelScore("published", None, None, float(np.mean(ape))))
        report.published_origin = published
        report.published_core_scale = pub.core_scale()
        if app_utils is not None:
            a = app_utils
            grid_c, grid_m = np.meshgrid(pub.core_mhz, pub.mem_mhz)
            fc, fm = grid_c.ravel(), grid_m.ravel()
            ours = fitted[chosen]
            by_app: dict[str, float] = {}
            diffs = []
            for name, u in zip(a.names, a.util, strict=True):
                uu = np.repeat(u[None, :], fc.shape[0], axis=0)
                theirs = pub.predict(fc, fm, uu)
                d = 100 * np.abs(ours.predict(fc, fm, uu) - theirs) / theirs
                by_app[name] = float(np.mean(d))
                diffs.append(d)
            report.apps_origin = apps
            report.apps_vs_published_mape = float(np.mean(np.concatenate(diffs)))
            report.apps_vs_published_by_app = by_app
    return report


TITAN_X = "hpc-ulisboa-gpupowermodel/v2.0_TPDS2019/example_files"


def titan_x_files(public: str | Path) -> tuple[str, str, str]:
    """(training, model, apps) paths of the TPDS'19 GTX Titan X example in ``public``."""
    folder = Path(public) / TITAN_X
    paths = tuple(str(folder / f"{k}_gtxtitanx.csv") for k in ("micro", "model", "real"))
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise UsageError(f"Titan X data not found: {', '.join(missing)}")
    return paths[0], paths[1], paths[2]


def format_power_report(r: PowerModelReport) -> str:
    """Terminal lines: errors per model, the fitted scales, the comparison on applications."""
    lines = [f"{r.origin}: {r.n_rows} rows, {r.n_benchmarks} micro-benchmarks, "
             f"{r.n_clock_pairs} clock pairs",
             "power MAPE (%): leave-one-benchmark-out / in-sample:"]
    for s in r.scores:
        loo = "-" if s.loo_mape is None else f"{s.loo_mape:6.2f} (p95 {s.loo_p95:5.1f})"
        note = "  (fitted on these rows)" if s.model == "published" else ""
        mark = "  <- chosen" if s.model == r.chosen else ""
        lines.append(f"  {s.model:<10} {loo:>19} / {s.in_sample_mape:6.2f}{note}{mark}")
    if r.omega_w:
        lines.append("unit cost at full utilisation, default clocks (W): " + ", ".join(
            f"{n} {w:.1f}" for n, w in r.omega_w.items()))
        lines.append("dynamic scale per core clock: " + ", ".join(
            f"{f} {v:.2f}" for f, v in r.core_scale.items()))
    if r.published_core_scale:
        lines.append("published Vc²·fc, relative:     " + ", ".join(
            f"{f} {v:.2f}" for f, v in r.published_core_scale.items()))
    if r.apps_vs_published_mape is not None:
        lines.append(f"{len(r.apps_vs_published_by_app)} applications of {r.apps_origin}: "
                     f"ours ({r.chosen}) vs published predictions, all clock pairs: mean "
                     f"difference {r.apps_vs_published_mape:.2f} %")
    return "\n".join(lines)
