"""The first screen of a paired report, and the same summary as the pull request's "Test
Result" block, rendered from a run's `residency.evidence.Evidence` (nothing is computed here
that the evidence does not hold, beyond the shares of E2E).

Like pyperf `compare_to` or criterion's summary: one short row per attribution (baseline,
candidate, change with its ratio or %, n with its unit of analysis, verdict in a few
words), then the E2E verdict with its relative size, scope and n, a line on what the run can
and cannot say about an NPU, and warnings that quote their numbers (emulated shares of E2E
that differ from the published ones by more than `TRANSFER_FACTOR`, a loaded host, a
foreign process on the devices: `residency.rundir.neighbours`). Notes,
one per attribution and a few sentences each, follow separately. Every number shown has 4
significant digits. No torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from residency import devices, humanize
from residency.analysis import stats
from residency.evidence import PAIRED_ARMS, Attribution, Evidence, derived
from residency.evidence.derived import Share
from residency.humanize import md_code, md_text
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir import hostload, neighbours

TRANSFER_FACTOR = 10.0
"""Emulated and published shares of E2E further apart than this factor: the emulated E2E
effect does not transfer to the NPU, and the first screen says so."""
PUBLISHED_NAME = "h3_ref2va_910b1.json"
COLUMNS = ("attribution", BASELINE, CANDIDATE, "change", "n (unit of analysis)", "verdict")

__all__ = ["COLUMNS", "TRANSFER_FACTOR", "Row", "Share", "Summary", "first_screen_markdown",
           "notes_markdown", "pr_markdown", "published_figures", "summarize"]


@dataclass(frozen=True)
class Row:
    """One attribution on the first screen; `note` is its few-sentence note."""

    key: str
    attribution: str
    baseline: str
    candidate: str
    change: str
    n: str
    verdict: str
    note: str


@dataclass(frozen=True)
class Summary:
    """The first screen of one run: rows, the E2E line, the NPU line, warnings."""

    run: str
    device_kind: str
    label: str
    rows: tuple[Row, ...]
    e2e: str
    npu: str
    warnings: tuple[str, ...] = ()
    shares: tuple[Share, ...] = ()
    host: str = ""
    digest: str | None = None
    scope: str = ""  # how decisions were attributed, warm-ups (one summary for all runs)
    host_load: Mapping[str, Any] | None = field(default=None)
    neighbours: str = ""  # the devices' other processes, one sentence

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, rows as dicts."""
        return {"run": self.run, "device_kind": self.device_kind, "label": self.label,
                "rows": [r.__dict__ for r in self.rows], "e2e": self.e2e, "npu": self.npu,
                "warnings": list(self.warnings), "host": self.host,
                "neighbours": self.neighbours, "digest": self.digest,
                "scope": self.scope,
                "shares": [{**s.__dict__, "factor": s.factor} for s in self.shares]}


# ----------------------------------------------------------------------------- helpers
def _q(x: float | None, unit: str = "", *, sign: bool = False) -> str:
    return humanize.quantity(x, unit, sign=sign)


_pct, _ratio_words, _p = humanize.change_percent, humanize.ratio_text, humanize.p_text


def published_figures() -> dict[str, Any]:
    """The published NPU figures (package data `residency/data/h3_ref2va_910b1.json`) by
    metric."""
    text = resources.files("residency.data").joinpath(PUBLISHED_NAME).read_text(
        encoding="utf-8")
    data = json.loads(text)
    return {"title": data.get("title", ""), "rows": {r["metric"]: r for r in data["rows"]}}


def _published(prefix: str) -> Mapping[str, Any] | None:
    try:
        rows = published_figures()["rows"]
    except (OSError, ValueError, KeyError):
        return None
    return next((r for m, r in rows.items() if m.startswith(prefix)), None)


# ----------------------------------------------------------------------------- rows
def _normal_call_row(ev: Evidence) -> Row | None:
    runs = ev.get("normal_call_per_run")
    if runs is not None:
        r = runs.result
        word = runs.detail.get("runs_kind", "")
        b, c = r.baseline_median, r.candidate_median
        vb, vc = runs.values[BASELINE], runs.values[CANDIDATE]
        direction = "faster" if c < b else "slower"
        sep = max(vc) < min(vb) or max(vb) < min(vc)
        floor = r.min_p
        verdict = (f"candidate {direction}, p = {_p(r.p_value)}" if r.p_value < stats.ALPHA
                   else f"not significant (p = {_p(r.p_value)}"
                   + (f", the smallest reachable with {r.n[0]} vs {r.n[1]} runs)"
                      if sep and r.p_value <= floor + 1e-12 else ")"))
        if sep:
            verdict = f"every candidate run {direction}; " + verdict
        other = "profiled" if word == "unprofiled" else "unprofiled"
        note = (f"Unit: the {word} run, each value its median per call over every normal call "
                f"of its ranks and measured requests ({r.n[0]} vs {r.n[1]} runs); "
                f"{r.test}, p = {_p(r.p_value)}. The {other} runs are not pooled with these; "
                "the profiled pair is described per rank in its own section.")
        return Row("normal_call", "normal-call duration, per call",
                   f"{_q(b, 'ms')} (runs {_q(min(runs.values[BASELINE]))}–"
                   f"{_q(max(runs.values[BASELINE]), 'ms')})",
                   f"{_q(c, 'ms')} (runs {_q(min(runs.values[CANDIDATE]))}–"
                   f"{_q(max(runs.values[CANDIDATE]), 'ms')})",
                   f"{_q(c - b, 'ms', sign=True)} ({_ratio_words(b, c)})",
                   f"{r.n[0]} vs {r.n[1]} {word} runs (a run's median per call)",
                   verdict, note)
    ranks = ev.get("normal_call_per_rank")
    if ranks is None:
        return None
    med = ranks.detail["medians"]
    b, c = med[BASELINE], med[CANDIDATE]
    vb, vc = ranks.values[BASELINE], ranks.values[CANDIDATE]
    every = max(vc) < min(vb)
    return Row("normal_call", "normal-call duration, per call",
               f"{_q(b, 'ms')} (ranks {_q(min(vb))}–{_q(max(vb), 'ms')})",
               f"{_q(c, 'ms')} (ranks {_q(min(vc))}–{_q(max(vc), 'ms')})",
               f"{_q(c - b, 'ms', sign=True)} ({_ratio_words(b, c)})",
               f"{ranks.n[BASELINE]} vs {ranks.n[CANDIDATE]} ranks of one run pair",
               ("every candidate rank faster" if every else
                "ranks overlap" if not max(vb) < min(vc) else "every candidate rank slower")
               + "; a description, no test",
               "Every rank of the one profiled pair, each rank's median per call: ranks of one "
               "run are not independent replicates, so no test.")


def _count_row(a: Attribution | None, key: str, name: str) -> Row | None:
    if a is None or not all(a.n.get(arm) for arm in PAIRED_ARMS):
        return None
    k = {arm: int(a.values[arm][0]) for arm in PAIRED_ARMS}
    n = {arm: int(a.n[arm]) for arm in PAIRED_ARMS}
    pp = a.share_change_pp()
    if k[BASELINE] == n[BASELINE] and k[CANDIDATE] == 0:
        verdict = "baseline released every call, candidate none"
    elif k[BASELINE] == n[BASELINE] and k[CANDIDATE] == n[CANDIDATE]:
        verdict = "every call released in both arms"
    else:
        verdict = f"{k[BASELINE]} of {n[BASELINE]} vs {k[CANDIDATE]} of {n[CANDIDATE]}"
    ci = ", ".join(f"{arm} {humanize.percent_span(*p.ci)}"
                   for arm, p in (a.result or {}).items())
    note = (f"Calls of all measured requests (warm-ups excluded), clustered in runs and ranks, "
            f"with Clopper-Pearson 95 % intervals {ci}. A deterministic rule on each call's "
            "memory state: this many of these calls, not a rate for other runs.")
    change = "unchanged" if pp == 0 and k[BASELINE] * n[CANDIDATE] == \
        k[CANDIDATE] * n[BASELINE] else f"{humanize.signed(pp)} pp"
    return Row(key, name, f"{k[BASELINE]}/{n[BASELINE]}", f"{k[CANDIDATE]}/{n[CANDIDATE]}",
               change, f"{n[BASELINE]} vs {n[CANDIDATE]} calls", verdict, note)


def _telemetry_row(ev: Evidence) -> Row | None:
    """Telemetry errors per arm: the bug's own signature (with the baseline on an NPU before
    the fix, every normal call's read fails and so it releases)."""
    a = ev.get("telemetry_errors")
    if a is None or not all(a.n.get(arm) for arm in PAIRED_ARMS):
        return None
    k = {arm: int(a.values[arm][0]) for arm in PAIRED_ARMS}
    normal = ev.get("normal_released")
    n = ({arm: int(normal.n[arm]) for arm in PAIRED_ARMS} if normal is not None
         else {arm: int(a.n[arm]) for arm in PAIRED_ARMS})
    what = "normal calls" if normal is not None else "calls"
    if k[BASELINE] and not k[CANDIDATE]:
        verdict = "the baseline's telemetry read failed, the candidate's never"
    elif not k[BASELINE] and not k[CANDIDATE]:
        verdict = "no telemetry error in either arm"
    else:
        verdict = f"{k[BASELINE]} vs {k[CANDIDATE]} failed reads"
    first = {arm: e for arm, e in (a.detail.get("first_error") or {}).items() if e}
    note = ("Policy calls whose telemetry read raised, over all measured requests (warm-ups "
            "excluded); each such normal call releases (the conservative path)."
            + "".join(f" First {arm} error: {e}." for arm, e in first.items()))
    return Row("telemetry_errors", "telemetry errors (a failed read releases)",
               f"{k[BASELINE]}/{n[BASELINE]} {what}", f"{k[CANDIDATE]}/{n[CANDIDATE]} "
               f"{what}", f"{humanize.signed(k[CANDIDATE] - k[BASELINE])} errors",
               f"{n[BASELINE]} vs {n[CANDIDATE]} {what}", verdict, note)


def _single_row(a: Attribution | None, key: str, name: str) -> Row | None:
    if a is None:
        return None
    r = a.result
    return Row(key, name, _q(r.baseline, a.unit), _q(r.candidate, a.unit),
               f"{_q(r.delta, a.unit, sign=True)}"
               + (f" ({_pct(r.relative)})" if r.relative is not None else ""),
               "1 profiled run per arm", "single observation, no test",
               f"From the profiled pair's traces ({a.source or 'trace analysis'}): one "
               "observation per arm, no interval or test.")


def _e2e_key(ev: Evidence) -> str | None:
    return next((k for k in ("e2e_unprofiled", "e2e_profiled") if k in ev), None)


def _requests_text(a: Attribution) -> str:
    per = list(a.detail.get("requests_per_run") or [])
    if per == [1]:
        return "each run: 1 measured request"
    if per:
        return f"each run: the median of its {'/'.join(map(str, per))} measured requests"
    return "each run: its measured requests"


def _e2e_row(ev: Evidence) -> Row | None:
    key = _e2e_key(ev)
    if key is None:
        return None
    a = ev[key]
    r = a.result
    word = "unprofiled" if key == "e2e_unprofiled" else "profiled"
    if r.n == 1:
        verdict = "one pair: no test"
    elif r.p_value is not None and r.p_value < stats.ALPHA:
        verdict = f"candidate {'faster' if r.delta < 0 else 'slower'}, p = {_p(r.p_value)}"
    else:
        reach = (f", 0.05 unreachable with {r.n} pairs" if r.min_p and r.min_p >= stats.ALPHA
                 else "")
        verdict = f"no verdict (p = {_p(r.p_value)}{reach})"
    eq = a.detail.get("equivalence")
    seq = a.detail.get("sequential") or {}
    if "stopped_after" in seq:  # the rule's claim, at its adjusted figures
        verdict = {"difference": f"candidate {'faster' if r.delta < 0 else 'slower'}",
                   "equivalent": "equivalent within ±2 %"}.get(seq["decision"], "no verdict")
        verdict += (f" (sequential: stopped after {seq['stopped_after']} of "
                    f"{seq['max_pairs']} pairs, adjusted p = {_p(seq['p_adjusted'])}"
                    + ("" if seq.get("p_equivalence_adjusted") is None else
                       f", adjusted TOST p = {_p(seq['p_equivalence_adjusted'])}") + ")")
        eq = None
    if eq and r.n > 1:
        verdict += {"equivalent": "; equivalent within ±2 %",
                    "not equivalent": "; not equivalent within ±2 %",
                    "cannot tell": "; equivalence: cannot tell"}[eq]
    change = f"{_q(r.delta, 's', sign=True)} ({_pct(r.relative)})"
    return Row("e2e", f"client E2E, {word} pairs",
               f"{_q(r.baseline_median, 's')}" + (" median" if r.n > 1 else ""),
               f"{_q(r.candidate_median, 's')}" + (" median" if r.n > 1 else ""),
               change + (" median paired delta" if r.n > 1 else ""),
               f"{r.n} pair{'s' if r.n != 1 else ''} ({_requests_text(a)})", verdict,
               _e2e_note(a))


def _e2e_note(a: Attribution) -> str:
    r = a.result
    d = a.detail
    parts = [d["sequential"]["text"] + " Unadjusted figures of the last look (not the "
             "claim):"] if "text" in (d.get("sequential") or {}) else []
    if r.n > 1:
        parts.append(f"{r.test[0].upper()}{r.test[1:]} on {r.n} paired deltas (candidate − "
                     f"baseline, pair i = the i-th run of each arm, ABBA order): p = "
                     f"{_p(r.p_value)}, the smallest reachable {_p(r.min_p)}.")
        if r.ci is not None:
            parts.append(f"{humanize.percent(r.ci_coverage)} interval for the median delta "
                         f"{humanize.span_text(r.ci[0], r.ci[1], 's')} (deltas {r.ci_order[0]} and "
                         f"{r.ci_order[1]} of {r.n} in order; exact binomial coverage).")
        else:
            parts.append(f"No interval below {stats.MIN_CI_PAIRS} pairs.")
    else:
        parts.append("One pair: a single observation, no interval or test.")
    if "equivalence_margin_s" in d:
        parts.append(f"TOST against ±{_q(d['equivalence_margin_s'], 's')} (2 % of the "
                     f"baseline median {_q(d['baseline_median_s'], 's')}): "
                     f"{d['equivalence']}.")
    rev, out = d.get("reversed_pairs") or (), d.get("outlier_pairs") or ()
    deltas = dict(zip(a.labels.get(BASELINE, ()), d.get("deltas_s") or (), strict=False))
    if r.n > 1:
        parts.append("Reversed pairs: " + (", ".join(f"{p} ({_q(deltas.get(p), 's', sign=True)})"
                                                    for p in rev) or "none") + "; outliers: "
                     + (", ".join(f"{p} ({_q(deltas.get(p), 's', sign=True)})" for p in out)
                        or "none") + ".")
    if "aa_spread_s" in d:
        parts.append(f"A/A noise ({d.get('aa_run')}): median |delta| "
                     f"{_q(d['aa_spread_s'], 's')}; |median delta| "
                     f"{_q(abs(r.delta), 's')}.")
    return " ".join(parts)


# ----------------------------------------------------------------------------- shares
def _share_text(s: Share) -> str:
    return (f"{s.name}: {humanize.percent(s.emulated)} of the baseline's E2E here, "
            f"{humanize.percent(s.published)} in the published NPU run ({s.published_scope})")


# ----------------------------------------------------------------------------- summary
def _scope(ev: Evidence, a: Attribution | None, manifest: Mapping[str, Any]) -> str:
    params = manifest.get("params") or {}
    service = "built-in service" if (ev.service or {}).get("kind") == "builtin" else \
        f"service {md_text((ev.service or {}).get('name') or 'external')}"
    bits = [service]
    for k, unit in (("ranks", "rank"), ("steps", "step")):
        if params.get(k) is not None:
            bits.append(f"{params[k]} {unit}{'' if params[k] == 1 else 's'}")
    if a is not None:
        bits.append(_requests_text(a))
    return ", ".join(bits)


def _npu_line(kind: str, injection: str = "none") -> str:
    if devices.emulated(kind):
        return ("**What this says about an NPU**: the mechanism (which query answers, which "
                "calls release, where the release time goes), not its size: durations here are "
                "host-memory costs of the emulated NPU, per call and E2E.")
    if kind == "npu":
        return "**Device**: measured on an Ascend NPU (see the banner for the host and versions)."
    if injection != "none":
        return (f"**Device**: measured on {devices.label(kind, injection)}: the baseline's "
                "generic torch.accelerator queries were made to raise as torch-npu <= 2.12 "
                "does, so its normal calls release as on that NPU; the release costs are this "
                "device's, not what an NPU would measure.")
    return (f"**Device**: measured on {devices.label(kind)}: it says how the fix behaves "
            "there, not what an NPU would measure.")


def summarize(ev: Evidence, *, manifest: Mapping[str, Any] | None = None) -> Summary:
    """The first screen of `ev`; `manifest` (the run's) adds the scope and the host load."""
    m = manifest or {}
    rows = [r for r in (
        _normal_call_row(ev),
        _count_row(ev.get("normal_released"), "normal_released",
                   "normal calls that released cache"),
        _count_row(ev.get("forced_released"), "forced_released",
                   "forced releases that released"),
        _telemetry_row(ev),
        _single_row(ev.get("idle_intersection"), "idle_intersection",
                    "normal-release markers ∩ all-rank no-device-task time, profiled pair"),
        _e2e_row(ev)) if r is not None]
    key = _e2e_key(ev)
    a = ev.get(key) if key else None
    if a is None:
        e2e = "**E2E**: no verdict — this run has no complete baseline/candidate pair."
    else:
        sentence = a.detail.get("verdict") or (
            f"Single observation: median paired delta {_q(a.result.delta, 's', sign=True)} "
            f"({_pct(a.result.relative)}), no test with one pair.")
        word = "unprofiled" if key == "e2e_unprofiled" else "profiled"
        e2e = (f"**E2E** ({a.result.n} {word} pair{'s' if a.result.n != 1 else ''}; "
               f"{_scope(ev, a, m)}; {ev.label}): {sentence}")
    warnings = []
    shares = derived.shares(ev, _published) if devices.emulated(ev.device_kind) else ()
    far = [s for s in shares if s.factor > TRANSFER_FACTOR]
    if far:
        warnings.append("**The emulated E2E effect does not transfer to the NPU**: "
                        + "; ".join(_share_text(s) for s in far) + ".")
    load = m.get("host_load") if isinstance(m.get("host_load"), Mapping) else None
    if load is None:
        load = hostload.summarize([r.get("host_load") for r in m.get("runs") or []
                                   if isinstance(r, Mapping)])
    host = hostload.describe(load)
    if hostload.loaded(load):
        warnings.append(f"**Loaded host**: {host.removeprefix('Host: ')}")
    near = m.get("neighbours") if isinstance(m.get("neighbours"), Mapping) else None
    if near is None:
        near = neighbours.summarize([(r.get("dir"), r.get("neighbours"))
                                     for r in m.get("runs") or [] if isinstance(r, Mapping)])
    near_text = neighbours.describe(near)
    if neighbours.seen(near):
        warnings.append("**Not alone on the device**: "
                        + md_text(near_text.removeprefix("Device neighbours: ")))
    return Summary(run=ev.name, device_kind=ev.device_kind, label=ev.label, rows=tuple(rows),
                   e2e=e2e, npu=_npu_line(ev.device_kind, ev.injection), warnings=tuple(warnings),
                   shares=shares, host=host, digest=ev.digest, scope=ev.assignment_note,
                   host_load=load, neighbours=near_text)


# ----------------------------------------------------------------------------- rendering
def _table(rows: Sequence[Row]) -> str:
    from residency.humanize import write_markdown_table as markdown_table

    return markdown_table(list(COLUMNS), [(r.attribution, r.baseline, r.candidate, r.change,
                                           r.n, r.verdict) for r in rows])


def first_screen_markdown(s: Summary) -> str:
    """Markdown for the top of the report: the E2E line, the NPU line, the table of
    attributions and the warnings."""
    parts = [s.e2e, s.npu, _table(s.rows).rstrip(), *s.warnings]
    return "\n\n".join(parts) + "\n"


def notes_markdown(s: Summary) -> str:
    """Markdown: one short note per attribution of the first screen, then the run's scope
    (attribution of decisions, warm-ups) and host load, once."""
    said: set[str] = set()
    lines = []
    for r in s.rows:  # a sentence an earlier note said (the counts' shared one) is said once
        kept = [x for x in _SENTENCE_END.split(r.note) if x not in said]
        said.update(kept)
        lines.append(f"* **{md_text(r.attribution)}**: {md_text(' '.join(kept))}")
    lines.append(f"* **Runs**: {md_text(s.scope)}")
    if not _loaded(s):  # a loaded host is a warning on the first screen: said there only
        lines.append(f"* **Host**: {md_text(s.host.removeprefix('Host: '))}")
    if s.neighbours:
        lines.append("* **Device neighbours**: "
                     + md_text(s.neighbours.removeprefix("Device neighbours: ")))
    return "\n".join(lines) + "\n"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(])")


def _loaded(s: Summary) -> bool:
    return any(w.startswith("**Loaded host**") for w in s.warnings)


def pr_markdown(s: Summary, *, run_dir: str | None = None) -> str:
    """The pull request's "Test Result" block, pasted into GitHub as shown: one bullet per
    attribution with both arms, the change, n and the verdict (the telemetry errors per arm
    among them); the E2E line, the NPU line, each warning and the host load (once: a loaded
    host is a warning) as paragraphs apart; device kind and the run's digest (with the
    command that checks it), code in backticks only."""
    head = f"#### Test Result ({s.device_kind}: {s.label})"
    bullets = [f"* {r.attribution[0].upper()}{r.attribution[1:]}: baseline {r.baseline}, "
               f"candidate {r.candidate}; change {r.change}; n = {r.n}; {r.verdict}."
               for r in s.rows]
    where = run_dir or s.run
    digest = (f"Run {md_code(where)}, digest {md_code(s.digest)} (check: "
              f"{md_code(f'residency verify {where} --digest {s.digest}')})." if s.digest else
              f"Run {md_code(where)} (not sealed: no digest to quote).")
    tail = [f"Device kind: {md_code(s.device_kind)} ({s.label}). {digest} Regenerate this block "
            f"with {md_code(f'residency tables {where} --format pr')}."]
    paragraphs = [head, "\n".join(bullets), s.e2e, s.npu, *s.warnings,
                  *([] if _loaded(s) else [s.host]),
                  *([md_text(s.neighbours)] if s.neighbours else []), *tail]
    return "\n\n".join(paragraphs) + "\n"  # GitHub: a blank line between paragraphs

