"""One recording per node under a launcher: local rank 0 and a node lock, never one per rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wattlab.integrations.ranks import node_recorder

JOB = Path(__file__).with_name("ddp_job.py")


@pytest.mark.fast
def test_only_local_rank_zero_holding_the_lock_records(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with node_recorder(str(tmp_path)) as election:
        assert not election.records and "LOCAL_RANK=1" in election.why
    monkeypatch.setenv("LOCAL_RANK", "0")
    with node_recorder(str(tmp_path)) as first:
        assert first.records
        monkeypatch.delenv("LOCAL_RANK")  # a second launcher of the job on this node
        with node_recorder(str(tmp_path)) as second:
            assert not second.records and "held" in second.why
    with node_recorder(str(tmp_path)) as again:  # released at the end of the recording
        assert again.records


@pytest.mark.fast
def test_a_bad_local_rank_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCAL_RANK", "zero")
    from wattlab.errors import UsageError

    with pytest.raises(UsageError, match="LOCAL_RANK='zero'"), node_recorder(str(tmp_path)):
        pass


@pytest.mark.system
@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="torchrun (torch) is not installed: pip install torch")
def test_torchrun_four_ranks_record_the_node_once(tmp_path):
    out = tmp_path / "job.h5"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "TORCHELASTIC_RUN_ID": f"test-{os.getpid()}"}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "4", "-m", "wattlab.cli", "record",
         "--per-node", "-o", str(out), "--simulate", "--simulated-gpus", "4", "--live",
         "--no-live", "--", sys.executable, str(JOB), "3", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1", "rank2",
                                                              "rank3"]
    recorded = [p for p in tmp_path.glob("rank*") if p.read_text().split("\n")[0]]
    assert len(recorded) == 1  # one rank ran under the session; three ran bare
    assert done.stderr.count("local rank 0 records this node") == 3
    report = subprocess.run([sys.executable, "-m", "wattlab.cli", "energy", str(out), "--node",
                             "--json"], env=env, capture_output=True, text=True, check=True)
    (node,) = json.loads(report.stdout)["nodes"]
    gpus = [p for p in node["parts"] if p["part"].startswith("gpu")]
    assert [p["part"] for p in gpus] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert node["measured_j"] == pytest.approx(sum(p["energy_j"] for p in gpus), rel=1e-9)
