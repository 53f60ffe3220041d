"""One Slurm job's share of each GPU of a run: its processes, the others', the uncharged rest.

For the job summary of `wattlab slurm` (docs/fleet.md): on a shared GPU a job is charged
its own processes only (identity ``slurm_job`` equal to its id), with their ± and verdict;
other jobs' processes and processes with no job are figures of their own; static (a live
context with no kernel running), idle and the time no process worked are the GPU's, charged
to no job. A GPU without a per-process figure gets its reason, never a zero.
"""

from __future__ import annotations

from typing import Any

from wattlab.analysis.attribution.by_process import ByProcess, GpuSplit
from wattlab.analysis.attribution.process_view import GROUPS, Group, group_by

NO_JOB = (GROUPS["job"] or ("", ""))[1]  # the group of processes without a job
NOT_CHARGED = ("static (a live context while no kernel runs), idle and the time no process "
               "worked are the GPU's: charged to no job (`wattlab energy RUN --by-job --charge "
               "static,idle` charges them by presence)")


def share_of_job(result: ByProcess, job_id: str) -> dict[str, Any]:
    """Per GPU, the job's processes, other jobs', no job's, and what is charged to none.

    ``this_job`` sums the job over every GPU; it is None (with ``this_job_unknown``) where
    a GPU has no per-process figure, as the job's processes there are unknown.
    """
    gpus: list[dict[str, Any]] = [gpu_share(result, g, job_id) for g in result.gpus]
    gpus += [{"gpu": prefix, "reason": why}
             for prefix, why in zip(result.missing_gpus, result.missing, strict=True)]
    unknown = None
    if result.missing:
        unknown = (f"no per-process figure for {', '.join(result.missing_gpus)} (each "
                   "GPU's reason in 'gpus')")
    elif not result.gpus:
        unknown = "the run has no GPU"
    mine = None if unknown else next(
        (figures(grp, result, job_id) for grp in group_by(result, "job")
         if str(grp.name) == job_id), none_here(result))
    return {"job_id": job_id, "rule": result.rule, "not_charged": NOT_CHARGED,
            "this_job": mine, "this_job_unknown": unknown, "gpus": gpus}


def gpu_share(result: ByProcess, g: GpuSplit, job_id: str) -> dict[str, Any]:
    """One GPU's split by job (module doc)."""
    one = ByProcess(result.path, result.rule, result.charge, [g], [])
    groups = {str(grp.name): grp for grp in group_by(one, "job")}
    mine = groups.pop(job_id, None)
    no_job = groups.pop(NO_JOB, None)
    return {"gpu": g.prefix, "total_j": g.total_j, "total_how": g.total_how,
            "rule": g.rule.name, "rule_how": g.rule.description, "caveats": g.rule.caveats,
            "this_job": none_here(one) if mine is None else figures(mine, one, job_id),
            "other_jobs": {name: figures(grp, one, name) for name, grp in groups.items()},
            "no_job": None if no_job is None else figures(no_job, one, NO_JOB),
            "not_charged": {"static_j": float(g.static_j), "idle_j": float(g.idle_j),
                            "no_process_active_j": float(g.unattributed_j)}}


def figures(grp: Group, result: ByProcess, name: str) -> dict[str, Any]:
    """A group's energy with its ± and verdict, and why it is not valid where it is not."""
    reasons = sorted({why for p in result.processes
                      if str(p.identity.get("slurm_job") or NO_JOB) == name
                      for why in p.invalid_reasons})
    return {"processes": grp.processes, "energy_j": grp.energy_j, "pm_j": grp.pm_j,
            "dynamic_j": grp.dynamic_j, "static_j": grp.static_j, "idle_j": grp.idle_j,
            "valid": grp.valid, "invalid_reasons": reasons}


def none_here(result: ByProcess) -> dict[str, Any]:
    """A job with no process on these GPUs: a measured zero (their streams name none).

    Valid as the streams are: a gap in a per-process stream hides who ran then.
    """
    reasons = sorted({why for g in result.gpus for why in g.stream.invalid_reasons}
                     | {why for p in result.processes for why in p.invalid_reasons})
    return {"processes": 0, "energy_j": 0.0, "pm_j": 0.0, "dynamic_j": 0.0, "static_j": 0.0,
            "idle_j": 0.0, "valid": not reasons, "invalid_reasons": reasons}
