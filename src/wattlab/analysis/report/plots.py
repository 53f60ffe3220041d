"""Figures of runs and sweeps, as plain functions of arrays.

Power timeline with phases and gaps, sample-level zooms, energy bars, NVML calibration
scatter and residuals, model curves of a sweep.

Every function takes plain arrays / small dataclasses and returns a matplotlib Figure, so
the HTML report, a notebook and other analyses (calibration, models) draw the same
pictures. The Agg backend is selected on import: no display is ever needed.
"""

from __future__ import annotations

import io
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
    fig, axes = plt.subplots(1, n, figsize=(13, 4.2), squeeze=False, layout="constrained")
    colors = _phase_colors([p.label for p in phases])
    cycle = plt.get_cmap("Dark2")
    for ax, win in zip(axes[0], windows, strict=False):
        def rel(spans: Sequence[Span], w: ZoomWindow = win) -> list[Span]:
            return [Span((s.start_s - w.t0_s) * 1e3, (s.end_s - w.t0_s) * 1e3, s.label,
                         s.depth) for s in spans if s.end_s >= w.t0_s and s.start_s <= w.t1_s]

        _shade(ax, rel(phases), rel(gaps), colors)
        for i, trace in enumerate(win.traces):
            shifted = Trace(trace.label, trace.unit, (trace.t_s - win.t0_s) * 1e3, trace.mean)
            _draw_trace(ax, shifted, cycle(i % 8), marker=".")
        ax.set_xlim(0, (win.t1_s - win.t0_s) * 1e3)
        ax.set_title(win.title, fontsize=9)
        ax.set_xlabel(f"time from {win.t0_s:.3f} s (ms)")
        ax.set_ylabel("power (W)")
        ax.grid(True, alpha=0.3)
    if windows and windows[0].traces:
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=min(5, len(labels)),
                   fontsize=8, frameon=False)
    return fig


def energy_bars_figure(phase_names: Sequence[str], sources: Sequence[str],
                       energy_j: FloatArray, spread_j: FloatArray | None = None,
                       count: npt.NDArray[np.int64] | None = None) -> Figure:
    """Grouped bars: energy of one instance of each phase name per source (NaN: no bar).

    Phases differ by orders of magnitude (a whole run, a 0.2 s step), so the axis is
    logarithmic when they do; ``count`` labels each bar with its number of instances.
    """
    n_phase, n_src = len(phase_names), max(1, len(sources))
    fig, ax = plt.subplots(figsize=(13, 3.6 + 0.1 * n_phase), layout="constrained")
    width = 0.8 / n_src
    x = np.arange(n_phase)
    cycle = plt.get_cmap("Dark2")
    for j, source in enumerate(sources):
        err = None if spread_j is None else spread_j[:, j]
        at = x + (j - (n_src - 1) / 2) * width
        ax.bar(at, energy_j[:, j], width, label=source, color=cycle(j % 8), yerr=err,
               capsize=2, error_kw={"lw": 0.8})
        for xi, e, n in zip(at, energy_j[:, j], count[:, j] if count is not None else [],
                            strict=False):
            if np.isfinite(e) and n > 1:
                ax.text(xi, e, f"n={n}", ha="center", va="bottom", fontsize=6, color="0.3")
    finite = energy_j[np.isfinite(energy_j) & (energy_j > 0)]
    if finite.size and finite.max() > 50 * finite.min():
        ax.set_yscale("log")
    tilt = n_phase > 6
    ax.set_xticks(x, list(phase_names), rotation=30 if tilt else 0,
                  ha="right" if tilt else "center", fontsize=8)
    ax.set_ylabel("energy per instance (J)")
    ax.set_xlabel("phase (mean over its instances; error bar: spread over instances)")
    ax.grid(True, axis="y", alpha=0.3)
    if sources:
        ax.legend(fontsize=8, ncols=min(3, n_src))
    return fig


def calibration_figure(t_s: FloatArray, seen_w: FloatArray, target_w: FloatArray, *,
                       gain: float, offset_w: float, fit_text: str = "",
                       reference_label: str = "reference", target_label: str = "NVML") -> Figure:
    """NVML readings vs the reference seen through the fitted kernel, the fit, residuals."""
    fig, (ax, res_ax) = plt.subplots(1, 2, figsize=(13, 4.6), layout="constrained",
                                     gridspec_kw={"width_ratios": [1.0, 1.4]})
    ok = np.isfinite(seen_w) & np.isfinite(target_w)
    ax.scatter(seen_w[ok], target_w[ok], s=6, alpha=0.5, color="C0",
               label=f"{ok.sum()} of {ok.size} readings (others: reference gaps or edges)")
    if ok.any():
        lo = float(min(seen_w[ok].min(), target_w[ok].min()))
        hi = float(max(seen_w[ok].max(), target_w[ok].max()))
        line = np.array([lo, hi])
        ax.plot(line, line, color="0.4", lw=1, ls=":", label="identity")
        if np.isfinite(gain) and np.isfinite(offset_w):
            ax.plot(line, gain * line + offset_w, color=GAP_COLOR, lw=1.2,
                    label=f"fit: {gain:.4f} x + {offset_w:.1f} W")
    else:
        ax.text(0.5, 0.5, "no reading with reference coverage", ha="center",
                transform=ax.transAxes, color="0.4")
    ax.set_xlabel(f"{reference_label} through the fitted kernel (W)")
    ax.set_ylabel(f"{target_label} (W)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    resid = target_w - (gain * seen_w + offset_w)
    res_ax.plot(t_s[ok], resid[ok], ".", ms=3, color="C0")
    res_ax.axhline(0, color="0.3", lw=1)
    res_ax.set_xlabel("time since session start (s)")
    res_ax.set_ylabel("residual: reading − fit (W)")
    res_ax.grid(True, alpha=0.3)
    if ok.any():
        rms = float(np.sqrt(np.mean(resid[ok] ** 2)))
        res_ax.set_title(f"residuals, {rms:.2f} W rms", fontsize=9, loc="left")
    if fit_text:
        fig.suptitle(fit_text, fontsize=9)
    return fig


@dataclass
class SweepCurves:
    """One workload of a sweep: the runs, and (time, power) curves per model family."""

    x: FloatArray
    time_s: FloatArray
    power_w: FloatArray
    x_grid: FloatArray
    curves: dict[str, tuple[FloatArray, FloatArray]]
    mape_pct: dict[str, dict[str, float]]
    chosen: str
    objective: str
    chosen_points: tuple[FloatArray, FloatArray] | None = None
    """The chosen family's objective at the settings, when it has no curve (boosted)."""


SWEEP_QUANTITIES = (("time", "runtime (s)"), ("power", "mean power (W)"),
                    ("energy", "energy (J)"), ("edp", "energy-delay product (J·s)"))


def sweep_models_figure(data: SweepCurves, *, x_label: str, title: str,
                        recommended_x: float | None = None, default_x: float | None = None,
                        measured_best_x: float | None = None) -> Figure:
    """Runtime, power, energy (and EDP when it is the objective) against the setting."""
    shown = [q for q in SWEEP_QUANTITIES if q[0] != "edp" or data.objective == "edp"]
    fig, axes = plt.subplots(1, len(shown), figsize=(13, 4.4), squeeze=False,
                             layout="constrained")
    measured = {"time": data.time_s, "power": data.power_w,
                "energy": data.time_s * data.power_w,
                "edp": data.time_s ** 2 * data.power_w}
    cycle = plt.get_cmap("tab10")
    for ax, (quantity, label) in zip(axes[0], shown, strict=True):
        for k, (family, (t, p)) in enumerate(data.curves.items()):
            y = {"time": t, "power": p, "energy": t * p, "edp": t * t * p}[quantity]
            err = data.mape_pct.get(family, {}).get(data.objective, float("nan"))
            chosen = family == data.chosen
            ax.plot(data.x_grid, y, color=cycle(k % 10), lw=2.4 if chosen else 1.0,
                    alpha=1.0 if chosen else 0.75, zorder=2 if chosen else 1,
                    label=f"{family}{' (chosen)' if chosen else ''}: {err:.1f} %")
        if data.chosen_points is not None and quantity == data.objective:
            err = data.mape_pct.get(data.chosen, {}).get(data.objective, float("nan"))
            ax.plot(*data.chosen_points, "s-", color="k", ms=4, lw=1.6,
                    label=f"{data.chosen} (chosen): {err:.1f} %")
        ax.scatter(data.x, measured[quantity], color="k", s=12, zorder=3, label="measured")
        if recommended_x is not None:
            ax.axvline(recommended_x, color=GAP_COLOR, ls="--", lw=1.2,
                       label=f"recommended {recommended_x:g}")
        if default_x is not None and default_x != recommended_x:
            ax.axvline(default_x, color="0.4", ls=":", lw=1.2, label=f"default {default_x:g}")
        if measured_best_x is not None and quantity == "energy":
            ax.set_title(f"measured best: {measured_best_x:g}", fontsize=9, loc="left")
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5),
                       frameon=False, title=f"LOO MAPE of {data.objective}",
                       title_fontsize=7)
    fig.suptitle(title, fontsize=10)
    return fig


def png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (written to files by the caller); closes it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()


def tuning_figure(t_s: FloatArray, energy_j: FloatArray, probe: npt.NDArray[np.int64],
                  used: npt.NDArray[np.bool_], labels: Sequence[str]) -> Figure:
    """Energy of every detected iteration over time, coloured by the setting in force.

    Hollow points: iterations not counted (they began before a change, or were the first
    after it). The search's story reads left to right: default, probes, the kept setting.
    """
    fig, ax = plt.subplots(figsize=(13, 4.0), layout="constrained")
    cycle = plt.get_cmap("tab10")
    for k, label in enumerate(labels):
        at = probe == k
        color = cycle(k % 10)
        ax.scatter(t_s[at & used], energy_j[at & used], s=10, color=color, label=label)
        ax.scatter(t_s[at & ~used], energy_j[at & ~used], s=10, facecolors="none",
                   edgecolors=color)
    ax.set_xlabel("time since session start (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.grid(True, alpha=0.3)
    if labels:
        ax.legend(fontsize=7, ncols=min(4, len(labels)), loc="upper right")
    return fig


def layers_figure(labels: Sequence[str], time_s: FloatArray, energy_j: FloatArray,
                  energy_se_j: FloatArray, *, intensity: FloatArray, ridge: float,
                  sm_mhz: FloatArray | None = None) -> Figure:
    """Per layer, in execution order: time, energy (± se), arithmetic intensity, SM clock.

    NaN time or energy: that layer was not measured (counts only).
    """
    panels = 4 if sm_mhz is not None else 3
    fig, axes = plt.subplots(panels, 1, figsize=(13, 1.9 * panels + 1.0), sharex=True,
                             layout="constrained")
    x = np.arange(len(labels))
    axes[0].bar(x, time_s * 1e3, color="#4c72b0")
    axes[0].set_ylabel("time (ms)")
    axes[1].bar(x, energy_j * 1e3, yerr=energy_se_j * 1e3, color="#dd8452", ecolor="k")
    axes[1].set_ylabel("energy (mJ)")
    axes[2].bar(x, intensity, color=np.where(intensity >= ridge, "#c44e52", "#55a868"))
    axes[2].axhline(ridge, color="k", lw=0.8, ls="--", label=f"ridge {ridge:.3g} FLOP/B")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("FLOP/byte")
    axes[2].legend(fontsize=7, loc="upper right")
    if sm_mhz is not None:
        axes[3].step(x, sm_mhz, where="mid", color="#8172b2")
        axes[3].set_ylabel("planned SM MHz")
    axes[-1].set_xticks(x, labels, rotation=90, fontsize=5 if len(labels) > 60 else 7)
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    return fig
