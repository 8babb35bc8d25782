"""Which request each policy decision belongs to: by wall-clock time, for any service.

The vLLM-Omni adapter writes `request_id: null` (its workers never see a request id), so
decisions are assigned by time: the client records each request's window
`[start_wall_ns, end_wall_ns)` (`time.time_ns()`, warm-up included) in `client.json`, and
a decision belongs to the request whose window contains its `wall_ns`. Decisions of the
service's own start-up warm-up (a recorded request id starting `warmup-`, such as the
built-in service's `warmup-service`, or, by time, any decision before the client's first
request) are warm-ups, counted per kind; the client's warm-up request is request 0. Only the
rest, decisions truly outside every window (calls between or after requests), are "outside
every request": counted with their first and last time. Both are excluded, never pooled
with a request. The built-in service
also records request ids; runs recorded before the client kept wall times are assigned by
those ids (`method="id"`), which must agree with the assignment by time wherever both exist.
(The word "attribution" belongs to `residency.evidence.attributions`, the figures users see;
the messages and notes this module prints for people still say "attributed".)

The assignment itself (`assign`) is pure analysis: pandas and numpy only, no torch, no
file reading. The steps over a loaded run (`assign_run`, `assigned_decisions`,
`decisions_by_request`) take what `residency.rundir.run.Run` read, as the files hold it, and
assign it. Timestamps are int64 ns; windows are half-open.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from residency.errors import BadInput
from residency.policy.cache import CANDIDATE
from residency.records.client import CLIENT
from residency.records.decisions import SNAPSHOT_KEYS, decisions_file
from residency.rundir.run import DECISION_COLUMNS, Run, RunDirError, RunEntry

__all__ = ["ASSIGNED_COLUMNS", "COUNT_COLUMNS", "RequestAssignment", "AssignmentError",
           "RequestWindow", "assign", "assign_run", "assigned_decisions",
           "decisions_by_request", "assign_by_id", "assign_by_time",
           "consecutive_gates", "count_failures", "expected_calls", "has_wall_times",
           "missing_rank_message", "request_counts", "scope_note",
           "request_windows", "warmup_text"]

ASSIGNED_COLUMNS = (
    "request", "request_id", "warmup", "rank", "kind", "outcome", "reason", "error",
    "wall_ns", "offset_ns", "duration_ns", "reserved_bytes", "allocated_bytes", "free_bytes",
    "total_bytes", "max_cached_fraction", "min_free_fraction", "recorded_request_id", "arm",
    "device_kind", "file",
)
"""Columns of `RequestAssignment.decisions`: `request` 0 for the warm-up, 1.. for the measured
requests in order; `request_id` the client's id of that request (None when the service
returned none); `offset_ns` = `wall_ns` - the window's start; `recorded_request_id` what the
decision itself carried (null from the vLLM-Omni adapter)."""

COUNT_COLUMNS = ("request", "request_id", "rank", "normal_checks", "normal_retained",
                 "normal_released", "forced", "forced_released", "telemetry_errors")

METHODS = ("time", "id")
ADAPTER_CAUSE = ("likely cause: the residency adapter did not load in that worker (the "
                 "`vllm_omni.general_plugins` entry point `residency` is missing from the "
                 "service's environment, or VLLM_PLUGINS is set without `residency`)")
_SNAPSHOT = {"reserved": "reserved_bytes", "allocated": "allocated_bytes", "free": "free_bytes",
             "total": "total_bytes"}


class AssignmentError(BadInput):
    """Decisions that cannot be assigned as asked; the message names the file and field."""


@dataclass(frozen=True)
class RequestWindow:
    """One request as the client timed it: `[start_wall_ns, end_wall_ns)`."""

    number: int  # 0 = warm-up, 1.. = measured requests in order
    request_id: str | None
    start_wall_ns: int
    end_wall_ns: int

    @property
    def warmup(self) -> bool:
        """True for the warm-up request."""
        return self.number == 0

    @property
    def duration_ns(self) -> int:
        """Window length."""
        return self.end_wall_ns - self.start_wall_ns


def _measured_records(client: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    requests = client.get("requests")
    if isinstance(requests, list) and requests:
        return requests
    return [client]


def has_wall_times(client: Mapping[str, Any]) -> bool:
    """True when the client record has a wall-clock window for the warm-up and every
    measured request."""
    records = [client.get("warmup") or {}, *_measured_records(client)]
    return all(isinstance(r.get("start_wall_ns"), int) and isinstance(r.get("end_wall_ns"), int)
               for r in records)


def request_windows(client: Mapping[str, Any], *, source: str = "client.json"
                    ) -> tuple[RequestWindow, ...]:
    """The warm-up's and each measured request's window from a client record, in order.

    Raises:
        AssignmentError: a window is missing, not int64 ns, empty, or overlaps the one
            before it (`source` names the file in the message).
    """
    records = [("warmup", client.get("warmup") or {})]
    records += [(f"requests[{i}]" if client.get("requests") else "", r)
                for i, r in enumerate(_measured_records(client))]
    windows = []
    for number, (where, rec) in enumerate(records):
        prefix = f"{where}." if where else ""
        for key in ("start_wall_ns", "end_wall_ns"):
            value = rec.get(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise AssignmentError(
                    f"{source}: field `{prefix}{key}` is missing or not an integer, so "
                    "decisions cannot be attributed by time (the run was recorded before the "
                    "client kept wall-clock windows: record it again)")
        start, end = int(rec["start_wall_ns"]), int(rec["end_wall_ns"])
        if end <= start:
            raise AssignmentError(f"{source}: field `{prefix}end_wall_ns` ({end}) is not after "
                                   f"`{prefix}start_wall_ns` ({start})")
        if windows and start < windows[-1].end_wall_ns:
            raise AssignmentError(f"{source}: field `{prefix}start_wall_ns` ({start}) lies "
                                   "inside the previous request's window: requests overlap")
        rid = rec.get("request_id")
        windows.append(RequestWindow(number, None if rid is None else str(rid), start, end))
    return tuple(windows)


def _iso(wall_ns: int | None) -> str:
    """UTC ISO time to the millisecond, for people (the exact ns stay in the columns)."""
    if wall_ns is None:
        return "none"
    stamp = datetime.fromtimestamp(wall_ns // 1_000_000_000, tz=timezone.utc)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{wall_ns % 1_000_000_000 // 1_000_000:03d}Z"


@dataclass(frozen=True)
class RequestAssignment:
    """Decisions of one service run assigned to its requests, and what lay outside them."""

    method: str  # "time" or "id"
    windows: tuple[RequestWindow, ...]
    decisions: pd.DataFrame = field(repr=False)  # ASSIGNED_COLUMNS, in a window
    outside_count: int = 0
    outside_first_wall_ns: int | None = None
    outside_last_wall_ns: int | None = None
    outside_by_kind: Mapping[str, int] = field(default_factory=dict)
    numbers: pd.Series = field(default=None, repr=False)  # type: ignore[assignment]
    """Per input row (same index): its request number, <NA> outside every request and for
    the service's start-up warm-up."""
    startup_count: int = 0
    """Decisions of the service's own start-up warm-up (not a client request)."""
    startup_by_kind: Mapping[str, int] = field(default_factory=dict)
    startup_ids: tuple[str, ...] = ()  # the start-up request ids recorded (e.g. warmup-service)

    @property
    def warmup_by_kind(self) -> dict[str, dict[str, int]]:
        """Warm-up decisions per source and kind: `service start-up` (the service's own
        start-up request) and `client warm-up` (request 0), e.g. {"service start-up":
        {"normal": 2, "forced": 4}, "client warm-up": {...}}; sources without decisions left
        out."""
        out = {}
        if self.startup_count:
            out["service start-up"] = dict(self.startup_by_kind)
        warm = self.warmup
        if len(warm):
            out["client warm-up"] = {str(k): int(n) for k, n in
                                     warm["kind"].value_counts().items()}
        return out

    @functools.cached_property
    def id_mismatches(self) -> pd.DataFrame:
        """Decisions assigned by time whose recorded request id is a string other than the
        id of the request whose window holds them (a clock off between the client and a
        rank, or a record edited): `request`, `request_id`, `recorded_request_id`, `rank`,
        `wall_ns`. Empty where either id is missing (the vLLM-Omni adapter records none)."""
        d = self.decisions
        cols = ["request", "request_id", "recorded_request_id", "rank", "wall_ns"]
        if d.empty or self.method != "time":
            return d.iloc[0:0][cols]
        recorded, expected = d["recorded_request_id"], d["request_id"]
        ids = recorded.map(lambda r: isinstance(r, str)) & expected.map(
            lambda r: isinstance(r, str))
        return d.loc[ids & (recorded != expected), cols].reset_index(drop=True)

    def mismatch_note(self) -> str:
        """One sentence on `id_mismatches` ("" without any): how many, and the first."""
        off = self.id_mismatches
        if off.empty:
            return ""
        first = off.sort_values("wall_ns", kind="stable").iloc[0]
        def quoted(rid: str) -> str:  # (run-supplied: repr escapes it, bounded here)
            return repr(rid if len(rid) <= 80 else rid[:80] + "...")

        return (f"{len(off)} decision(s) inside a request's window carry another request id "
                f"(first: rank {int(first['rank'])} recorded "
                f"{quoted(first['recorded_request_id'])} inside request "
                f"{int(first['request'])}, {quoted(first['request_id'])}): a clock or a record "
                "is off, and their attribution by time may be wrong.")

    def request_id_of(self, number: int) -> str | None:
        """The client's id of request `number` (0 = warm-up)."""
        return next((w.request_id for w in self.windows if w.number == number), None)

    @property
    def measured(self) -> pd.DataFrame:
        """Decisions of the measured requests (warm-up and outside excluded)."""
        return self.decisions[~self.decisions["warmup"].astype(bool)].reset_index(drop=True)

    @property
    def warmup(self) -> pd.DataFrame:
        """Decisions of the warm-up request."""
        return self.decisions[self.decisions["warmup"].astype(bool)].reset_index(drop=True)

    def outside_note(self) -> str:
        """One sentence: the warm-up decisions per source and kind (excluded), and how many
        decisions lay truly outside every request window, and when."""
        how = ("by time (client wall-clock windows)" if self.method == "time" else
               "by request id")
        warm = warmup_text(self.warmup_by_kind, self.startup_ids)
        warm = f" warm-ups excluded: {warm};" if warm else ""
        mismatch = self.mismatch_note()
        mismatch = f" {mismatch}" if mismatch else ""
        if not self.outside_count:
            return f"Attributed {how}:{warm} no decision lay outside every request.{mismatch}"
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.outside_by_kind.items()))
        span = (f"first at {_iso(self.outside_first_wall_ns)}, last at "
                f"{_iso(self.outside_last_wall_ns)}" if self.method == "time" else
                "their ids match no client request")
        return (f"Attributed {how}:{warm} {self.outside_count} decision(s) ({kinds}) lay "
                f"outside every request ({span}) and are excluded.{mismatch}")

    def __repr__(self) -> str:
        return (f"RequestAssignment(by {self.method}: {len(self.windows)} windows, "
                f"{len(self.decisions)} decisions inside, {self.outside_count} outside)")


def _empty_assigned() -> pd.DataFrame:
    return pd.DataFrame(columns=list(ASSIGNED_COLUMNS))


def _assigned(decisions: pd.DataFrame, number: np.ndarray, windows: Sequence[RequestWindow]
                ) -> pd.DataFrame:
    """`decisions` (the rows inside a window) in ASSIGNED_COLUMNS; `number` per row."""
    if decisions.empty:
        return _empty_assigned()
    by_number = {w.number: w for w in windows}
    out = pd.DataFrame({
        "request": number.astype("int64"),
        "request_id": [by_number[int(n)].request_id for n in number],
        "warmup": number == 0,
    }, index=decisions.index)
    for col in ("rank", "kind", "outcome", "reason", "error", "wall_ns", "duration_ns",
                "max_cached_fraction", "min_free_fraction", "arm", "device_kind", "file"):
        out[col] = decisions.get(col)
    starts = np.array([by_number[int(n)].start_wall_ns for n in number], dtype="int64")
    out["offset_ns"] = decisions["wall_ns"].astype("int64").to_numpy() - starts
    for raw, name in _SNAPSHOT.items():
        out[name] = decisions.get(raw)
    out["recorded_request_id"] = decisions.get("request_id")
    return out[list(ASSIGNED_COLUMNS)].reset_index(drop=True)


def warmup_text(by_source: Mapping[str, Mapping[str, int]],
                startup_ids: Sequence[str] = ()) -> str:
    """Warm-up decisions for people: "service start-up (warmup-service) 6 (2 normal, 4
    forced), client warm-up 6 (2 normal, 4 forced)"; "" without any."""
    parts = []
    for source, kinds in by_source.items():
        ids = f" ({', '.join(startup_ids)})" if source == "service start-up" and \
            startup_ids else ""
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        parts.append(f"{source}{ids} {sum(kinds.values())} ({detail})")
    return ", ".join(parts)


def _startup_mask(rows: pd.DataFrame, method: str, windows: tuple[RequestWindow, ...]
                  ) -> np.ndarray:
    """Rows (outside every client window) that belong to the service's own start-up
    warm-up: a recorded id starting `warmup-`, or, by time, before the first window."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    ids = rows["request_id"] if "request_id" in rows else pd.Series(None, index=rows.index)
    mask = ids.map(lambda r: isinstance(r, str) and r.startswith("warmup-")).to_numpy(
        dtype=bool, copy=True)
    if method == "time" and windows and "wall_ns" in rows:
        wall = pd.to_numeric(rows["wall_ns"], errors="coerce").to_numpy()
        mask |= wall < windows[0].start_wall_ns
    return mask


def _outside(rows: pd.DataFrame, method: str, windows: tuple[RequestWindow, ...],
             inside: pd.DataFrame, numbers: pd.Series) -> RequestAssignment:
    startup = _startup_mask(rows, method, windows)
    boot, rows = rows[startup], rows[~startup]
    walls = pd.to_numeric(rows.get("wall_ns"), errors="coerce").dropna() \
        if len(rows) else pd.Series(dtype="int64")
    kinds = {str(k): int(n) for k, n in rows["kind"].value_counts().items()} if len(rows) else {}
    boot_kinds = ({str(k): int(n) for k, n in boot["kind"].value_counts().items()}
                  if len(boot) else {})
    boot_ids = tuple(sorted({str(r) for r in boot["request_id"] if isinstance(r, str)})) \
        if len(boot) and "request_id" in boot else ()
    return RequestAssignment(method=method, windows=windows, decisions=inside,
                             outside_count=len(rows),
                             outside_first_wall_ns=int(walls.min()) if len(walls) else None,
                             outside_last_wall_ns=int(walls.max()) if len(walls) else None,
                             outside_by_kind=kinds, numbers=numbers, startup_count=len(boot),
                             startup_by_kind=boot_kinds, startup_ids=boot_ids)


def _numbers(decisions: pd.DataFrame) -> pd.Series:
    return pd.Series(pd.NA, index=decisions.index, dtype="Int64")


def _check_wall(decisions: pd.DataFrame) -> pd.Series:
    wall = pd.to_numeric(decisions["wall_ns"], errors="coerce") if "wall_ns" in decisions \
        else pd.Series(np.nan, index=decisions.index)
    bad = wall.isna()
    if bad.any():
        row = decisions[bad].iloc[0]
        raise AssignmentError(f"{row.get('file', 'decisions')}: a decision of rank "
                               f"{row.get('rank')} has no integer `wall_ns`, so it cannot be "
                               "attributed by time")
    return wall.astype("int64")


def assign_by_time(decisions: pd.DataFrame, windows: Sequence[RequestWindow]
                   ) -> RequestAssignment:
    """Assign each decision to the window containing its `wall_ns` (half-open).

    `decisions` is one service run's decisions (all of them, warm-up included, as
    `Run.decisions(entry)` gives them), `windows` from `request_windows`.

    Raises:
        AssignmentError: a decision without an integer `wall_ns`.
    """
    windows = tuple(windows)
    if decisions.empty:
        return _outside(decisions, "time", windows, _empty_assigned(), _numbers(decisions))
    wall = _check_wall(decisions).to_numpy()
    starts = np.array([w.start_wall_ns for w in windows], dtype="int64")
    ends = np.array([w.end_wall_ns for w in windows], dtype="int64")
    numbers = np.array([w.number for w in windows], dtype="int64")
    idx = np.searchsorted(starts, wall, side="right") - 1
    ok = idx >= 0
    ok[ok] = wall[ok] < ends[idx[ok]]
    inside = _assigned(decisions[ok], numbers[idx[ok]], windows)
    per_row = _numbers(decisions)
    per_row[ok] = numbers[idx[ok]]
    return _outside(decisions[~ok], "time", windows, inside, per_row)


def assign_by_id(decisions: pd.DataFrame, windows: Sequence[RequestWindow]
                 ) -> RequestAssignment:
    """Assign each decision to the request whose client id it carries (the built-in
    service's ids; decisions with any other id, or none, lie outside)."""
    windows = tuple(windows)
    if decisions.empty:
        return _outside(decisions, "id", windows, _empty_assigned(), _numbers(decisions))
    ids = {w.request_id: w.number for w in windows if w.request_id is not None}
    number = decisions["request_id"].map(lambda r: ids.get(r) if isinstance(r, str) else None)
    ok = number.notna().to_numpy()
    inside = _assigned(decisions[ok], number[ok].to_numpy(dtype="int64"), windows)
    return _outside(decisions[~ok], "id", windows, inside,
                    number.astype("Int64").rename(None))


def _id_windows(client: Mapping[str, Any]) -> tuple[RequestWindow, ...]:
    """Windows without times (0, 0), for assignment by id of runs recorded without them."""
    records = [client.get("warmup") or {}, *_measured_records(client)]
    return tuple(RequestWindow(i, None if r.get("request_id") is None else
                               str(r.get("request_id")), 0, 0) for i, r in enumerate(records))


def assign(decisions: pd.DataFrame, client: Mapping[str, Any], *, method: str = "auto",
           source: str = "client.json") -> RequestAssignment:
    """Assign one service run's decisions to its requests.

    `method`: "time" (needs the client's wall-clock windows), "id" (needs request ids in
    the decisions; a client record without ids falls back to the original convention:
    ids starting `warmup-` are warm-ups, the others measured requests in order), or
    "auto": by time when the client recorded the windows, else by id when every decision
    carries an id.

    Raises:
        AssignmentError: `method` unknown, or the run cannot be assigned that way.
    """
    if method not in ("auto", *METHODS):
        raise AssignmentError(f"The value for `method` must be one of ['auto', 'time', 'id'], "
                               f"but {method!r} was passed.")
    if method == "time" or (method == "auto" and has_wall_times(client)):
        return assign_by_time(decisions, request_windows(client, source=source))
    if method == "auto" and len(decisions) and decisions["request_id"].isna().any():
        request_windows(client, source=source)  # raises: explains the missing windows
    windows = _id_windows(client)
    if all(w.request_id is None for w in windows):  # a client record without ids
        windows = _prefix_windows(decisions)
    return assign_by_id(decisions, windows)


def _prefix_windows(decisions: pd.DataFrame) -> tuple[RequestWindow, ...]:
    """Requests named by the decisions themselves, for client records that carry no request
    id (the original contract: warm-up ids start with `warmup-`): the last warm-up id to
    appear is request 0 (earlier warm-up ids lie outside), every other id a measured
    request, numbered in order of appearance."""
    ids = decisions.sort_values("wall_ns")["request_id"].dropna().astype(str).unique() \
        if len(decisions) else []
    warm = [i for i in ids if i.startswith("warmup-")]
    measured = [i for i in ids if not i.startswith("warmup-")]
    return (RequestWindow(0, warm[-1] if warm else None, 0, 0),
            *(RequestWindow(n, rid, 0, 0) for n, rid in enumerate(measured, 1)))


# ----------------------------------------------------------------------------- gates
def request_counts(assignment: RequestAssignment, ranks: Sequence[int]) -> pd.DataFrame:
    """Per measured request x rank (every rank in `ranks`, zero rows included): normal
    checks (retained / released), forced calls (released) and telemetry errors."""
    dec = assignment.measured
    rows = []
    for w in (w for w in assignment.windows if not w.warmup):
        mine = dec[dec["request"] == w.number]
        for rank in sorted({*map(int, ranks), *mine["rank"].astype(int)}):
            d = mine[mine["rank"].astype(int) == rank]
            normal, forced = d[d["kind"] == "normal"], d[d["kind"] == "forced"]
            rows.append({"request": w.number, "request_id": w.request_id, "rank": rank,
                         "normal_checks": len(normal),
                         "normal_retained": int((normal["outcome"] == "retained").sum()),
                         "normal_released": int((normal["outcome"] == "released").sum()),
                         "forced": len(forced),
                         "forced_released": int((forced["outcome"] == "released").sum()),
                         "telemetry_errors": int((d["reason"] == "telemetry-unavailable").sum())})
    return pd.DataFrame(rows, columns=list(COUNT_COLUMNS))


def missing_rank_message(run_name: str, rank: int, *, file_exists: bool) -> str:
    """The sentence for a rank that wrote no decisions in a service run."""
    what = ("wrote an empty decisions-rank{r}.jsonl" if file_exists else
            "wrote no decisions-rank{r}.jsonl").format(r=rank)
    return f"{run_name}: rank {rank} {what}; {ADAPTER_CAUSE}."


def count_failures(counts: pd.DataFrame, *, run_name: str, ranks: Sequence[int],
                   silent_ranks: Mapping[int, bool] | None = None,
                   expected_normal: int | None = None, expected_forced: int | None = None
                   ) -> list[str]:
    """One sentence per failed count gate of one service run (empty when all pass).

    `silent_ranks` maps a rank that wrote no decision at all to whether its file exists
    (the adapter message is given instead of per-request counts for it). With expected
    counts (declared by the service), every rank and measured request must make exactly
    them; without, every rank and measured request must make the same normal and forced
    counts (at least one normal check), and the ones that differ from the most common are
    named.
    """
    silent = dict(silent_ranks or {})
    failures = [missing_rank_message(run_name, r, file_exists=e) for r, e in sorted(silent.items())]
    wanted = set(map(int, ranks))
    rows = [row for row in counts.itertuples(index=False)
            if int(row.rank) not in silent and int(row.rank) in wanted]
    if expected_normal is None:  # no declared counts: every rank and request alike
        normal, forced = _common_counts(rows)
        bad = [f"request {row.request} rank {row.rank}: {row.normal_checks} normal, "
               f"{row.forced} forced" for row in rows
               if (row.normal_checks, row.forced) != (normal, forced) or row.normal_checks < 1]
        want = (f"the same counts on every rank and measured request (most common: {normal} "
                f"normal + {forced} forced, at least 1 normal check)")
    else:
        bad = [f"request {row.request} rank {row.rank}: {row.normal_checks} normal, "
               f"{row.forced} forced" for row in rows
               if row.normal_checks != expected_normal or row.forced != expected_forced]
        want = f"{expected_normal} normal + {expected_forced} forced per rank per measured request"
    if bad:
        more = f" (and {len(bad) - 4} more)" if len(bad) > 4 else ""
        failures.append(f"{run_name}: expected {want}, but {'; '.join(bad[:4])}{more}.")
    return failures


def _common_counts(rows: Sequence[Any]) -> tuple[int, int]:
    """The most common (normal, forced) pair of `rows`; on a tie the one seen first (the
    earliest request, lowest rank). (0, 0) without rows."""
    tally: dict[tuple[int, int], int] = {}
    for row in rows:
        key = (int(row.normal_checks), int(row.forced))
        tally[key] = tally.get(key, 0) + 1
    return max(tally, key=tally.__getitem__) if tally else (0, 0)


DEFAULT_EXPECT = {"normal_per_request": 1, "forced_per_request": 2}
"""Policy calls per rank per measured request of the built-in service, used for runs whose
manifest predates `service_info.expect`."""


def expected_calls(manifest: Mapping[str, Any]) -> dict[str, int] | None:
    """Policy calls per rank per measured request the run's service declares (the built-in
    service: 1 normal + 2 forced), None when an external service declares none."""
    info = manifest.get("service_info") or {}
    if info.get("expect"):
        return dict(info["expect"])
    return dict(DEFAULT_EXPECT) if manifest.get("service", "builtin") == "builtin" else None


def _oom_by_rank(response: Any) -> dict[int, int]:
    if not isinstance(response, Mapping):
        return {}
    return {int(pr["rank"]): int(pr["oom"]) for pr in response.get("per_rank") or []
            if isinstance(pr, Mapping) and "rank" in pr and pr.get("oom") is not None}


def consecutive_gates(run: Any, *, arm: str = CANDIDATE) -> list[str]:
    """One sentence per failed consecutive-request gate of `arm` (empty when all pass), from
    the assignment of every decision to its request (by time for any service):

    * every rank wrote decisions (else the adapter most likely did not load);
    * per rank and measured request, the normal and forced calls the service declares
      (`service_info.expect`); when it declares none, the same normal and forced counts on
      every rank and measured request (at least one normal check), the differing ones named;
    * no telemetry error in a measured request; no OOM where the service reports OOMs.

    `run` is a loaded `residency.rundir.run.Run`.
    """
    failures: list[str] = []
    entries = run.arm(arm)
    if not entries:
        return [f"The run has no {arm} service run, so nothing was checked."]
    ranks = list(range(int((run.manifest.get("params") or {}).get("ranks") or 0)))
    expect = expected_calls(run.manifest)
    for entry in entries:
        assigned = assign_run(run, entry)
        raw = assigned_decisions(run, entry, warmup=True)
        present = set(raw["rank"].dropna().astype(int))
        silent = {r: (entry.dir / decisions_file(r)).exists()
                  for r in ranks if r not in present}
        counts = request_counts(assigned, ranks or sorted(present))
        failures += count_failures(
            counts, run_name=entry.name, ranks=ranks or sorted(present), silent_ranks=silent,
            expected_normal=None if expect is None else expect.get("normal_per_request"),
            expected_forced=None if expect is None else expect.get("forced_per_request"))
        measured = assigned.measured
        errors = measured[measured["reason"] == "telemetry-unavailable"]
        if len(errors):
            failures.append(f"{entry.name}: the {arm} arm had {len(errors)} telemetry error(s) "
                            f"(first: {errors.iloc[0]['error']}).")
        client = run.client(entry)
        responses = [r.get("response") for r in (client.get("requests") or [client])]
        ooms = sum(v for resp in responses for v in _oom_by_rank(resp).values())
        if ooms:
            failures.append(f"{entry.name}: the {arm} service reported {ooms} out-of-memory "
                            "error(s).")
    return failures


def scope_note(assignments: Sequence[RequestAssignment]) -> str:
    """One summary for a table footer (never one sentence per run): how many service runs,
    how their decisions were assigned to requests, the warm-up decisions per source and
    kind (excluded), and how many decisions lay truly outside every request (and when)."""
    if not assignments:
        return "Warm-up requests excluded."
    methods = sorted({a.method for a in assignments})
    how = " and ".join("by time (client wall-clock windows)" if m == "time" else "by request id"
                       for m in methods)
    warm: dict[str, dict[str, int]] = {}
    ids: set[str] = set()
    for a in assignments:
        ids.update(a.startup_ids)
        for source, kinds in a.warmup_by_kind.items():
            for k, n in kinds.items():
                warm.setdefault(source, {})[k] = warm.get(source, {}).get(k, 0) + n
    outside = sum(a.outside_count for a in assignments)
    firsts = [a.outside_first_wall_ns for a in assignments if a.outside_first_wall_ns]
    lasts = [a.outside_last_wall_ns for a in assignments if a.outside_last_wall_ns]
    span = (f" (first at {_iso(min(firsts))}, last at {_iso(max(lasts))})"
            if firsts and lasts else "")
    runs = len(assignments)
    text = ("1 service run after its warm-up; " if runs == 1 else
            f"{runs} service runs, each after its own warm-up; ")
    text += f"decisions attributed to requests {how}"
    warm_text = warmup_text(warm, sorted(ids))
    text += f"; warm-up decisions excluded: {warm_text}" if warm_text else \
        "; warm-up requests excluded"
    if outside:
        text += f"; {outside} decision(s) outside every request excluded{span}"
    else:
        text += "; no decision outside every request"
    mismatched = sum(len(a.id_mismatches) for a in assignments)
    if mismatched:
        text += (f"; {mismatched} decision(s) inside a request's window carry another "
                 "request id (a clock or a record is off)")
    return text + "."


# ------------------------------------------------------------------- the steps over a run
def assign_run(run: Run, entry: RunEntry, *, method: str = "auto",
               decisions: pd.DataFrame | None = None) -> RequestAssignment:
    """The `RequestAssignment` of one service run of `run`: which request each decision
    belongs to (by time when the client recorded wall-clock windows, else by id), and the
    decisions outside every request. `decisions`: the run's as `Run.decisions` gives them
    (read when not given).

    Raises:
        RunDirError: the run cannot be assigned (e.g. decisions without request ids
            and a client record without wall-clock windows), naming its `client.json`.
    """
    if decisions is None:
        decisions = run.decisions(entry)
    path = entry.dir / CLIENT
    try:
        return assign(decisions, run.client(entry), method=method, source=str(path))
    except AssignmentError as exc:
        raise RunDirError(path, str(exc).removeprefix(f"{path}: ")) from None


def assigned_decisions(run: Run, entry: RunEntry, *, warmup: bool = False) -> pd.DataFrame:
    """The decisions of one service run, each given the request it belongs to.

    Without `warmup`: only the decisions assigned to a measured request (`assign_run`),
    each with `request` (1.. in order) and `request_id` of that request; the warm-up and
    decisions outside every request are left out (the assignment counts them). With
    `warmup`: every decision as recorded, with `request` (<NA> outside every request) and
    `warmup` True for each one not assigned to a measured request (the warm-up's and
    those outside every request)."""
    df = run.decisions(entry)
    assigned = assign_run(run, entry, decisions=df)
    number = assigned.numbers
    keep = (number.notna() & (number != 0)).fillna(False).astype(bool)
    if warmup:
        return df.assign(request=number, warmup=~keep)
    out = df[keep].assign(request=number[keep].astype("int64"))
    out["request_id"] = [assigned.request_id_of(int(n)) for n in out["request"]]
    return out.reset_index(drop=True)


def decisions_by_request(run: Run) -> pd.DataFrame:
    """Every decision of every service run of `run`, warm-up included, one row per policy
    call, each given its run and request.

    The decisions columns plus `run` (entry name), `run_arm` (the entry's arm), `profiled`,
    `run_index`, `warmup` (True unless the decision belongs to a measured request) and
    `request` (1-based order of the measured request within its run; 0 for the warm-up and
    for decisions outside every request), from `assign_run` (by the client's wall-clock
    windows when recorded, so for any service, else by request id); this is the one place
    evidence reads it.
    """
    frames = []
    for entry in run.runs:
        df = assigned_decisions(run, entry, warmup=True)
        snap = list(SNAPSHOT_KEYS)
        df = df.astype({k: object for k in snap})  # ints stay ints across runs (no float64)
        frames.append(df.assign(run=entry.name, run_arm=entry.arm, profiled=entry.profiled,
                                run_index=entry.index,
                                request=df["request"].fillna(0).astype("int64")))
    cols = [*DECISION_COLUMNS, "run", "run_arm", "profiled", "run_index", "request"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]
