"""Terminal text for sparse-sweep prediction (``wattlab fit --measured`` / ``--sparse``)."""

from __future__ import annotations

from wattlab.analysis.models import SparseEvaluation, SparseRecommendation


def _bound(max_slowdown: float | None) -> str:
    return "none" if max_slowdown is None else f"{max_slowdown:g}"


def format_evaluation(ev: SparseEvaluation, unit: str, top: int) -> str:
    """Rates over held-out workloads, then the picks of the first ``top`` workloads."""
    random = ev.choice == "random"
    draws = f", {ev.draws} draws (seed {ev.seed}), ± std over draws" if random else ""
    sd = ev.spread

    def rate(name: str, value: float) -> str:
        return f"{100 * value:.0f} %" + (f" ± {100 * sd[name]:.0f}" if ev.choice == "random"
                                         else "")

    lines = [f"{ev.origin}: each workload measured at k = {ev.k} settings ({ev.choice}{draws}), "
             f"objective {ev.objective}, max slowdown {_bound(ev.max_slowdown)}; "
             f"leave-one-workload-out over {len(ev.workloads)} workloads",
             f"  predicted best = measured best:  {rate('hit_rate', ev.hit_rate)}",
             f"  within one setting step:         "
             f"{rate('within_one_step_rate', ev.within_one_step_rate)}",
             f"  mean regret (objective):         {100 * ev.mean_regret:.2f} %"
             + (f" ± {100 * sd['mean_regret']:.2f}" if ev.choice == "random" else ""),
             f"  picks over the slowdown bound:   {rate('violation_rate', ev.violation_rate)}"]
    for r in ev.workloads[:top]:
        mark = "=" if r.hit else ("~" if r.within_one_step else "x")
        lines.append(f"  {mark} {r.workload}: measured {', '.join(f'{x:g}' for x in r.measured_x)}"
                     f" -> {r.recommended_x:g} {unit} (best {r.best_x:g}, regret "
                     f"{100 * r.regret:.1f} %, {r.neighbours} neighbours)")
    if len(ev.workloads) > top:
        lines.append(f"  ... {len(ev.workloads) - top} more (see --json)")
    return "\n".join(lines)


def format_recommendation(rec: SparseRecommendation, unit: str) -> str:
    """The pick, its predicted saving and the two uncertainty measures, then the curve."""
    lo, hi = rec.saving_interval
    lines = [f"{rec.origin}: {rec.workload} measured at "
             f"{', '.join(f'{x:g}' for x in rec.measured_x)} {unit}; objective "
             f"{rec.objective}, max slowdown {_bound(rec.max_slowdown)}",
             f"recommended {rec.recommended_x:g} {unit} (default {rec.default_x:g}): predicted "
             f"saving {100 * rec.predicted_saving:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] for "
             f"{100 * rec.predicted_slowdown:+.1f} % time",
             f"  from the {rec.neighbours} workload(s) whose curves fit the measured points best: "
             f"{', '.join(rec.neighbour_workloads)}",
             f"  bootstrap over workloads: same pick {100 * rec.bootstrap_agreement:.0f} %, "
             f"within one step {100 * rec.bootstrap_within_one_step:.0f} %",
             f"  backtest on {rec.backtest_workloads} other workloads measured at the same "
             f"settings: best {100 * rec.backtest_hit_rate:.0f} %, within one step "
             f"{100 * rec.backtest_within_one_step_rate:.0f} %",
             "  setting   time (s)   power (W)   objective"]
    for x, t, p, o in zip(rec.settings, rec.predicted_time_s, rec.predicted_power_w,
                          rec.predicted_objective, strict=True):
        tag = " measured" if x in rec.measured_x else ""
        tag += "  <- recommended" if x == rec.recommended_x else ""
        lines.append(f"  {x:7g} {t:10.4g} {p:11.4g} {o:11.4g}{tag}")
    return "\n".join(lines)
