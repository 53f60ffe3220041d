"""`record`: a stated maximum of simulated GPUs; a summary that reports, not crashes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import RunningRecorder, descriptor
from wattlab.acquisition.session import SessionResult
from wattlab.cli import main
from wattlab.commands import record
from wattlab.samples import SampleBatch
from wattlab.sync.bus.publisher import BusPublisher


@pytest.mark.fast
def test_too_many_simulated_gpus_is_refused_up_front(tmp_path, capsys):
    out = tmp_path / "run.h5"
    code = main(["record", "--simulate", "--simulated-gpus", "100000", "--duration", "1",
                 "-o", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--simulated-gpus must be 1 to {record.MAX_SIMULATED_GPUS}, got 100000" in err
    assert not out.exists()


@pytest.mark.system
def test_a_stream_whose_times_go_backwards_does_not_crash_the_summary(tmp_path, capsys):
    path = str(tmp_path / "run.h5")
    rec = RunningRecorder(path, flush_interval_s=0.05)
    pub = BusPublisher(rec.endpoint)
    for name, t in (("good", [1_000, 2_000, 3_000]), ("gpu0.power", [3_000, 1_000, 2_000])):
        pub.announce(descriptor(name))
        pub.send_batch(SampleBatch(name, 0, np.array(t, dtype=np.int64),
                                   np.full((3, 2), 100, dtype="<f4")))
        pub.end(name, 0)
    pub.close()
    rec.stop()
    record.report(SessionResult(path, 0, {}, {}, interrupted=False))
    captured = capsys.readouterr()
    assert f"run file: {path}" in captured.out
    assert "no summary table" in captured.err
    assert "{'gpu0.power': {'time_backwards': 1}}" in captured.err
