"""A second model of a shared GPU, measured beside the activity rule: the power as a mix.

On a time-sliced GPU the driver names one process per utilisation sample (with the
device's utilisation), so the per-process rows say little of how the GPU's time was split.
This model ignores them: where two processes overlap, the GPU is taken to run one at a
time, so the mean dynamic power there is ``f * P_a + (1 - f) * P_b``, with ``P_a`` and
``P_b`` each one's dynamic power where it worked alone **in the shared run itself** (the
first before the second was released, the longer after the shorter ended: a staggered
run has both). ``f`` follows from the measured power; each process gets its lone energy
plus its part of the overlap. A pair without both lone stretches is reported, not split.
Truth: each one's exclusive dynamic energy as a share of the pair's (``shared_gpu_truth``).
It is a measurement of what the power alone can tell, not a rule of the product. Usage:

    python bench/power_mix_pairs.py TRACE [TRACE ...]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common import doc_parser, write_json
from shared_gpu_truth import Pair, SharedRun, exclusive_j, pairs_of
from wattlab.errors import WattlabError

MIN_LONE_S = 0.3  # a lone stretch shorter than this gives no lone power


def lone_spans(pair: Pair) -> dict[str, tuple[int, int]]:
    """Each workload's lone stretch in the shared run: before the other began, after it ended."""
    first, second = sorted(pair.works, key=lambda w: w.begin_ns)
    early, late = sorted(pair.works, key=lambda w: w.end_ns)
    spans = {first.payload["workload"]: (first.begin_ns, second.begin_ns)}
    after = (early.end_ns, late.end_ns)
    name = late.payload["workload"]
    if name not in spans or after[1] - after[0] > spans[name][1] - spans[name][0]:
        spans[name] = after
    return spans


def mix_shares(shared: SharedRun, pair: Pair) -> dict[str, Any]:
    """The pair's shares by the power mix, or why it cannot split it."""
    spans = lone_spans(pair)
    power_w = {n: shared.dynamic_j(a, b) / ((b - a) / 1e9) for n, (a, b) in spans.items()
               if (b - a) / 1e9 >= MIN_LONE_S}
    overlap = (max(w.begin_ns for w in pair.works), min(w.end_ns for w in pair.works))
    overlap_s = (overlap[1] - overlap[0]) / 1e9
    a, b = pair.names
    if a not in power_w or b not in power_w or overlap_s <= 0 or power_w[a] == power_w[b]:
        return {"split": False, "lone_w": power_w, "overlap_s": overlap_s}
    energy_j = {n: shared.dynamic_j(*spans[n]) if n in power_w else 0.0 for n in pair.names}
    mean_w = shared.dynamic_j(*overlap) / overlap_s
    f = float(np.clip((mean_w - power_w[b]) / (power_w[a] - power_w[b]), 0.0, 1.0))
    parts = np.array([f * power_w[a], (1 - f) * power_w[b]]) * overlap_s
    parts *= shared.dynamic_j(*overlap) / parts.sum()
    energy_j[a] += float(parts[0])
    energy_j[b] += float(parts[1])
    total = sum(energy_j.values())
    return {"split": True, "lone_w": power_w, "overlap_s": overlap_s, "f": f,
            "overlap_w": mean_w, "share": [energy_j[n] / total for n in pair.names]}


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    rows = []
    print(f"{'trace':28} {'pair':14} {'truth':>13} {'mix':>13} {'abs pt':>12} {'rel % (2nd)':>11}")
    for path in args.traces:
        try:
            shared = SharedRun(path)
            pairs = pairs_of(shared, exclusive_j(shared))
        except (WattlabError, KeyError, ValueError) as e:
            parser.error(f"{path}: not a shared_gpu.py pairs recording ({e})")
        if not pairs:
            parser.error(f"{path}: no pairs run together (a shared_gpu.py pairs recording)")
        for _, pair in pairs:
            got = mix_shares(shared, pair)
            row = {"trace": path, "pair": "+".join(pair.names), "truth": pair.truth.tolist(),
                   **got}
            rows.append(row)
            head = f"{path.rsplit('/', 1)[-1]:28} {row['pair']:14} " \
                   f"{pair.truth[0]:6.3f} {pair.truth[1]:6.3f}"
            if not got["split"]:
                print(f"{head}  not split: lone power of {sorted(got['lone_w'])} only")
                continue
            share = np.array(got["share"])
            pt, rel = 100 * (share - pair.truth), 100 * (share[1] / pair.truth[1] - 1)
            print(f"{head} {share[0]:6.3f} {share[1]:6.3f} {pt[0]:+5.1f} {pt[1]:+5.1f} "
                  f"{rel:+10.1f}   f {got['f']:.2f}, lone {got['lone_w'][pair.names[0]]:.0f} / "
                  f"{got['lone_w'][pair.names[1]]:.0f} W, overlap {got['overlap_w']:.0f} W "
                  f"over {got['overlap_s']:.1f} s")
    print(f"wrote {write_json('power_mix_pairs', {'pairs': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
