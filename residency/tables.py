"""Evidence tables: one row per attribution, units on every number, a note on what it supports.

`evidence_table(run)` builds the table of a run directory, `published_table()` the published
NPU figures of the original pull request in the same columns; `to_markdown`, `to_csv` and
`to_json` return strings. The `tables` CLI subcommand prints them. No torch here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from residency import stats
from residency.rundir import Run, RunDirError, RunEntry, load_run

ARMS = ("baseline", "candidate")
COLUMNS = ("metric", "baseline", "candidate", "delta", "n", "note")
NORMAL_MARKER = r"residency\.release\[normal\]"
PREPARE_MARKER = r"residency\.phase\[prepare\]"
PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published" / "h3_ref2va_910b1.json"
IDLE_ROWS = (  # idle key, metric, unit
    ("marker_idle_intersection_ns", "normal-release markers ∩ all-rank no-device-task time",
     "ms"),
    ("all_rank_idle_ns", "all-rank no-device-task time", "s"),
)
_SCALE = {"ms": 1e6, "s": 1e9}
_TESTS = {
    "groups": "Mann-Whitney U (exact, two-sided) on per-rank values of one run pair",
    "pairs": "Wilcoxon signed-rank (exact sign-flip, two-sided) on paired E2E",
    "counts": "Clopper-Pearson 95 % intervals on counts",
    "single": "single observations: no test",
}

__all__ = ["evidence_table", "published_table", "to_markdown", "to_csv", "to_json",
           "add_cli", "run_cli"]


# ----------------------------------------------------------------------------- cells
def _pct(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f" ({x:+.2%})".replace("%", " %")


def _row(metric: str, b: str, c: str, delta: str, n: str, note: str) -> dict[str, str]:
    return dict(zip(COLUMNS, (metric, b, c, delta, n, note), strict=True))


def _groups_row(metric: str, b: list[float], c: list[float], unit: str) -> dict[str, str]:
    r = stats.compare_groups(b, c, unit=unit)

    def cell(rng: tuple[float, float], med: float) -> str:
        return f"{stats.fmt_num(rng[0])}-{stats.fmt_num(rng[1])} {unit} " \
               f"(median {stats.fmt_num(med)} {unit})"

    delta = f"{stats.fmt_num(r.delta)} {unit} median ({stats.fmt_speed(r.ratio)})"
    return _row(metric, cell(r.baseline_range, r.baseline_median),
                cell(r.candidate_range, r.candidate_median), delta,
                f"{r.n[0]} vs {r.n[1]} ranks", r.note)


def _counts_row(metric: str, k: Mapping[str, int], n: Mapping[str, int], what: str) -> dict:
    if not all(n[a] for a in ARMS):
        return _row(metric, f"{k['baseline']}/{n['baseline']}",
                    f"{k['candidate']}/{n['candidate']}", "n/a", "no calls in an arm",
                    "No calls recorded in at least one arm: nothing to compare.")
    p = {a: stats.proportion(k[a], n[a]) for a in ARMS}
    cells = [f"{k[a]}/{n[a]} {what} ({p[a].fraction:.1%})".replace("%", " %") for a in ARMS]
    pp = 100 * (p["candidate"].fraction - p["baseline"].fraction)
    ci = ", ".join(f"{a} {p[a].ci[0]:.1%}-{p[a].ci[1]:.1%}" for a in ARMS).replace("%", " %")
    return _row(metric, cells[0], cells[1], f"{pp:+.1f} pp",
                f"{n['baseline']} vs {n['candidate']} calls",
                f"Clopper-Pearson 95 %: {ci}; what these counts support.")


def _single_row(metric: str, b: float, c: float, unit: str, source: str) -> dict[str, str]:
    r = stats.single(b, c, unit=unit)
    return _row(metric, f"{stats.fmt_num(b)} {unit}", f"{stats.fmt_num(c)} {unit}",
                f"{stats.fmt_num(r.delta)} {unit}{_pct(r.relative)}", "1 per arm",
                f"{r.note} Source: {source}.")


# ----------------------------------------------------------------------------- run rows
def _reference_pair(run: Run) -> tuple[RunEntry, RunEntry] | None:
    """The profiled pair if any, else the first run of each arm."""
    first = {}
    for arm in ARMS:
        runs = run.arm(arm)
        if not runs:
            return None
        first[arm] = next((r for r in runs if r.profiled), runs[0])
    return first["baseline"], first["candidate"]


def _per_rank_normal_ms(run: Run, entry: RunEntry) -> list[float]:
    df = run.decisions(entry)
    normal = df[df["kind"] == "normal"]
    if not normal.empty:
        return (normal.groupby("rank")["duration_ns"].sum() / 1e6).tolist()
    per_rank = (run.client(entry).get("response") or {}).get("per_rank") or []
    # the service reports each rank's normal-call durations as a list (one per call)
    return [sum(_as_list(pr["normal"]["duration_ns"])) / 1e6 for pr in per_rank
            if (pr.get("normal") or {}).get("count")]


def _as_list(value: Any) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _max_prepare_ns(run: Run, entry: RunEntry) -> int | None:
    per_rank = (run.client(entry).get("response") or {}).get("per_rank") or []
    return max((pr["prepare_ns"] for pr in per_rank if "prepare_ns" in pr), default=None)


def _decision_rows(run: Run, pair: tuple[RunEntry, RunEntry] | None, used: set) -> list:
    rows = []
    if pair is not None:
        b, c = (_per_rank_normal_ms(run, e) for e in pair)
        if b and c:
            used.add("groups")
            rows.append(_groups_row(f"normal-call duration per rank, pair "
                                    f"{pair[0].name} / {pair[1].name}", b, c, "ms"))
    frames = {a: [run.decisions(e) for e in run.arm(a)] for a in ARMS}
    dec = {a: pd.concat(f) if f else pd.DataFrame(columns=["kind", "outcome", "reason"])
           for a, f in frames.items()}
    for kind, metric in (("normal", "normal calls that released cache"),
                         ("forced", "forced releases that released")):
        calls = {a: dec[a][dec[a]["kind"] == kind] for a in ARMS}
        if any(len(calls[a]) for a in ARMS):
            used.add("counts")
            k = {a: int((calls[a]["outcome"] == "released").sum()) for a in ARMS}
            rows.append(_counts_row(metric, k, {a: len(calls[a]) for a in ARMS}, "released"))
    if any(len(dec[a]) for a in ARMS):
        rows.append(_errors_row(run, dec))
    return rows


def _errors_row(run: Run, dec: Mapping[str, pd.DataFrame]) -> dict[str, str]:
    cells = []
    for a in ARMS:
        errors = int((dec[a]["reason"] == "telemetry-unavailable").sum())
        ooms = [pr.get("oom") for e in run.arm(a) for pr in
                ((run.client(e).get("response") or {}).get("per_rank") or [])]
        oom = str(sum(ooms)) if ooms and None not in ooms else "n/a"
        cells.append(f"{errors} telemetry errors, {oom} OOM")
    return _row("telemetry errors, OOM", cells[0], cells[1], "—",
                f"{len(dec['baseline'])} vs {len(dec['candidate'])} calls",
                "Counts over all measured runs. A telemetry error makes a normal call release "
                "(the conservative path).")


def _e2e_row(run: Run, noise_s: float | None, used: set) -> list:
    """Client E2E rows: one for the profiled pair and one for the unprofiled pairs when a run
    has both (profiling slows a run down: the two are never pooled)."""
    groups = {True: "client E2E, profiled pair", False: "client E2E per unprofiled pair"}
    present = {r.profiled for r in run.runs}
    rows = []
    for profiled in sorted(present, reverse=True):
        label = groups[profiled] if len(present) > 1 else "client E2E per pair"
        runs = tuple(tuple(r for r in run.arm(a) if r.profiled == profiled) for a in ARMS)
        rows += _e2e_pairs_row(run, label, runs, noise_s, used)
    return rows


def _e2e_pairs_row(run: Run, metric: str, runs: tuple[tuple[RunEntry, ...], ...],
                   noise_s: float | None, used: set) -> list:
    def e2e(entry: RunEntry) -> float | None:
        return entry.e2e_s if entry.e2e_s is not None else run.client(entry).get("e2e_s")

    both = [(e2e(b), e2e(c)) for b, c in zip(*runs, strict=False)]  # pair i: i-th of each arm
    pairs = [(b, c) for b, c in both if b is not None and c is not None]
    if not pairs:
        return []
    left = len(runs[0]) + len(runs[1]) - 2 * len(pairs)
    extra = f" {left} run(s) without a complete pair left out." if left else ""
    r = stats.compare_pairs([p[0] for p in pairs], [p[1] for p in pairs], unit="s",
                            noise=noise_s)
    used.add("pairs" if r.n >= 2 else "single")
    label = "" if r.n == 1 else "median "
    word = "pair" if r.n == 1 else "pairs"
    return [_row(metric, f"{label}{stats.fmt_num(r.baseline_median)} s",
                 f"{label}{stats.fmt_num(r.candidate_median)} s",
                 f"{label}{stats.fmt_num(r.delta)} s{_pct(r.relative)}", f"{r.n} {word}",
                 r.note + extra)]


def _idle_rows(run: Run, pair: tuple[RunEntry, RunEntry] | None, idle: Mapping | None,
               idle_error: str | None, used: set) -> list:
    rows = []
    idle = idle or {}
    for key, metric, unit in IDLE_ROWS:
        if all(key in (idle.get(a) or {}) for a in ARMS):
            used.add("single")
            rows.append(_single_row(metric, idle["baseline"][key] / _SCALE[unit],
                                    idle["candidate"][key] / _SCALE[unit], unit,
                                    "trace analysis of the profiled pair"))
        elif idle_error:
            rows.append(_row(metric, "n/a", "n/a", "n/a", "0",
                             f"Trace analysis unavailable: {idle_error}."))
            idle_error = None  # say it once
    prep = {a: (idle.get(a) or {}).get("prepare_ns") for a in ARMS}
    source = "trace window marker residency.phase[prepare]"
    if None in prep.values() and pair is not None:
        source = "service response, max over ranks of per_rank prepare_ns"
        prep = {a: _max_prepare_ns(run, e) for a, e in zip(ARMS, pair, strict=True)}
    b, c = prep["baseline"], prep["candidate"]
    if b is not None and c is not None:
        used.add("single")
        rows.append(_single_row("preparation window", b / 1e9, c / 1e9, "s", source))
    return rows


def _title(name: str, device_kind: str) -> str:
    from residency import devices

    label = f": {devices.label(device_kind)}" if device_kind == "emulated-npu" else ""
    return f"Evidence: {name} (device kind {device_kind}{label})"


def _footer(used: set, extra: str = "") -> str:
    tests = "; ".join(_TESTS[k] for k in ("groups", "pairs", "counts", "single") if k in used)
    return ("Units: ms = milliseconds, s = seconds, pp = percentage points; every number carries "
            "its unit. n: ranks per arm for per-rank rows, calls per arm for counts, pairs for "
            f"E2E, 1 per arm for single observations. Tests: {tests or 'none'}; 5 % level. "
            f"{extra}").strip()


def _frame(rows: list, title: str, device_kind: str, footer: str) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs.update(title=title, device_kind=device_kind, footer=footer)
    return df


def evidence_table(run: Run, *, idle: Mapping[str, Mapping[str, float]] | None = None,
                   idle_error: str | None = None, e2e_noise_s: float | None = None
                   ) -> pd.DataFrame:
    """The evidence table of a loaded run: one row per attribution available in it.

    `idle` maps arm -> {"marker_idle_intersection_ns", "all_rank_idle_ns", "prepare_ns"}
    from the trace analysis of the profiled pair; `idle_error` says why it is missing;
    `e2e_noise_s` is an optional A/A noise estimate for the E2E row. Title, device kind and
    footer are in `DataFrame.attrs`.
    """
    used: set[str] = set()
    pair = _reference_pair(run)
    rows = (_decision_rows(run, pair, used) + _idle_rows(run, pair, idle, idle_error, used)
            + _e2e_row(run, e2e_noise_s, used))
    name = run.path.name + ("" if run.status == "complete" else ", INCOMPLETE run")
    return _frame(rows, _title(name, run.device_kind), run.device_kind,
                  _footer(used, "Warm-up requests excluded."))


# ----------------------------------------------------------------------------- published
def _published_cell(value: Any, unit: str, decimals: int) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return f"{value[0]:.{decimals}f}-{value[1]:.{decimals}f} {unit}"
    if isinstance(value, dict) and "k" in value:
        return f"{value['k']}/{value['n']} {unit}"
    if isinstance(value, dict):  # a tally: name -> count or {"k", "n"}
        return ", ".join(f"{v['k']}/{v['n']} {k}" if isinstance(v, dict) else f"{v} {k}"
                         for k, v in value.items())
    return f"{value:.{decimals}f} {unit}"


def _published_delta(row: Mapping[str, Any]) -> str:
    b, c, unit, d = row["baseline"], row["candidate"], row.get("unit", ""), row["decimals"]
    if isinstance(b, (int, float)) and isinstance(c, (int, float)):
        return f"{c - b:+.{d}f} {unit}{_pct((c - b) / b if b else None)}"
    if isinstance(b, list) and isinstance(c, list):
        return f"{b[0] / c[1]:.1f}x-{b[1] / c[0]:.1f}x faster (any rank vs any rank)"
    if isinstance(b, dict) and "k" in b:
        return f"{100 * (c['k'] / c['n'] - b['k'] / b['n']):+.1f} pp"
    return "—"


def _published_note(row: Mapping[str, Any]) -> str:
    b, c = row["baseline"], row["candidate"]
    kind, note = row["kind"], row.get("note", "")
    if kind == "range" and (c[1] < b[0] or b[1] < c[0]):
        p = 2 / math.comb(row["n_baseline"] + row["n_candidate"], row["n_baseline"])
        stat = (f"Ranges do not overlap: complete separation, exact Mann-Whitney U two-sided "
                f"p = 2/C({row['n_baseline'] + row['n_candidate']},{row['n_baseline']}) = "
                f"{stats.fmt_p(p)}. Ranks of one run are not independent replicates: "
                f"\"every rank, in this run pair\".")
    elif kind == "count":
        ps = {a: stats.proportion(v["k"], v["n"]) for a, v in (("baseline", b), ("candidate", c))}
        stat = "Clopper-Pearson 95 %: " + ", ".join(
            f"{a} {p.ci[0]:.1%}-{p.ci[1]:.1%}" for a, p in ps.items()).replace("%", " %") + "."
    elif kind == "value" and row.get("pairs", 1) > 1:
        stat = (f"Medians of {row['pairs']} pairs; the pairs themselves are not published. "
                + stats.pairs_floor_note(row["pairs"]))
    elif kind == "value":
        stat = "Single observation per arm: no interval or test possible."
    else:  # tally
        ps = {k: stats.proportion(v["k"], v["n"]) for k, v in c.items() if isinstance(v, dict)}
        stat = "Clopper-Pearson 95 %: " + ", ".join(
            f"{k} {p.ci[0]:.1%}-{p.ci[1]:.1%}" for k, p in ps.items()).replace("%", " %") + "."
    return f"{stat} {note}".strip()


def published_table(path: str | Path | None = None) -> pd.DataFrame:
    """The published NPU figures (`data/published/`) in the evidence-table format.

    Raises:
        ValueError: the file is missing or not the expected JSON.
    """
    p = Path(path) if path is not None else PUBLISHED
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        rows = [_row(r["metric"], _published_cell(r["baseline"], r.get("unit", ""),
                                                  r["decimals"]),
                     _published_cell(r["candidate"], r.get("unit", ""), r["decimals"]),
                     _published_delta(r), r["n"], _published_note(r)) for r in data["rows"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{p}: cannot read published figures ({type(exc).__name__}: {exc})"
                         ) from None
    used = {"counts", "single", "groups"}
    return _frame(rows, _title(data["title"], data["device_kind"]), data["device_kind"],
                  _footer(used, f"Source: {data['source']}."))


# ----------------------------------------------------------------------------- formatters
def _md_cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(table: pd.DataFrame, *, title: str | None = None) -> str:
    """A Markdown table ready to paste into a pull request, with title and footer."""
    title = title if title is not None else table.attrs.get("title", "Evidence")
    cols = list(table.columns)
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    if table.attrs.get("footer"):
        lines += ["", f"*{table.attrs['footer']}*"]
    return "\n".join(lines) + "\n"


def to_csv(table: pd.DataFrame) -> str:
    """The table as CSV text (header row, no index)."""
    return table.to_csv(index=False, lineterminator="\n")


def to_json(table: pd.DataFrame) -> str:
    """The table as one JSON object: title, device_kind, footer, rows."""
    return json.dumps({**{k: table.attrs.get(k) for k in ("title", "device_kind", "footer")},
                       "rows": table.to_dict(orient="records")}, indent=2, ensure_ascii=False)


# ----------------------------------------------------------------------------- CLI
def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `tables`."""
    p = subparsers.add_parser(
        "tables", help="evidence table of a run directory",
        description="Print the evidence table of RUN_DIR (one row per attribution, units on "
        "every number) and/or the published NPU figures.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="run directory")
    p.add_argument("--format", choices=("md", "csv", "json"), default="md")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="read a run whose manifest status is not 'complete'")
    p.add_argument("--published", action="store_true",
                   help="also print the published NPU figures in the same format")
    p.add_argument("--no-verify", action="store_true",
                   help="read a run whose files differ from its recorded sha256")


def idle_from_traces(run: Run) -> tuple[dict[str, dict[str, int]] | None, str | None]:
    """Idle figures of the profiled pair from its traces (None, reason) when unavailable."""
    pair = _reference_pair(run)
    if pair is None or any(e.trace_dir is None for e in pair):
        return None, None
    try:
        from residency.idle import idle_summary
        from residency.traces import load_traces

        out = {}
        for arm, entry in zip(ARMS, pair, strict=True):
            timelines = load_traces(entry.dir / "trace")
            whole = idle_summary(timelines, marker=NORMAL_MARKER)
            prep = idle_summary(timelines, marker=NORMAL_MARKER, window_marker=PREPARE_MARKER)
            start, end = _get(prep, "window_ns")
            out[arm] = {"marker_idle_intersection_ns": _get(whole, "marker_idle_intersection_ns"),
                        "all_rank_idle_ns": _get(whole, "all_rank_idle_ns"),
                        "prepare_ns": int(end) - int(start)}
        return out, None
    except (ImportError, AttributeError, TypeError, KeyError, ValueError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _get(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, Mapping) else getattr(obj, key)


def _render(tables: list[pd.DataFrame], fmt: str) -> str:
    if fmt == "md":
        return "\n".join(to_markdown(t) for t in tables)
    if fmt == "json":
        docs = [json.loads(to_json(t)) for t in tables]
        return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, ensure_ascii=False)
    return "\n".join(to_csv(t) for t in tables)


def run_cli(args: argparse.Namespace) -> int:
    """Run `tables`: print the tables; one line on stderr and exit 2 on error."""
    try:
        if args.run_dir is None and not args.published:
            raise ValueError("give RUN_DIR, --published, or both")
        tables = []
        if args.run_dir is not None:
            run = load_run(args.run_dir, allow_incomplete=args.allow_incomplete,
                           verify=not args.no_verify)
            idle, reason = idle_from_traces(run)
            tables.append(evidence_table(run, idle=idle, idle_error=reason))
        if args.published:
            tables.append(published_table())
    except (RunDirError, ValueError, OSError) as exc:
        print(f"residency tables: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(_render(tables, args.format).rstrip("\n") + "\n")
    return 0
