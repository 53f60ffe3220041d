"""The request table of a run: ``/analysis/requests``, written by `wattlab import requests`.

One dataset per column (times in session seconds, NaN where a request had no first token)
and attributes saying where the log came from and how its times were mapped.
"""

from __future__ import annotations

import math
import os

import h5py
import numpy as np

from wattlab.analysis.attribution.request_log import Request, RequestLog
from wattlab.errors import RunFileError
from wattlab.runfile import Run, add_record, open_read_only, schema

WHERE = (schema.REQUESTS,)
COLUMNS = schema.REQUEST_COLUMNS


def write_requests(path: str, log_path: str, log: RequestLog) -> str:
    """Store ``log`` in the run file at ``path`` (replacing an older table); its group path."""
    def fill(group: h5py.Group) -> None:
        reqs = log.requests
        group.create_dataset(schema.REQUEST_ID, data=[r.id for r in reqs],
                             dtype=h5py.string_dtype())
        first_s = [math.nan if r.first_token_s is None else r.first_token_s for r in reqs]
        columns = ([r.start_s for r in reqs], first_s, [r.end_s for r in reqs],
                   [r.prompt_tokens for r in reqs], [r.output_tokens for r in reqs])
        for name, values in zip(COLUMNS, columns, strict=True):
            group[name] = np.array(values)  # floats stay float64, token counts int64
        group.attrs.update(dict(zip(schema.REQUEST_ATTRS, (
            os.path.basename(log_path), log.format, log.skipped, log.mapping), strict=True)))

    return add_record(path, WHERE, fill)


def read_requests(run: Run) -> tuple[list[Request], dict[str, str]] | None:
    """The run's request table and its attributes; None where it has none."""
    with open_read_only(run.path) as f:
        group = f.get("/".join(("", schema.ANALYSIS, *WHERE)))
        if group is None:
            return None
        try:
            ids = [x.decode() if isinstance(x, bytes) else str(x)
                   for x in group[schema.REQUEST_ID][()]]
            cols = [group[c][()] for c in COLUMNS]
            attrs = {k: str(v) for k, v in group.attrs.items()}
        except KeyError as e:
            raise RunFileError(f"{run.path}: the request table is incomplete ({e})") from e
    return [Request(i, float(a), None if math.isnan(b) else float(b), float(c), int(d), int(e))
            for i, a, b, c, d, e in zip(ids, *cols, strict=True)], attrs
