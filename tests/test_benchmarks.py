"""The benchmark suite runs (quick mode) and every benchmark meets its zero-loss checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_run_all_quick_regenerates_the_summary():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all"), "--quick"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (ROOT / "bench" / "results" / "summary.md").read_text()
    for name in ("ingest", "decode", "ps3_stream", "visa", "sync", "analysis_scale"):
        assert f"| {name} |" in summary
