"""The run directory's names and layout, spelled once (`docs/contracts.md`, Run directory):

```
RUN_DIR/
  manifest.json
  runs/<index:02d>-<arm>/          # one per measured service run
    client.json
    service.log
    decisions-rank<r>.jsonl        # the decisions JSONL of `residency.policy.cache`
    trace/                         # only when profiled
  tmp/, <run>/trace-raw/           # scratch while a run records; never part of the evidence
```

Everything here is a plain name (no I/O), so the command line can offer `DESIGNS` as choices
without loading the rest of the suite."""

from __future__ import annotations

from residency.policy.cache import DECISIONS_GLOB, decisions_file

SCHEMA = "residency.run/1"
MANIFEST = "manifest.json"
RUNS = "runs"
CLIENT = "client.json"
SERVICE_LOG = "service.log"
TRACE = "trace"
TRACE_RAW = "trace-raw"  # the built-in service's raw profiler output, moved into TRACE
DESIGNS = ("profiled-pair", "alternating", "paired-profile", "consecutive", "aa")
PAIRED_DEFAULTS = (10, 5)
"""Unprofiled pairs and measured requests per run of the paired-profile notebook and of
`residency pair` for designs with pairs: one definition, so the two agree."""
STATUSES = ("complete", "incomplete")
# derived files that may appear beside the evidence after it was recorded (never hashed):
# the manifest itself (and its atomic writer's temporary file) and these directories; hidden
# files are sealed like any other

__all__ = ["CLIENT", "DECISIONS_GLOB", "DESIGNS", "MANIFEST", "PAIRED_DEFAULTS", "RUNS",
           "SCHEMA", "SERVICE_LOG", "STATUSES", "TRACE", "TRACE_RAW", "decisions_file",
           "run_dir"]


def run_dir(index: int, arm: str) -> str:
    """The relative folder of measured service run `index` of `arm`: `runs/03-candidate`."""
    return f"{RUNS}/{index:02d}-{arm}"
