"""Figures of a run: power timeline with phases and gaps, sample-level zooms, energy bars.

Every function takes plain arrays / small dataclasses and returns a matplotlib Figure, so
the HTML report, a notebook and other analyses (calibration, models) draw the same
pictures. The Agg backend is selected on import: no display is ever needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

FloatArray = npt.NDArray[np.float64]
GAP_COLOR = "#d62728"
MAX_SHADED_PHASES = 400


@dataclass(frozen=True)
class Trace:
    """Power of one source for display: raw samples, or min/mean/max per time bin."""

    label: str
    unit: str
    t_s: FloatArray
    mean: FloatArray
    low: FloatArray | None = None
    high: FloatArray | None = None

    @property
    def binned(self) -> bool:
        return self.low is not None


@dataclass(frozen=True)
class Span:
    """A time interval to draw: a phase (by name) or a gap (by source)."""

    start_s: float
    end_s: float
    label: str
    depth: int = 0


@dataclass
class ZoomWindow:
    """Raw samples of every power source inside one short window."""

    title: str
    t0_s: float
    t1_s: float
    traces: list[Trace] = field(default_factory=list)


def _phase_colors(names: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    unique = list(dict.fromkeys(names))
    return {name: cmap(i % 10) for i, name in enumerate(unique)}


def _shade(ax: Any, phases: Sequence[Span], gaps: Sequence[Span],
           colors: dict[str, Any]) -> None:
    """Top-level phases as light colour bands, gaps as red hatching (never hidden)."""
    top = [p for p in phases if p.depth == 0][:MAX_SHADED_PHASES]
    for p in top:
        ax.axvspan(p.start_s, p.end_s, color=colors[p.label], alpha=0.12, lw=0)
    for g in gaps:
        ax.axvspan(g.start_s, g.end_s, facecolor="none", edgecolor=GAP_COLOR, hatch="///",
                   lw=0.8, alpha=0.8)


def _draw_trace(ax: Any, trace: Trace, color: Any, marker: str = "") -> None:
    if trace.binned and trace.low is not None and trace.high is not None:
        ax.fill_between(trace.t_s, trace.low, trace.high, color=color, alpha=0.25, lw=0,
                        step="mid")
    ax.plot(trace.t_s, trace.mean, color=color, lw=1.0, marker=marker, ms=2.5,
            label=trace.label)


def timeline_figure(traces: Sequence[Trace], phases: Sequence[Span], gaps: Sequence[Span],
                    points: Sequence[tuple[float, str]] = ()) -> Figure:
    """Power per source on one time axis, a lane per phase name, gaps hatched in red."""
    names = list(dict.fromkeys(p.label for p in phases))
    lanes = max(1, len(names))
    fig, (ax, lane_ax) = plt.subplots(
        2, 1, figsize=(13, 5.2 + 0.25 * lanes), sharex=True,
        gridspec_kw={"height_ratios": [4.0, 0.6 + 0.3 * lanes]}, layout="constrained")
    colors = _phase_colors(names)
    _shade(ax, phases, gaps, colors)
    cycle = plt.get_cmap("Dark2")
    for i, trace in enumerate(traces):
        _draw_trace(ax, trace, cycle(i % 8))
    units = sorted({t.unit for t in traces}) or ["W"]
    ax.set_ylabel(f"power ({', '.join(units)})")
    ax.grid(True, alpha=0.3)
    if any(t.binned for t in traces):
        ax.set_title("band: min-max per bin; line: mean", loc="left", fontsize=9)
    if gaps:
        ax.plot([], [], color=GAP_COLOR, lw=3, label="gap (lost data)")
    if traces or gaps:
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False,
                  ncols=min(4, len(traces) + 1))
    for lane, name in enumerate(names):
        bars = [(p.start_s, max(p.end_s - p.start_s, 1e-9)) for p in phases if p.label == name]
        lane_ax.broken_barh(bars, (lane - 0.4, 0.8), facecolors=colors[name], alpha=0.8)
    for g in gaps:
        lane_ax.axvspan(g.start_s, g.end_s, color=GAP_COLOR, alpha=0.35, lw=0)
    for t_s, _name in points:
        lane_ax.axvline(t_s, color="0.3", lw=0.6, alpha=0.6)
    lane_ax.set_yticks(range(len(names)), names, fontsize=8)
    lane_ax.set_ylim(-0.6, lanes - 0.4)
    lane_ax.invert_yaxis()
    lane_ax.set_ylabel("phase")
    lane_ax.set_xlabel("time since session start (s)")
    if not names:
        lane_ax.text(0.5, 0.5, "no phases (no begin/end markers)", ha="center", va="center",
                     transform=lane_ax.transAxes, fontsize=9, color="0.4")
    return fig


def zoom_figure(windows: Sequence[ZoomWindow], phases: Sequence[Span],
                gaps: Sequence[Span]) -> Figure:
    """Every sample in a few short windows, time in ms from each window's start."""
    n = max(1, len(windows))
    fig, axes = plt.subplots(1, n, figsize=(13, 3.8), squeeze=False, layout="constrained")
    colors = _phase_colors([p.label for p in phases])
    cycle = plt.get_cmap("Dark2")
    for ax, win in zip(axes[0], windows, strict=False):
        def rel(spans: Sequence[Span], w: ZoomWindow = win) -> list[Span]:
            return [Span((s.start_s - w.t0_s) * 1e3, (s.end_s - w.t0_s) * 1e3, s.label,
                         s.depth) for s in spans if s.end_s >= w.t0_s and s.start_s <= w.t1_s]

        _shade(ax, rel(phases), rel(gaps), colors)
        for i, trace in enumerate(win.traces):
            shifted = Trace(f"{trace.label} ({trace.t_s.size} samples)", trace.unit,
                            (trace.t_s - win.t0_s) * 1e3, trace.mean)
            _draw_trace(ax, shifted, cycle(i % 8), marker=".")
        ax.set_xlim(0, (win.t1_s - win.t0_s) * 1e3)
        ax.set_title(win.title, fontsize=9)
        ax.set_xlabel(f"time from {win.t0_s:.3f} s (ms)")
        ax.set_ylabel("power (W)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    return fig


def energy_bars_figure(phase_names: Sequence[str], sources: Sequence[str],
                       energy_j: npt.NDArray[np.float64]) -> Figure:
    """Grouped bars: energy of each phase name (summed over its instances) per source."""
    n_phase, n_src = len(phase_names), max(1, len(sources))
    fig, ax = plt.subplots(figsize=(13, 3.2 + 0.1 * n_phase), layout="constrained")
    width = 0.8 / n_src
    x = np.arange(n_phase)
    cycle = plt.get_cmap("Dark2")
    for j, source in enumerate(sources):
        ax.bar(x + (j - (n_src - 1) / 2) * width, energy_j[:, j], width, label=source,
               color=cycle(j % 8))
    ax.set_xticks(x, list(phase_names), rotation=30 if n_phase > 6 else 0, ha="right"
                  if n_phase > 6 else "center", fontsize=8)
    ax.set_ylabel("energy (J)")
    ax.set_xlabel("phase (all instances of a name summed)")
    ax.set_title("Energy per phase and source")
    ax.grid(True, axis="y", alpha=0.3)
    if sources:
        ax.legend(fontsize=8)
    return fig


def calibration_figure(reference_w: FloatArray, target_w: FloatArray, *,
                       corrected_w: FloatArray | None = None, fit_text: str = "",
                       reference_label: str = "reference", target_label: str = "NVML") -> Figure:
    """NVML vs reference scatter with the identity line, and residuals before/after a fit."""
    fig, (ax, res_ax) = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained")
    ax.scatter(reference_w, target_w, s=3, alpha=0.4, label=f"{target_label} as read")
    if corrected_w is not None:
        ax.scatter(reference_w, corrected_w, s=3, alpha=0.4, label="corrected")
    both = np.concatenate([reference_w, target_w]) if reference_w.size else np.zeros(1)
    lo, hi = float(np.nanmin(both)), float(np.nanmax(both))
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=1, ls="--", label="identity")
    ax.set_xlabel(f"{reference_label} power (W)")
    ax.set_ylabel(f"{target_label} power (W)")
    ax.set_title("NVML vs reference")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    res_ax.scatter(reference_w, target_w - reference_w, s=3, alpha=0.4, label="as read")
    if corrected_w is not None:
        res_ax.scatter(reference_w, corrected_w - reference_w, s=3, alpha=0.4,
                       label="corrected")
    res_ax.axhline(0, color="0.3", lw=1)
    res_ax.set_xlabel(f"{reference_label} power (W)")
    res_ax.set_ylabel("residual (W)")
    res_ax.set_title("Residuals")
    res_ax.legend(fontsize=8)
    res_ax.grid(True, alpha=0.3)
    if fit_text:
        fig.suptitle(fit_text, fontsize=9)
    return fig


def model_curves_figure(x: FloatArray, measured: FloatArray, curves: dict[str, FloatArray],
                        x_grid: FloatArray, *, x_label: str, y_label: str,
                        optimum_x: float | None = None, loo_error: dict[str, float] | None = None
                        ) -> Figure:
    """Measured points, one curve per model (legend carries its LOO error), the optimum."""
    fig, ax = plt.subplots(figsize=(13, 4.2), layout="constrained")
    ax.scatter(x, measured, color="k", s=14, zorder=3, label="measured")
    for name, y in curves.items():
        err = (loo_error or {}).get(name)
        ax.plot(x_grid, y, lw=1.2, label=name if err is None else f"{name} (LOO {err:.1f} %)")
    if optimum_x is not None:
        ax.axvline(optimum_x, color=GAP_COLOR, ls="--", lw=1, label=f"optimum {optimum_x:g}")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def save_png(fig: Figure, path: str, dpi: int = 110) -> bytes:
    """Write the figure to ``path`` and return the PNG bytes (for embedding); closes it."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    data = buffer.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return data
