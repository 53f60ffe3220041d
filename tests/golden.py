"""The golden snapshot: what the analysis commands print today, kept to prove a change kept it.

Why: a refactor that moves files, or a speed-up, must not move a number. Each case is a run
file whose bytes do not depend on the machine (seeded simulated runs written offline, and
every real trace and the demo recording in ``tests/data/``); for each, the JSON of
``info``, ``energy``, ``energy --by-marker``, ``calibrate`` and ``iterations`` is kept in
``tests/data/golden/<case>.json.gz`` (gzip: the largest holds 2000 training steps' phases).
``tests/test_golden.py`` compares today's output with it: every key kept must still be there
(new keys are free), strings and integers equal, floats within ``REL_TOL``. A change that
alters a number on purpose regenerates the snapshot in the same commit and says why:

    python -m tests.golden            # rewrite every case
    python -m tests.golden CASE ...   # rewrite some
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.data_files import DATA, H100_CAPTURE
from tests.sim_runs import write_sim_run
from wattlab.cli import main

GOLDEN = DATA / "golden"
ROOT = DATA.parent.parent
# Floats agree to this relative tolerance (or ABS_TOL near zero). A deliberate change of a
# figure moves it by far more; what stays under it is the order of floating-point operations
# (a BLAS build, a vectorised sum), which is not behaviour.
REL_TOL = 1e-6
ABS_TOL = 1e-9
# Values that name the moment, the process or the software that wrote a file, not the
# measurement: kept as keys, not compared, and blanked in the snapshot so that writing it
# again gives the same bytes.
VOLATILE_KEYS = frozenset({"created", "wattlab_version", "writer_json", "host", "command"})
VOLATILE = "<volatile>"
SIM_SEEDS = (3, 7)


@dataclass(frozen=True)
class Case:
    """One run file and the streams its commands are asked about."""

    name: str
    make: Callable[[Path], Path]  # a scratch folder -> the run file to read
    reference: str  # calibrate's trusted stream
    target: str  # calibrate's stream to calibrate
    power: str  # iterations' power stream

    def commands(self, run: str) -> dict[str, list[str]]:
        return {
            "info": ["info", "--json", run],
            "energy": ["energy", "--json", run],
            "energy_by_marker": ["energy", "--json", "--by-marker", run],
            "calibrate": ["calibrate", "--json", "--no-store", "--reference", self.reference,
                          "--target", self.target, run],
            "iterations": ["iterations", "--json", "--source", self.power, run],
        }


def _sim(seed: int) -> Callable[[Path], Path]:
    def make(scratch: Path) -> Path:
        path = scratch / f"sim-seed{seed}.h5"
        write_sim_run(path, seed=seed)
        return path
    return make


def _trace(path: Path) -> Callable[[Path], Path]:
    return lambda _scratch: path


def _imported_capture(scratch: Path) -> Path:
    path = scratch / "h100_nvml_seed11.h5"
    code, _, stderr = run_cli_in_process(["import", "nvml-npz", "-o", str(path), "--source", "h100",
                                str(H100_CAPTURE)])
    if code != 0:
        raise RuntimeError(f"importing {H100_CAPTURE} failed ({code}): {stderr}")
    return path


def cases() -> list[Case]:
    """Every golden case: the seeded simulated runs, then every recording in tests/data."""
    out = [Case(f"sim-seed{seed}", _sim(seed), "meter:power_w", "gpu0.power:average_power_w",
                "meter:power_w") for seed in SIM_SEEDS]
    out.append(Case("demo24", _trace(DATA / "demo" / "demo24.h5"), "ps3:power_total_w",
                    "gpu0.power:average_power_w", "gpu0.samples:power_w"))
    out.append(Case("h100_nvml_seed11", _imported_capture, "h100.samples:power_w",
                    "h100.average:average_power_w", "h100.samples:power_w"))
    out += [Case(path.stem, _trace(path), "gpu0.samples:power_w", "gpu0.power:average_power_w",
                 "gpu0.samples:power_w")
            for path in sorted((DATA / "traces").glob("*.h5"))]
    return out


def run_cli_in_process(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a wattlab command run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _parse(stdout: str) -> Any:
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        return stdout  # an error case prints no JSON: its text is the behaviour


def snapshot(case: Case, scratch: Path) -> dict[str, Any]:
    """Today's output of every command on ``case``, with machine-specific paths named."""
    run = case.make(scratch)
    result: dict[str, Any] = {}
    for key, argv in case.commands(str(run)).items():
        code, stdout, stderr = run_cli_in_process(argv)
        text = json.dumps({"exit": code, "stdout": _parse(stdout), "stderr": stderr})
        for path, name in ((str(run), "<run>"), (str(scratch), "<scratch>"),
                           (str(ROOT), "<repo>")):
            text = text.replace(json.dumps(path)[1:-1], name)
        result[key] = json.loads(text)
    return result


def _blank_volatile(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: VOLATILE if k in VOLATILE_KEYS else _blank_volatile(v)
                for k, v in data.items()}
    if isinstance(data, list):
        return [_blank_volatile(v) for v in data]
    return data


def _same_float(want: float, got: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def differences(want: Any, got: Any, where: str = "") -> Iterator[str]:
    """Where ``got`` departs from the snapshot ``want``: keys lost, values changed."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            yield f"{where}: was an object, now {type(got).__name__}"
            return
        for key, value in want.items():
            if key not in got:
                yield f"{where}.{key}: missing"
            elif key not in VOLATILE_KEYS:
                yield from differences(value, got[key], f"{where}.{key}")
    elif isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            size = len(got) if isinstance(got, list) else type(got).__name__
            yield f"{where}: was a list of {len(want)}, now {size}"
            return
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            yield from differences(w, g, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        if not _same_float(want, float(got)):
            yield f"{where}: {want!r} -> {got!r}"
    elif type(want) is not type(got) or want != got:
        yield f"{where}: {want!r} -> {got!r}"


def golden_path(case: Case) -> Path:
    return GOLDEN / f"{case.name}.json.gz"


def read(case: Case) -> Any:
    """A case's kept snapshot."""
    with gzip.open(golden_path(case), "rt") as f:
        return json.load(f)


def write(case: Case) -> Path:
    """Regenerate one case's snapshot (a deliberate change: say why in the commit)."""
    with tempfile.TemporaryDirectory() as scratch:
        data = _blank_volatile(snapshot(case, Path(scratch)))
    path = golden_path(case)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    # gzip without a name or time in its header: the same snapshot is the same bytes
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    return path


def _main(names: list[str]) -> int:
    chosen = [c for c in cases() if not names or c.name in names]
    unknown = set(names) - {c.name for c in chosen}
    if unknown:
        print(f"unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    for case in chosen:
        print(write(case))
    stale = set(GOLDEN.glob("*.json.gz")) - {golden_path(c) for c in cases()}
    for path in sorted(stale):
        path.unlink()
        print(f"removed {path.name} (no such case)")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
