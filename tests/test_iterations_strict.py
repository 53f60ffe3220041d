"""`iterations --strict` exits 1 where the stream's figure over the span is invalid (issue 37).

Without it the failed check is a warning and the exit status 0, as every analysis command
(docs/validity.md); the files are test_validity's: a 1 kHz meter, cut for 50 ms at 4 s.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_validity import _run
from wattlab.cli import main

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("strict", "cut", "status"),
                         [(False, True, 0), (True, True, 1), (True, False, 0)])
def test_strict_exits_1_on_an_invalid_span_only(tmp_path, capsys, strict, cut, status):
    t = np.arange(0, 10_001) * 0.001
    path = _run(tmp_path, meter_t_s=t[(t < 4.0) | (t > 4.05)] if cut else None)
    argv = ["iterations", str(path), "--source", "meter:power_w", "--markers", "none"]
    assert main(argv + (["--strict"] if strict else [])) == status
    out = capsys.readouterr().out
    assert ("warning: invalid (docs/validity.md): coverage:" in out) == cut
