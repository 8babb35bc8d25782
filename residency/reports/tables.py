"""Evidence tables: one row per attribution, units on every number, a note on what it supports.

`evidence_table(run)` builds the table of a run directory, `published_table()` the published
NPU figures of the original pull request in the same columns; `to_markdown`, `to_csv` and
`to_json` return strings (`render` several at once); `residency tables` prints them. Rows
are rendered from `residency.evidence`: nothing is computed here. No torch here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from residency import devices, humanize
from residency.evidence import PAIRED_ARMS, Attribution, Evidence, notes, published
from residency.evidence import build as build_evidence
from residency.humanize import csv_text, md_line, published_percent, write_markdown_table
from residency.jsonio import plain
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

COLUMNS = ("metric", BASELINE, CANDIDATE, "delta", "n", "note")
PUBLISHED_NAME = "h3_ref2va_910b1.json"
_TESTS = {
    "description": "per-rank rows describe every rank of one run pair (no test)",
    "groups": "Mann-Whitney U (exact, two-sided) on one value per run (the run as the unit)",
    "pairs": "exact Wilcoxon signed-rank test (two-sided) on paired E2E",
    "counts": "Clopper-Pearson 95 % intervals on counts",
    "single": "single observations: no test",
    "aa": "A/A noise: median |delta| of same-arm pairs (no test)",
}

__all__ = ["evidence_table", "published_percent", "published_table", "to_markdown", "to_csv",
           "to_json", "render"]


# ----------------------------------------------------------------------------- cells
class _Numbers:
    """How a row's numbers are written: for people (`residency.humanize`, 4 significant
    digits: the Markdown, HTML and first-screen text) or at full precision (the CSV and
    JSON rows). The row builders below write each cell once, through one of these."""

    def __init__(self, full: bool) -> None:
        self.full = full

    def num(self, x: float, unit: str = "") -> str:
        if self.full:
            return f"{humanize.full_number(x)} {unit}".rstrip()
        return humanize.quantity(x, unit)

    def signed(self, x: float, unit: str = "") -> str:
        if not self.full:
            return humanize.signed(x, unit)
        return f"{'+' if x > 0 else ''}{humanize.full_number(x)} {unit}".rstrip()

    def pct(self, x: float | None) -> str:
        if x is None or not math.isfinite(x):
            return ""
        return f" ({f'{100 * x:+}' if self.full else humanize.change_percent(x)[:-2]} %)"

    def span(self, lo: float, hi: float, unit: str) -> str:
        if self.full:
            lo_text, hi_text = humanize.full_number(lo), humanize.full_number(hi)
            return f"{lo_text}{humanize.DASH}{hi_text} {unit}".rstrip()
        return humanize.span_text(lo, hi, unit)

    def share(self, x: float) -> str:
        return f"{100 * x:g} %" if self.full else humanize.percent(x)

    def pp(self, x: float) -> str:
        return (f"{x:+g}" if self.full else humanize.signed(x)) + " pp"


_PEOPLE, _FULL = _Numbers(False), _Numbers(True)


def _row(metric: str, b: str, c: str, delta: str, n: str, note: str) -> dict[str, str]:
    return dict(zip(COLUMNS, (metric, b, c, delta, n, note), strict=True))


def _description_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    med = a.detail["medians"]

    def cell(arm: str) -> str:
        v = a.values[arm]
        return f"{f.span(min(v), max(v), a.unit)} (median over ranks {f.num(med[arm], a.unit)})"

    delta = (f"{f.signed(med[CANDIDATE] - med[BASELINE], a.unit)} delta of the medians "
             f"({humanize.speed_text(a.median_ratio())})")
    return _row(a.metric, cell(BASELINE), cell(CANDIDATE), delta,
                f"{a.n[BASELINE]} vs {a.n[CANDIDATE]} ranks (no test)", a.note)


def _groups_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    r = a.result

    def cell(rng: tuple[float, float], med: float) -> str:
        return f"{f.span(rng[0], rng[1], a.unit)} (median {f.num(med, a.unit)})"

    delta = f"{f.signed(r.delta, a.unit)} delta of the medians ({humanize.speed_text(r.ratio)})"
    return _row(a.metric, cell(r.baseline_range, r.baseline_median),
                cell(r.candidate_range, r.candidate_median), delta,
                f"{r.n[0]} vs {r.n[1]} runs", a.note)


def _counts_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    k = {arm: a.values[arm][0] for arm in PAIRED_ARMS}
    n = a.n
    if not all(n[arm] for arm in PAIRED_ARMS):
        return _row(a.metric, f"{k[BASELINE]}/{n[BASELINE]}",
                    f"{k[CANDIDATE]}/{n[CANDIDATE]}", "n/a", "no calls in an arm", a.note)
    share = a.shares()
    cells = [f"{k[arm]}/{n[arm]} released ({f.share(share[arm])})" for arm in PAIRED_ARMS]
    return _row(a.metric, cells[0], cells[1], f.pp(a.share_change_pp()),
                f"{n[BASELINE]} vs {n[CANDIDATE]} calls", a.note)


def _single_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    r = a.result
    return _row(a.metric, f.num(r.baseline, a.unit), f.num(r.candidate, a.unit),
                f"{f.signed(r.delta, a.unit)}{f.pct(r.relative)}", "1 per arm", a.note)


def _pairs_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    r = a.result
    verdict = a.detail.get("verdict")
    note = f"{verdict} {a.note}" if verdict else a.note
    if r.n == 1:
        return _row(a.metric, f.num(r.baseline_median, "s"), f.num(r.candidate_median, "s"),
                    f"{f.signed(r.delta, 's')}{f.pct(r.relative)}", "1 pair", note)
    return _row(a.metric, f"median {f.num(r.baseline_median, 's')}",
                f"median {f.num(r.candidate_median, 's')}",
                f"median of the paired deltas {f.signed(r.delta, 's')}{f.pct(r.relative)}",
                f"{r.n} pairs" + _stopped(a), note)


def _stopped(a: Attribution) -> str:
    """", stopped after k of N pairs" for a run recorded with --stop-when-decided."""
    seq = a.detail.get("sequential") or {}
    return (f", stopped after {seq['stopped_after']} of {seq['max_pairs']} pairs"
            if "stopped_after" in seq else "")


def _aa_row(a: Attribution, f: _Numbers = _PEOPLE) -> dict[str, str]:
    r = a.result
    med = a.slot_medians()
    cv = "" if r.cv is None else f", CV {f.share(r.cv)}"
    return _row(a.metric, f"slot A: median {f.num(med['A'], a.unit)}",
                f"slot B: median {f.num(med['B'], a.unit)}",
                f"median |delta| {f.num(r.spread, a.unit)}, largest {f.num(r.max_abs, a.unit)}"
                f"{cv}", f"{r.n} A/A pairs", a.note)


def _errors_row(errors: Attribution, oom: Attribution | None,
                f: _Numbers = _PEOPLE) -> dict[str, str]:
    cells = []
    for arm in PAIRED_ARMS:
        if not errors.n.get(arm) and (oom is None or not oom.n.get(arm)):
            cells.append("— (no runs in this arm)")
            continue
        o = None if oom is None else oom.values[arm][0]
        cells.append(f"{errors.values[arm][0]} telemetry errors, "
                     f"{'n/a' if o is None else o} OOM")
    return _row("telemetry errors, OOM", cells[0], cells[1], "—",
                f"{errors.n[BASELINE]} vs {errors.n[CANDIDATE]} calls", errors.note)


_RENDER = {"description": _description_row, "groups": _groups_row, "counts": _counts_row,
           "single": _single_row, "pairs": _pairs_row, "aa": _aa_row}
ROW_ORDER = ("normal_call_per_rank", "normal_call_per_run", "normal_released",
             "forced_released", "telemetry_errors", "idle_intersection", "all_rank_idle",
             "preparation_window", "e2e_profiled", "e2e_unprofiled", "e2e_aa")
_USED = {"description": "description", "groups": "groups", "pairs": "pairs",
         "counts": "counts", "single": "single", "aa": "aa"}


def _title(name: str, device_kind: str, injection: str = "none") -> str:
    label = (f": {devices.label(device_kind, injection)}"
             if devices.emulated(device_kind) or injection != "none" else "")
    return f"Evidence: {name} (device kind {device_kind}{label})"


def _footer(used: set, extra: str = "") -> str:
    tests = "; ".join(_TESTS[k] for k in _TESTS if k in used)
    return ("Units: ms = milliseconds, s = seconds, pp = percentage points; every number carries "
            "its unit. n: ranks per arm for per-rank rows (each rank's median per call), runs per "
            "arm for per-run rows (each run's median per call), calls "
            "per arm for counts, pairs for E2E"
            + (" (A/A pairs for the noise row)" if "aa" in used else "")
            + ", 1 per arm for single observations. Tests: "
            f"{tests or 'none'}; 5 % level. {extra}").strip()


def _frame(rows: list, title: str, device_kind: str, footer: str,
           attributions: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs.update(title=title, device_kind=device_kind, footer=footer,
                    attributions=attributions or [])
    return df


def evidence_table(run: Run | Evidence, *, idle: Mapping[str, Mapping[str, float]] | None = None,
                   idle_error: str | None = None, aa: Run | str | Path | None = None
                   ) -> pd.DataFrame:
    """The evidence table of a run: one row per attribution of its `Evidence`.

    `run` is a loaded run (its evidence is built here, traces analysed) or an `Evidence`
    already built. `idle`/`idle_error` replace the trace analysis (see
    `residency.evidence.build`); `aa` (an A/A run) adds its E2E noise row. Title, device
    kind, footer and each row's attribution (JSON-ready, same order as the rows) are in
    `DataFrame.attrs`.
    """
    extra = {} if aa is None else {"aa": aa}
    ev = run if isinstance(run, Evidence) else build_evidence(run, idle=idle,
                                                             idle_error=idle_error, **extra)
    used: set[str] = set()
    rows, docs, full = [], [], []
    for key in ROW_ORDER:
        a = ev.get(key)
        if a is None:
            if key == "idle_intersection" and ev.idle_error:
                for metric in ("normal-release markers ∩ all-rank no-device-task time",
                               "all-rank no-device-task time"):
                    rows.append(_row(metric, "n/a", "n/a", "n/a", "0",
                                     f"Trace analysis unavailable: {ev.idle_error}."))
                    full.append(rows[-1])
                    docs.append({"key": key, "missing": ev.idle_error})
                    break
            continue
        if a.kind == "tally":  # telemetry errors and OOM share a row
            rows.append(_errors_row(a, ev.get("oom")))
            full.append(_errors_row(a, ev.get("oom"), _FULL))
        else:
            rows.append(_RENDER[a.kind](a))
            full.append(_RENDER[a.kind](a, _FULL))
            used.add(_USED[a.kind] if a.kind != "pairs" or a.n[BASELINE] > 1 else "single")
        docs.append(a.to_dict())
    aa = ev.get("e2e_aa")
    design = (f" A/A run: the {aa.detail['arm']} arm in both slots, so only the noise row "
              "compares; the other arm's column is empty by design." if ev.design == "aa"
              and aa is not None else "")
    table = _frame(rows, _title(ev.name, ev.device_kind, ev.injection), ev.device_kind,
                   _footer(used, ev.assignment_note + design
                           + (f" Run digest: {ev.digest}." if ev.digest else
                              " The run is not sealed.")), docs)
    table.attrs["full_rows"] = full  # the same cells at full precision: CSV and JSON
    # the footer without the runs' assignment note, for a page that says that note already
    table.attrs["legend"] = _footer(used, (f"Run digest: {ev.digest}." if ev.digest else
                                           "The run is not sealed."))
    return table


# ----------------------------------------------------------------------------- published
def _published_cell(value: Any, unit: str, decimals: int) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return f"{value[0]:.{decimals}f}{humanize.DASH}{value[1]:.{decimals}f} {unit}"
    if isinstance(value, dict) and "k" in value:
        return f"{value['k']}/{value['n']} {unit}"
    if isinstance(value, dict):  # a tally: name -> count or {"k", "n"}
        return ", ".join(f"{v['k']}/{v['n']} {k}" if isinstance(v, dict) else f"{v} {k}"
                         for k, v in value.items())
    return f"{value:.{decimals}f} {unit}"


def _published_delta(row: Mapping[str, Any]) -> str:
    b, c, unit, d = row[BASELINE], row[CANDIDATE], row.get("unit", ""), row["decimals"]
    if isinstance(b, (int, float)) and isinstance(c, (int, float)):
        which = " delta of the medians" if row.get("pairs", 1) > 1 else ""
        rel = published.change_percent(row)
        pct = f" ({published_percent(rel)})" if rel is not None else ""
        return f"{published.change(row):+.{d}f} {unit}{which}{pct}"
    if isinstance(b, list) and isinstance(c, list):
        lo, hi = published.speedup_range(row)
        return f"{lo:.1f}x-{hi:.1f}x faster (any rank vs any rank)"
    if isinstance(b, dict) and "k" in b:
        return f"{published.share_change_pp(row):+.1f} pp"
    return "—"


def _published_note(row: Mapping[str, Any]) -> str:
    kind, note = row["kind"], row.get("note", "")
    if kind == "range" and published.ranges_apart(row):
        stat = (f"Ranges do not overlap: every rank, in this run pair ({row['n_baseline']} vs "
                f"{row['n_candidate']} ranks of one run each): a description, not a test; "
                f"ranks of one run are not independent replicates.")
    elif kind == "count":
        ps = published.proportions(row)
        stat = "Clopper-Pearson 95 %: " + ", ".join(
            f"{a} {humanize.percent_span(*p.ci)}" for a, p in ps.items()) + "."
    elif kind == "value" and row.get("pairs", 1) > 1:
        stat = (f"Medians of {row['pairs']} pairs; the pairs themselves are not published. "
                + notes.pairs_floor_note(row["pairs"]))
    elif kind == "value":
        stat = notes.SINGLE
    else:  # tally
        ps = published.proportions(row)
        stat = "Clopper-Pearson 95 %: " + ", ".join(
            f"{k} {humanize.percent_span(*p.ci)}" for k, p in ps.items()) + "."
    return f"{stat} {note}".strip()


def published_table(path: str | Path | None = None) -> pd.DataFrame:
    """The published NPU figures (package data `residency/data/h3_ref2va_910b1.json`, or
    `path`) in the evidence-table format.

    Raises:
        ValueError: the file is missing or not the expected JSON.
    """
    try:
        if path is None:
            p: Any = resources.files("residency.data").joinpath(PUBLISHED_NAME)
            data = json.loads(p.read_text(encoding="utf-8"))
        else:
            p = Path(path)
            data = json.loads(p.read_text(encoding="utf-8"))
        rows = [_row(r["metric"], _published_cell(r[BASELINE], r.get("unit", ""),
                                                  r["decimals"]),
                     _published_cell(r[CANDIDATE], r.get("unit", ""), r["decimals"]),
                     _published_delta(r), r["n"], _published_note(r)) for r in data["rows"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{p}: cannot read published figures ({type(exc).__name__}: {exc})"
                         ) from None
    used = {"counts", "single", "description"}
    return _frame(rows, _title(data["title"], data["device_kind"]), data["device_kind"],
                  _footer(used, f"Source: {data['source']}."))


# ----------------------------------------------------------------------------- formatters
def to_markdown(table: pd.DataFrame, *, title: str | None = None) -> str:
    """A Markdown table ready to paste into a pull request, with title and footer: the
    table's cells as written, for people (4 significant digits, formatted once by
    `residency.humanize`; published figures at their published precision); `to_csv` and
    `to_json` write the same rows at full precision."""
    title = title if title is not None else table.attrs.get("title", "Evidence")
    lines = [f"### {md_line(title)}", "",  # (it names the run: run text, inert)
             write_markdown_table(list(table.columns),
                                  list(table.itertuples(index=False))).rstrip()]
    if table.attrs.get("footer"):
        lines += ["", f"*{table.attrs['footer']}*"]
    return "\n".join(lines) + "\n"


def _full(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with its cells at full precision where it carries them (`attrs["full_rows"]`
    of an evidence table)."""
    full = table.attrs.get("full_rows")
    if not full or len(full) != len(table):
        return table
    out = pd.DataFrame(full, columns=list(table.columns))
    out.attrs.update({k: v for k, v in table.attrs.items() if k != "full_rows"})
    return out


def to_csv(table: pd.DataFrame) -> str:
    """The table as CSV text (header row, no index, full precision; text a spreadsheet would
    run as a formula neutralised: `humanize.csv_text`)."""
    return csv_text(_full(table))


def to_json(table: pd.DataFrame) -> str:
    """The table as one JSON object: title, device_kind, footer, rows (full precision); each
    row of an evidence table also carries `attribution` (its key, values, n, unit,
    statistical unit, scope, p-value and note as numbers:
    `residency.evidence.Attribution.to_dict`)."""
    rows = _full(table).to_dict(orient="records")
    docs = table.attrs.get("attributions") or []
    if len(docs) == len(rows):
        rows = [{**r, "attribution": d} for r, d in zip(rows, docs, strict=True)]
    doc = {**{k: table.attrs.get(k) for k in ("title", "device_kind", "footer")}, "rows": rows}
    return json.dumps(plain(doc), indent=2, ensure_ascii=False)


def render(tables: list[pd.DataFrame], fmt: str) -> str:
    """`tables` as one text in `fmt` (md, csv or json: one object, or a list of them)."""
    if fmt == "md":
        return "\n".join(to_markdown(t) for t in tables)
    if fmt == "json":
        docs = [json.loads(to_json(t)) for t in tables]
        return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, ensure_ascii=False)
    return "\n".join(to_csv(t) for t in tables)
