"""The run directory's names and layout, spelled once (`docs/contracts.md`, Run directory):

```
RUN_DIR/
  manifest.json                    # `residency.records.manifest` (and its seal: `.seal`)
  runs/<index:02d>-<arm>/          # one per measured service run
    client.json                    # `residency.records.client`
    service.log
    decisions-rank<r>.jsonl        # `residency.records.decisions`
    trace/                         # only when profiled
  tmp/, <run>/trace-raw/           # scratch while a run records; never part of the evidence
```

The record files' names belong to their formats (`residency.records`); here are the folders
and the plain names of the rest (no I/O but `enclosing_run`), so the command line can offer
`DESIGNS` as choices without loading the rest of the suite."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from residency.records.manifest import MANIFEST

RUNS = "runs"
SERVICE_LOG = "service.log"
TRACE = "trace"
TRACE_RAW = "trace-raw"  # the built-in service's raw profiler output, moved into TRACE
DESIGNS = ("profiled-pair", "alternating", "paired-profile", "consecutive", "aa")
PAIRED_DEFAULTS = (10, 5)
"""Unprofiled pairs and measured requests per run of the paired-profile notebook and of
`residency pair` for designs with pairs: one definition, so the two agree."""

__all__ = ["DESIGNS", "PAIRED_DEFAULTS", "RUNS", "SERVICE_LOG", "TRACE", "TRACE_RAW",
           "enclosing_run", "run_dir"]


def run_dir(index: int, arm: str) -> str:
    """The relative folder of measured service run `index` of `arm`: `runs/03-candidate`."""
    return f"{RUNS}/{index:02d}-{arm}"


def enclosing_run(path: str | Path) -> Path | None:
    """The run directory `path` lies in (or is): the nearest folder at or above it, its
    links resolved, that holds both ``manifest.json`` and ``runs/``; None outside any run."""
    here = Path(os.path.abspath(path))
    with contextlib.suppress(OSError, RuntimeError):  # a link loop: the path as given
        here = here.resolve()
    for folder in (here, *here.parents):
        if (folder / MANIFEST).is_file() and (folder / RUNS).is_dir():
            return folder
    return None
