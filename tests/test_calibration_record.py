"""The typed calibration record (issue 35): its JSON is the document `calibrate` always made.

Why these tests: the record is stored in run files that outlive the code, so every stored
record must load, a round trip must not change a value or a key, and a damaged record must
say which file, which record and which key, not fail somewhere in the energy fusion.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest

from tests.data_files import DATA
from wattlab.errors import RunFileError
from wattlab.runfile import CalibrationRecord, Identifiability, read_calibrations, schema

pytestmark = pytest.mark.fast

STORED = DATA / "traces" / "h100_excite-seed1.h5"
AVERAGE = "gpu0.power:average_power_w"
RECORD_KEYS = ["format", "key", "target", "reference", "run", "created", "convention", "kernel",
               "params", "effective_delay_s", "energy_delay_s", "cross_correlation_lag",
               "identifiable", "warnings", "advice", "profiles", "update_period_s",
               "update_period_se_s", "held_readings", "update_times", "poll_delay_s",
               "coverage", "fit", "kernels", "power_dependent_gain", "energy"]
ISSUE_20_KEYS = ("identifiable", "warnings", "advice", "profiles", "update_period_se_s")


def _stored_documents(path: Path) -> dict[str, dict[str, object]]:
    """The raw JSON of each calibration stored in a run file, by group name."""
    with h5py.File(path, "r") as f:
        group = f.get(f"{schema.ANALYSIS}/{schema.CALIBRATION}")
        return {} if group is None else {k: json.loads(group[k].attrs[schema.RECORD_JSON])
                                         for k in group}


def test_a_real_record_survives_a_round_trip_unchanged() -> None:
    doc = _stored_documents(STORED)[AVERAGE]
    record = CalibrationRecord.from_json(doc)
    assert record.to_json() == doc
    assert list(record.to_json()) == RECORD_KEYS  # `calibrate --json` prints them in this order
    assert CalibrationRecord.from_json(record.to_json()) == record
    assert record.where == AVERAGE and record.params.width_name == "w_s"
    assert record.params.pinned().keys() == {"tau_s", "w_s", "gain", "offset_w"}


def test_every_calibration_stored_in_the_test_data_loads() -> None:
    loaded = 0
    for path in sorted(DATA.rglob("*.h5")):
        docs = _stored_documents(path)
        records = read_calibrations(str(path))
        assert [r.to_json() for r in records] == list(docs.values()), path.name
        loaded += len(records)
    assert loaded >= 4  # the excite traces each store the average and the instant reading


def test_a_record_made_before_issue_20_loads_with_the_documented_defaults() -> None:
    doc = _stored_documents(STORED)[AVERAGE]
    old = {k: v for k, v in doc.items() if k not in ISSUE_20_KEYS}
    record = CalibrationRecord.from_json(old)
    assert record.verdict == Identifiability(identifiable=True, warnings=(), advice="")
    assert record.profiles is None and record.update_period_se_s is None
    assert record.params == CalibrationRecord.from_json(doc).params


@pytest.mark.parametrize(("drop", "named"), [(("energy_delay_s",), "energy_delay_s"),
                                              (("params", "gain"), "params.gain"),
                                              (("energy", "by_length"), "energy.by_length")])
def test_a_stored_record_missing_a_required_key_names_file_record_and_key(
        tmp_path: Path, drop: tuple[str, ...], named: str) -> None:
    path = tmp_path / "run.h5"
    shutil.copy(STORED, path)
    with h5py.File(path, "r+") as f:
        attrs = f[f"{schema.ANALYSIS}/{schema.CALIBRATION}/{AVERAGE}"].attrs
        doc = json.loads(attrs[schema.RECORD_JSON])
        parent = doc
        for key in drop[:-1]:
            parent = parent[key]
        del parent[drop[-1]]
        attrs[schema.RECORD_JSON] = json.dumps(doc, sort_keys=True)
    with pytest.raises(RunFileError) as caught:
        read_calibrations(str(path))
    message = str(caught.value)
    assert str(path) in message and AVERAGE in message and named in message
