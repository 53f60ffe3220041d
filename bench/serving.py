"""Issue 40's goals on the simulated LLM server: J/token, each request's share, the sums.

    python bench/serving.py                    # 60 requests (~30 s, real time)
    python bench/serving.py --requests 120 --seed 4

Runs `wattlab demo --serving` (the simulated server on the simulated GPU, its vLLM counters
scraped at 10 Hz, its request log imported into the run), then sets the analysis of that run
against the simulator's truth (docs/scrape.md, "The simulated server"):

- J/token over the serving phase (`energy --per token`) against the truth's: the GPU's true
  energy over the serving span / tokens generated. Goal: within 1 %.
- Each request's share of the dynamic energy (`energy --by-request`, with each of its rules:
  `alone`, the default, and `in-flight`) against its share by the truth: the energy the
  simulator spends on that request alone at the same settings. Goal: every request within
  10 % (relative) of its truth share.
- Sum of the requests + unattributed + idle = total: goal 0.1 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import wattlab
from common import write_json

GOAL_J_PER_TOKEN = 0.01
GOAL_SHARE = 0.10
GOAL_CLOSURE = 0.001


def record(folder: Path, requests: int, seed: int) -> tuple[Path, dict[str, Any], int]:
    """The demo's run file, its truth and its exit status."""
    run = folder / "serving.h5"
    done = subprocess.run([sys.executable, "-m", "wattlab.cli", "demo", "--serving",
                           "--requests", str(requests), "--seed", str(seed), "-o", str(run)],
                          capture_output=True, text=True)
    if not run.exists():
        raise SystemExit(f"demo --serving failed:\n{done.stdout}{done.stderr}")
    return run, json.loads((folder / "serving.truth.json").read_text()), done.returncode


def analyse(run: Path, truth: dict[str, Any], rule: str) -> dict[str, Any]:
    """The analysis's figures (requests shared by ``rule``) beside the truth's."""
    from wattlab.analysis.attribution import energy_by_request, energy_per_unit

    with wattlab.open(str(run)) as r:
        per_unit = energy_per_unit(r, "token")
        by_request = energy_by_request(r, rule=rule)
    (serving,) = [row for row in per_unit.rows if row.phase == "serving"]
    measured = {q.id: q.energy_j for q in by_request.requests}
    alone = {q["id"]: q["alone_dynamic_j"] for q in truth["requests"]}
    total_m, total_t = sum(measured.values()), sum(alone.values())
    shares = {i: {"share": measured[i] / total_m, "truth_share": alone[i] / total_t}
              for i in alone}
    for s in shares.values():
        s["rel_error"] = s["share"] / s["truth_share"] - 1
    att = by_request.attribution
    return {
        "j_per_token": serving.j_per_unit, "j_per_token_pm": serving.j_per_unit_pm,
        "tokens": serving.units, "energy_j": serving.energy_j,
        "j_per_token_error": serving.j_per_unit / truth["j_per_token"] - 1,
        "shares": shares,
        "worst_share_error": max(abs(s["rel_error"]) for s in shares.values()),
        "median_share_error": float(np.median([s["rel_error"] for s in shares.values()])),
        "closure_j": att.closure_j, "total_j": att.total_j,
        "closure_rel": abs(att.closure_j) / att.total_j,
        "attributed_j": sum(att.parts_j.values()), "idle_j": att.idle_j,
        "unattributed_j": att.unattributed_j, "rule": att.rule.to_json(),
    }


def main() -> None:
    from wattlab.analysis.attribution.by_request import REQUEST_RULES

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run, truth, status = record(Path(tmp), args.requests, args.seed)
        by_rule = {rule: analyse(run, truth, rule) for rule in REQUEST_RULES}
    print(f"simulated server: {args.requests} requests (seed {args.seed}), "
          f"{truth['serving_span_s']:.1f} s of serving, {truth['generation_tokens']} tokens; "
          f"demo exit status {status}")
    print(f"truth: {truth['j_per_token']:.4f} J/token ({truth['energy_j']:.1f} J over the "
          f"serving span), {truth['dynamic_j_per_token']:.4f} J/token above idle")
    got = by_rule[REQUEST_RULES[0]]
    rows = [("J/token, serving phase", f"{got['j_per_token']:.4f} ± {got['j_per_token_pm']:.4f}",
             f"{truth['j_per_token']:.4f}", f"{100 * got['j_per_token_error']:+.2f} %",
             "1 %", abs(got["j_per_token_error"]) <= GOAL_J_PER_TOKEN)]
    for rule, g in by_rule.items():
        rows += [(f"shares ({rule}), worst", f"median {100 * g['median_share_error']:+.1f} %",
                  "", f"{100 * g['worst_share_error']:.1f} %", "10 %",
                  g["worst_share_error"] <= GOAL_SHARE),
                 (f"sum = total ({rule})", f"{g['closure_j']:+.3g} J", f"{g['total_j']:.1f} J",
                  f"{100 * g['closure_rel']:.4f} %", "0.1 %", g["closure_rel"] <= GOAL_CLOSURE)]
    print(f"{'figure':26} {'analysis':>18} {'truth':>10} {'error':>9} {'goal':>6}  met")
    for name, a, t, err, goal, met in rows:
        print(f"{name:26} {a:>18} {t:>10} {err:>9} {goal:>6}  {'yes' if met else 'NO'}")
    for rule, g in by_rule.items():
        errors = sorted(g["shares"].items(), key=lambda kv: -abs(kv[1]["rel_error"]))[:3]
        print(f"largest share errors ({rule}): " + ", ".join(
            f"{i} {100 * s['share']:.2f} % vs {100 * s['truth_share']:.2f} %" for i, s in errors))
    write_json("serving", {"requests": args.requests, "seed": args.seed, "exit_status": status,
                           "truth": truth, "analysis": by_rule,
                           "goals": {"j_per_token": GOAL_J_PER_TOKEN, "share": GOAL_SHARE,
                                     "closure": GOAL_CLOSURE}})


if __name__ == "__main__":
    main()
