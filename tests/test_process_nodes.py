"""Energy per process on a multi-node run: each GPU keyed by its node's stream prefix.

A Slurm/agent run names a node's streams ``NODE.gpu{i}.*`` (tests/process_runs.py writes
them so). Two nodes run different processes, some with the same pids: each must be split on
its own node's power and counter, keyed and labelled with its node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.process_runs import (
    NODE1,
    NODE1_GAIN,
    PROCS,
    UNIX0_NS,
    write_gpu,
    write_processes,
    write_two_nodes,
)
from wattlab.analysis.attribution import energy_by_process
from wattlab.cli import main
from wattlab.runfile import Run
from wattlab.runfile.writer import RunFileWriter

pytestmark = pytest.mark.fast

def test_each_nodes_gpu_is_split_on_its_own_streams_keyed_by_node(tmp_path: Path):
    with Run(str(write_two_nodes(tmp_path / "r.h5"))) as run:
        result = energy_by_process(run)
    assert [g.prefix for g in result.gpus] == ["node0.gpu0", "node1.gpu0"]
    assert result.missing == []
    for g, procs, gain in zip(result.gpus, (PROCS, NODE1), (1.0, NODE1_GAIN), strict=True):
        assert f"the energy counter {g.prefix}.energy:energy_j" in g.total_how
        assert g.stream.name == f"{g.prefix}.samples:power_w"
        got = {p.identity["pid"]: p for p in g.processes}
        assert set(got) == {q.pid for q in procs}
        for q in procs:
            p = got[q.pid]
            assert p.dynamic_j == pytest.approx(q.truth_j() * gain, rel=0.01)
            assert p.key == f"{g.prefix}:{q.pid}" and p.identity["node"] == g.node
            assert p.label.startswith(f"{g.prefix}:{q.pid}")
        parts = sum(p.energy_j for p in g.processes) + g.static_j + g.idle_j + g.unattributed_j
        assert parts == pytest.approx(g.total_j, rel=1e-3)
    assert result.gpus[1].to_json()["node"] == "node1"
    assert len({p.key for p in result.processes}) == len(result.processes)  # two pid 101s


def test_by_job_sums_a_job_over_nodes_and_text_names_the_node(tmp_path: Path, capsys):
    path = str(write_two_nodes(tmp_path / "r.h5"))
    assert main(["energy", path, "--by-job", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["groups"]["rows"]}
    assert rows["4711"]["processes"] == 2  # one on each node
    assert rows["4711"]["dynamic_j"] == pytest.approx(
        PROCS[0].truth_j() + NODE1[1].truth_j() * NODE1_GAIN, rel=0.01)
    assert main(["energy", path, "--by-process"]) == 0
    out = capsys.readouterr().out
    assert "node1.gpu0: " in out and "node1.gpu0:101 infer" in out and "node0.gpu0:101 train" in out


def test_a_node_without_a_process_stream_says_so_and_the_other_is_split(tmp_path: Path):
    with Run(str(write_two_nodes(tmp_path / "r.h5", node1_processes=False))) as run:
        result = energy_by_process(run)
    assert [g.prefix for g in result.gpus] == ["node0.gpu0"]
    assert result.missing == [f"node1.gpu0: no node1.gpu0.processes stream in {tmp_path}/r.h5 "
                              "(recorded before per-process recording existed, or with it off)"]


def test_a_node_named_like_a_gpu_is_still_a_node(tmp_path: Path):
    # agents may be named after their hosts: a host called gpu7 has streams gpu7.gpu0.*
    w = RunFileWriter(str(tmp_path / "r.h5"),
                      {"created": "test", "session_start_unix_ns": UNIX0_NS}, 0)
    write_gpu(w, 0, PROCS, {"missing": {}}, 1.0, "gpu7")
    write_processes(w, PROCS, None, 0, "gpu7")
    w.close()
    with Run(str(tmp_path / "r.h5")) as run:
        result = energy_by_process(run)
    assert [g.prefix for g in result.gpus] == ["gpu7.gpu0"] and result.missing == []
