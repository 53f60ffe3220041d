"""A run's tables without the `frames` extra: an error that names the extra (issue 38).

docs/run-file.md's snippet (`run.to_pandas()`) stopped at a bare `ModuleNotFoundError:
No module named 'pandas'`. pandas and xarray are hidden here as on a core install.
"""

from __future__ import annotations

import sys

import pytest

import wattlab
from tests.data_files import data_file
from wattlab.analysis.alignment import aligned

DEMO = str(data_file("demo/demo24.h5"))


@pytest.mark.fast
@pytest.mark.parametrize(("module", "call", "wanted_by"), [
    ("pandas", lambda run: run.to_pandas(), "to_pandas()"),
    ("xarray", lambda run: run.source("gpu0.samples").to_xarray(), "to_xarray()"),
    ("pandas", lambda run: aligned(run, 10.0, "gpu0.samples").to_pandas(), "to_pandas()"),
])
def test_a_missing_frames_package_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                  module: str, call, wanted_by: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what `import` finds on a core install
    with wattlab.open(DEMO) as run, pytest.raises(ModuleNotFoundError) as caught:
        call(run)
    assert wanted_by in str(caught.value) and f"needs {module}" in str(caught.value)
    assert "pip install 'wattlab[frames]'" in str(caught.value)
    assert caught.value.name == module
