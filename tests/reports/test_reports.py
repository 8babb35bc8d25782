"""Reports a reviewer accepts at a glance (issue 15): numbers for people (`humanize`), the
banner (`banner`), full-page screenshots and the index (`reports`), the new figures
(`report_figures`, `timeline`) and terminal progress (`progress`)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from residency import humanize
from residency.evidence import whatif as whatif_effect
from residency.humanize import duration_text
from residency.notebook.progress import RunProgress, pair_labels
from residency.records.decisions import decisions_file
from residency.records.files import RunReading
from residency.records.manifest import read_manifest, write_manifest
from residency.reports import banner
from residency.reports import html as reports
from residency.rundir.assignment import assigned_decisions
from tests.helpers import ROOT
from tests.reading import LABEL, BodyTags, too_precise, visible_text

RECORDED = ROOT / "data" / "runs" / "emulated-paired-profile-2r50s"
def test_checkers_find_what_they_should() -> None:
    assert too_precise("61.428477-163.008423 ms and 1.734383532999999") == [
        "61.428477", "163.008423", "1.734383532999999"]
    assert too_precise("221.3 ms, 16/16, commit 373b24198740, 20261201T013304Z, 2048") == []
    assert visible_text("<html><head><title>x 1</title><style>p{}</style></head><body>"
                        "<script>1</script><p> first </p><p>second</p></body></html>") == [
        "first", "second"]


# ----------------------------------------------------------------------------- humanize
@dataclass(frozen=True)
class Sig:
    value: object
    text: str


@pytest.mark.parametrize("case", [
    Sig(1.734383532999999, "1.734"), Sig(2248.795837, "2249"), Sig(221.29668, "221.3"),
    Sig(3.16455, "3.165"), Sig(0.000123456, "0.0001235"), Sig(0.0000123456, "1.235e-05"),
    Sig(0.00123456, "0.001235"),
    Sig(1.5, "1.5"), Sig(100.0, "100"), Sig(-4.31287, "-4.313"), Sig(0.0, "0"),
    Sig(22487.9, "22488"), Sig(12_345_678.0, "1.235e+07"), Sig(None, "—"),
    Sig(float("nan"), "—"), Sig(np.float32(0.1), "0.1"), Sig(-0.00001, "-1.000e-05"),
], ids=lambda c: repr(c.value))
def test_sig_gives_four_significant_digits(case: Sig) -> None:
    assert humanize.sig(case.value) == case.text
    assert not too_precise(humanize.sig(case.value))


def test_units_ranges_bytes_and_headers() -> None:
    assert humanize.ms_from_ns(61428477) == "61.43 ms"
    assert humanize.span_text(216.822, 251.161, "ms") == "216.8–251.2 ms"
    assert humanize.span_text(1.3341, 1.3344, "ms") == "1.334 ms"
    assert humanize.bytes_text(805306368) == "768 MiB"
    assert humanize.bytes_text(1887440896) == "1.758 GiB"
    assert humanize.bytes_text(0) == "0 B"
    assert humanize.percent(0.25) == "25 %"
    assert humanize.header("normal_checks") == "normal checks"
    assert humanize.header("e2e_s") == "E2E (s)"
    assert humanize.header("duration_ms") == "duration (ms)"
    assert humanize.header("baseline (ms)") == "baseline (ms)"


def test_for_people_drops_the_index_and_raw_containers() -> None:
    df = pd.DataFrame({"normal_checks": [1, 2], "e2e_s": [1.734383532999999, np.nan],
                       "snapshot": [{"reserved": 0, "allocated": 0}, None],
                       "runs": [["00-baseline", "01-candidate"], []]},
                      index=pd.Index([0, 1], name="rank"))
    out = humanize.for_people(df)
    assert list(out.columns) == ["rank", "normal checks", "E2E (s)", "snapshot", "runs"]
    assert out.iloc[0].tolist() == ["0", "1", "1.734", "reserved 0, allocated 0",
                                    "00-baseline, 01-candidate"]
    assert out.iloc[1].tolist() == ["1", "2", "—", "—", "—"]
    html = humanize.html_table(df)
    assert "<th" in html and "{" not in html and "[" not in html
    assert "1.734383532999999" not in humanize.markdown_table(df)
    plain = humanize.for_people(pd.DataFrame({"a_ms": [1.0]}))  # unnamed range index: dropped
    assert list(plain.columns) == ["a (ms)"]


# ----------------------------------------------------------------------------- banner
def _recorded_ms(key: str, scale: float = 1.0) -> dict[str, str]:
    """The recorded paired run's attribution `key` per arm in ms, as people read it (computed
    by the evidence model, independent of the figure and table code under test)."""
    from residency.evidence import build
    from residency.humanize import sig
    from residency.rundir.run import load_run

    values = build(load_run(RECORDED))[key].to_dict()["values"]
    return {arm: sig(v[0] * scale) for arm, v in values.items()}


def _manifest() -> dict:
    return read_manifest(RECORDED)


def test_banner_says_the_device_kind_before_any_number() -> None:
    m = _manifest()
    html = banner.banner_html(m)
    texts = visible_text(html)
    assert texts[0] == f"emulated-npu: {LABEL}"
    assert not re.search(r"\d", texts[0])
    prov = " ".join(texts[1:])
    took_s = round((datetime.fromisoformat(m["ended_at"])
                    - datetime.fromisoformat(m["started_at"])).total_seconds())
    took = f"{took_s // 60} min {took_s % 60:02d} s" if took_s >= 60 else f"{took_s} s"
    for part in (m["versions"]["git_commit"][:12], m["versions"]["torch"], m["host"],
                 m["started_at"], m["ended_at"], f"({took})"):
        assert part in prov
    assert banner.banner_line(m).startswith(f"emulated-npu: {LABEL} · paired-profile")
    md = banner.banner_markdown(m)
    assert md.splitlines()[0] == f"**emulated-npu: {LABEL}**"
    npu = banner.banner_html({**m, "device_kind": "npu"})
    assert visible_text(npu)[0] == "npu: Ascend NPU" and LABEL not in npu


def test_banner_tolerates_a_sparse_manifest() -> None:
    lines = banner.provenance_lines({"device_kind": "cuda"})
    assert lines == ["commit not recorded, residency none, torch none",
                     "host not recorded, start not recorded to end not recorded"]


# ----------------------------------------------------------------------------- reports
def _banner_notebook(path: Path, manifest: dict) -> Path:
    out = nbformat.v4.new_output(
        "display_data", data={"text/html": banner.banner_html(manifest),
                              "text/plain": banner.banner_line(manifest)},
        metadata={banner.BANNER_METADATA: True})
    book = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Paired profile 12.3456789"),
        nbformat.v4.new_code_cell("params()", execution_count=1, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="checked\n"), out]),
    ])
    nbformat.write(book, path)
    return path


def test_rendered_report_starts_with_the_banner(tmp_path: Path) -> None:
    src = _banner_notebook(tmp_path / "paired_profile.ipynb", _manifest())
    html = reports.render_html(src, tmp_path / "out").read_text()
    texts = visible_text(html)
    assert texts[0] == f"emulated-npu: {LABEL}", texts[:3]
    assert texts.index("Paired profile 12.3456789") > 0
    head, body = html.split("</head>", 1)
    assert body.count(f"emulated-npu: {LABEL}") == 1  # moved, not copied
    assert f"<title>paired profile — emulated-npu: {LABEL}</title>" in head  # issue 25


def test_index_lists_every_report_with_its_banner(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from residency.cli.main import main

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _banner_notebook(nbs / "paired_profile.ipynb", _manifest())
    _banner_notebook(nbs / "npu_run.ipynb", {**_manifest(), "device_kind": "npu"})
    plain = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "1", execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout",
                                                                text="1\n")])])
    nbformat.write(plain, nbs / "other.ipynb")
    assert main(["report", str(nbs), "--out", str(tmp_path / "out")]) == 0
    index = tmp_path / "out" / "index.html"
    assert capsys.readouterr().out.splitlines()[-1] == str(index.resolve())
    text = index.read_text()
    for name in ("paired_profile.html", "npu_run.html", "other.html"):
        assert f'href="{name}"' in text
    assert f"emulated-npu: {LABEL}" in text and "npu: Ascend NPU<" in text
    assert "no banner: not a residency report" in text
    assert reports.banner_of(tmp_path / "out" / "npu_run.html")[0] == "npu: Ascend NPU"


def test_index_of_an_empty_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(reports.ReportError, match="holds no rendered report"):
        reports.write_index(tmp_path)


needs_chromium = pytest.mark.skipif(reports.find_chromium() is None,
                                    reason="no Chromium (apt-get install chromium)")


@needs_chromium
def test_screenshot_covers_the_whole_page(tmp_path: Path) -> None:
    page = tmp_path / "tall.html"
    page.write_text('<html><body style="margin:0"><div style="height:5321px;'
                    'background:linear-gradient(red,blue)">top</div></body></html>')
    shot = reports.capture(page, tmp_path / "tall.png")
    assert shot.page_height_px == 5321
    assert [reports.png_size(p) for p in shot.paths] == [(1280, 5321)]  # not the old 2400
    sliced = reports.capture(page, tmp_path / "sliced.png", max_height_px=2000)
    assert [p.name for p in sliced.paths] == ["sliced.png", "sliced-2.png", "sliced-3.png"]
    assert [reports.png_size(p)[1] for p in sliced.paths] == [2000, 2000, 1321]
    again = reports.capture(page, tmp_path / "sliced.png")  # old slices are removed
    assert not (tmp_path / "sliced-2.png").exists() and len(again.paths) == 1


def test_screenshot_without_chromium_is_one_error(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    with pytest.raises(reports.ReportError, match="Chromium"):
        reports.capture(page, tmp_path / "p.png", chromium="/bin/false", timeout_s=20)


# ----------------------------------------------------------------------------- figures
@pytest.fixture(scope="module")
def timelines() -> tuple:
    from residency.analysis.timeline import arm_timeline
    from residency.traces.load import load_traces

    return tuple(arm_timeline(load_traces(RECORDED / "runs" / d / "trace", cache=False),
                              arm=a, device_kind="emulated-npu")
                 for d, a in (("00-baseline", "baseline"), ("01-candidate", "candidate")))


def test_timeline_data_agrees_with_the_idle_analysis(timelines: tuple) -> None:
    from residency.analysis.idle import idle_summary
    from residency.traces.load import load_traces

    for t, d in zip(timelines, ("00-baseline", "01-candidate"), strict=True):
        s = idle_summary(load_traces(RECORDED / "runs" / d / "trace", cache=False),
                         marker=r"residency\.release\[normal\]")
        assert (t.idle_ns, t.intersection_ns) == (s.all_rank_idle_ns,
                                                  s.marker_idle_intersection_ns)
        assert t.window_ns == s.window_ns and t.ranks == (0, 1)
        assert set(t.phases) == {"prepare", "denoise", "decode"}
        assert all(len(t.releases["forced"][r]) == 2 for r in t.ranks)
        first = t.first_release()
        assert first is not None and first[0] < first[1]


def test_timeline_figure(timelines: tuple) -> None:
    from residency.reports.plots import timeline_figure

    fig = timeline_figure(*timelines)
    titles = [ax.get_title(loc="left") or ax.get_title() for ax in fig.axes]
    idle, inter = _recorded_ms("all_rank_idle", 1000.0), _recorded_ms("idle_intersection")
    assert titles[0].startswith(f"baseline: all-rank no-device-task time {idle['baseline']} ms;"
                                f" normal release ∩ that time {inter['baseline']} ms")
    assert titles[2].startswith(f"candidate: all-rank no-device-task time {idle['candidate']} ms")
    assert "zoom: first normal release" in titles[1]
    assert LABEL in fig._suptitle.get_text()
    assert fig.axes[0].get_xlim() == fig.axes[2].get_xlim()  # one time axis
    assert fig.axes[1].get_xlim() == pytest.approx(fig.axes[3].get_xlim())  # same zoom width
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert labels == {"all-rank no-device-task time", "device busy", "normal release",
                      "forced release"}


def test_memory_figure_from_recorded_decisions() -> None:
    from residency.reports.plots import memory_figure
    from residency.rundir.run import load_run

    run = load_run(RECORDED)
    dec = pd.concat([assigned_decisions(run, e).assign(run=e.name) for e in run.runs],
                    ignore_index=True)
    fig = memory_figure(dec, device_kind=run.device_kind)
    assert "n = 8 calls with a snapshot, 2 ranks; measured requests" in fig._suptitle.get_text()
    assert [ax.get_title() for ax in fig.axes] == [
        "baseline, rank 0", "baseline, rank 1", "candidate, rank 0: total 4 GiB",
        "candidate, rank 1: total 4 GiB"]
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"reserved", "allocated", "reserved ceiling: allocated + 25 % of total",
            "free floor: 5 % of total", "normal call retained"} <= labels


def test_memory_timeline_figure_draws_the_envelope_of_a_long_series() -> None:
    """100 001 records on one rank: at most 6 points per bin of 2000 are drawn, and the one
    spike of reserved memory and the one dip of allocated memory are among them."""
    from residency.reports.plots import memory_timeline_figure

    n = 100_001
    reserved = np.full(n, 4 << 30, np.int64)
    reserved[54_321] = 9 << 30
    allocated = np.full(n, 2 << 30, np.int64)
    allocated[77_777] = 0
    frame = pd.DataFrame({"rank": 0, "ts_ns": np.arange(n, dtype=np.int64) * 1000,
                          "allocated_bytes": allocated, "reserved_bytes": reserved,
                          "component": "", "source": "x"})
    marks = pd.DataFrame({"rank": [0], "name": ["residency.release[forced]"],
                          "start_ns": [5_000_000], "end_ns": [6_000_000]})
    fig = memory_timeline_figure({"baseline": frame}, {"baseline": marks}, {"baseline": 0},
                                 device_kind="cuda", source="Kineto [memory] events")
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines() if ln.get_label() in (
        "reserved", "allocated")}
    xs, ys = lines["reserved"].get_data()
    assert len(xs) <= 6 * 2000 and xs[0] == 0 and xs[-1] == pytest.approx((n - 1) / 1e6)
    assert max(ys) == 9 and min(lines["allocated"].get_data()[1]) == 0
    assert fig.axes[0].get_title() == "baseline, rank 0: peak reserved 9 GiB"
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert labels == {"reserved", "allocated", "forced release"}
    assert "n = 1 profiled run per arm, 1 rank, 100001 records" in fig._suptitle.get_text()


def test_e2e_slopegraph_shares_a_zero_based_axis_and_numbers_pairs_once() -> None:
    from residency.reports.plots import e2e_slopegraph

    fig = e2e_slopegraph({"baseline": [5.05], "candidate": [5.45]},
                         {"baseline": [4.9, 3.5, 7.2], "candidate": [4.6, 3.4, 4.5]},
                         device_kind="emulated-npu")
    prof, unprof, deltas = fig.axes
    assert prof.get_ylim() == unprof.get_ylim() and prof.get_ylim()[0] == 0
    numbers = [t.get_text() for ax in (prof, unprof) for t in ax.texts]
    assert numbers == ["", "1", "2", "3"]  # the profiled pair named, unprofiled 1..K
    medians = [t.get_text() for t in deltas.texts if t.get_text().startswith("median")]
    assert medians == ["median -0.3000 s"]  # issue 25: no median drawn for one pair
    assert "n = 1: 0.4000 s" in [t.get_text() for t in deltas.texts]
    assert "n = 1 profiled pair, 3 unprofiled pairs numbered 1–3" in fig._suptitle.get_text()


def test_whatif_neighbours() -> None:
    from residency.analysis import whatif
    from residency.reports.plots import neighbour_table

    totals = whatif.totals(whatif.replay_run(RECORDED))
    own = tuple(totals.attrs["own_settings"][0])
    table = neighbour_table(totals, own)
    assert len(table) == 9 and table["own setting"].tolist().count("yes") == 1
    row = table[table["own setting"] == "yes"].iloc[0]
    assert (row["max cached fraction"], row["min free fraction"]) == pytest.approx(own)
    assert row["retained / calls"] == "8/8"
    corner = neighbour_table(totals, (0.05, 0.01))
    assert len(corner) == 4  # at the grid's corner only the existing neighbours


# ----------------------------------------------------------------------------- progress
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_say_what_runs_and_the_time_left(tmp_path: Path) -> None:
    from residency.experiments.designs import plan

    clock, lines = FakeClock(), []
    order = plan("paired-profile", 2)
    p = RunProgress(order, design="paired-profile", device_kind="emulated-npu",
                    run_dir=tmp_path, interval_s=0, bar=False, write=lines.append, clock=clock)
    bar = p(total=len(order), desc="paired-profile (emulated-npu)")
    assert lines[-1] == ("paired-profile (emulated-npu): run 1/6: baseline, profiled pair, "
                         "starting the service; 0/6 runs done; 0 s elapsed, time left: "
                         "estimated once the first run ends")
    run = tmp_path / "runs" / "00-baseline"
    run.mkdir(parents=True)
    (run / decisions_file(0)).write_text(json.dumps({"request_id": "warmup-0001"})
                                               + "\n" + '{"request_id": "r0002"}\n')
    clock.now += 60
    assert p.line().endswith("profiled pair, measured request r0002; 0/6 runs done; "
                             "1 min 00 s elapsed, time left: estimated once the first run ends")
    bar.set_postfix_str("baseline #0")
    bar.update(1)
    assert lines[-1].startswith("paired-profile (emulated-npu): run 2/6: candidate, profiled "
                                "pair, starting the service; 1/6 runs done; 1 min 00 s elapsed,"
                                " about 5 min 00 s left")
    clock.now += 30
    assert p.line().endswith("about 4 min 30 s left")
    for _ in range(5):
        bar.update(1)
    assert "all runs done; 6/6 runs done" in lines[-1]
    bar.close()
    assert lines[-1] == "paired-profile: finished: 6/6 runs in 1 min 30 s"


def test_progress_ticks_between_runs() -> None:
    lines: list[str] = []
    seen = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        if len(lines) >= 3:
            seen.set()

    p = RunProgress([("candidate", False)], design="consecutive", interval_s=0.05, bar=False,
                    write=write)
    p(total=1, desc="x")
    assert seen.wait(300), lines  # a hang guard: three ticks of 50 ms, however late
    p.close()
    assert all("run 1/1: candidate, request series" in line for line in lines[:3])


def test_pair_labels_and_duration_text() -> None:
    from residency.experiments.designs import plan

    assert pair_labels(plan("paired-profile", 2), "paired-profile") == [
        "profiled pair", "profiled pair", "unprofiled pair 1 of 2", "unprofiled pair 1 of 2",
        "unprofiled pair 2 of 2", "unprofiled pair 2 of 2"]
    assert [duration_text(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


@pytest.mark.slow
def test_progress_reaches_the_terminal_papermill_runs_in(tmp_path: Path) -> None:
    """papermill started on a terminal (a pty): lines written by `RunProgress` inside the
    kernel appear on that terminal while the cell runs, not only in the notebook."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    code = ("import time\n"
            "from residency.notebook.progress import RunProgress\n"
            "p = RunProgress([('baseline', True), ('candidate', True)], design='demo', "
            "interval_s=0.3, bar=True)\n"
            "bar = p(total=2, desc='demo')\n"
            "for _ in range(2):\n"
            "    time.sleep(1.0)\n"
            "    bar.update(1)\n"
            "bar.close()\n")
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                   "language": "python"}
    nbformat.write(book, tmp_path / "demo.ipynb")
    main, child = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "papermill", "demo.ipynb", "out.ipynb",
                             "-k", "python3"], cwd=tmp_path, stdin=child, stdout=child,
                            stderr=child, env=env, close_fds=True)
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child side closed
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(main)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "residency: demo: run 1/2: baseline, profiled pair" in text
    assert "residency: demo: run 2/2: candidate, profiled pair, starting the service; 1/2 " \
        "runs done" in text
    assert "residency: demo: finished: 2/2 runs in" in text
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    in_notebook = "".join(o.get("text", "") for o in out.cells[0].outputs)
    assert "residency: demo" not in in_notebook  # the terminal's lines stay off the page


def test_round_numbers_in_text_built_elsewhere() -> None:
    cases = {"2248.795837 s": "2249 s", "216.822-251.161 ms": "216.8-251.2 ms",
             "61.428477-163.008423 ms (median 112.21845 ms)":
             "61.43-163.0 ms (median 112.2 ms)",
             "run 00-baseline 2r50s #8129, torch 2.10.0+cpu, 1.5 x": None,
             "p = 2/C(16,8) = 0.000155": None}
    for text, want in cases.items():
        assert humanize.round_numbers(text) == (text if want is None else want)
        assert not too_precise(humanize.round_numbers(text))


def test_live_manifest_for_the_probe() -> None:
    from residency.rundir.run import versions

    m = banner.live_manifest("emulated-npu", versions=versions())
    assert m["design"] == "live probe" and m["versions"]["python"]
    assert visible_text(banner.banner_html(m))[0] == f"emulated-npu: {LABEL}"


def test_evidence_side_by_side_shows_honest_effect_sizes() -> None:
    """Issue 25: per side the value, the change and the change relative to E2E; published
    figures at their published precision (2248.795837 -> 2244.482967 s is -4.312870 s,
    -0.19 %, never "2249 -> 2244"); full-stack rows marked, set apart, never beside a
    this-change-only figure."""
    from residency.evidence import build
    from residency.reports.side_by_side import FULL_STACK, side_by_side
    from residency.rundir.run import load_run

    ev = build(load_run(RECORDED))
    table = side_by_side(ev)
    assert list(table.columns) == [
        "quantity", "scope", f"this run ({LABEL}): baseline → candidate", "this run: change",
        "this run: change relative to E2E", "published (Ascend NPU): baseline → candidate",
        "published: change", "published: change relative to E2E"]
    rows = {(q, sc): r for q, sc, *r in table.itertuples(index=False)}
    inter = rows[("normal-release markers ∩ all-rank no-device-task time",
                  "profiled / isolated pair")]
    ours = _recorded_ms("idle_intersection")
    assert inter[0] == f"{ours['baseline']} → {ours['candidate']} ms"
    assert inter[3:] == ["221.296680 → 3.164550 ms", "-218.132130 ms (-98.57 %)",
                         "-0.0097 % of E2E"]
    e2e = rows[("client E2E", "profiled / isolated pair")]
    assert e2e[3:] == ["2248.795837 → 2244.482967 s", "-4.312870 s (-0.19 %)", "-0.19 % of E2E"]
    assert e2e[2].endswith("% of E2E") and e2e[1].startswith("-")
    full = [r for (q, sc), r in rows.items() if sc.startswith(FULL_STACK)]
    assert len(full) == 3 and table.attrs["full_stack_rows"] == [len(table) - 3,
                                                                 len(table) - 2,
                                                                 len(table) - 1]
    for r in full:  # never beside a figure of this change alone
        assert r[0].startswith("—") and r[1:3] == ["—", "—"]
    assert rows[("client E2E, median of 3 alternating unprofiled pairs", FULL_STACK)][4] == \
        "-14.360677 s (-0.64 %)"
    for quantity in ("client E2E, median of the pairs", "all-rank no-device-task time"):
        mine = next(r for (q, sc), r in rows.items() if q == quantity and
                    not sc.startswith(FULL_STACK))
        assert mine[3].startswith("— (published for the full stack only")
    published = {"216.822", "251.161", "221.296680", "3.164550", "218.132130", "2248.795837",
                 "2244.482967", "4.312870", "2253.664743", "2239.304066", "14.360677",
                 "6.631556", "3.039535", "3.592021", "3.670694", "0.941927", "2.728767"}
    text = " ".join(table.astype(str).to_numpy().ravel())
    assert set(too_precise(text, limit=4)) <= published  # this run's side: 4 digits


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list:
    from residency.reports import views as report_views

    seen: list = []
    monkeypatch.setattr(report_views, "_display", lambda *objs: seen.extend(objs))
    return seen


def test_views_write_and_show_the_paired_figures(tmp_path: Path, shown: list) -> None:
    from residency.reports import views as rv
    from residency.rundir.run import load_run

    run = load_run(RECORDED)
    pair = (run.runs[0], run.runs[1])
    assert rv.write_timeline(run, pair, tmp_path) == tmp_path / "timeline.png"
    assert rv.write_memory(run, tmp_path) == tmp_path / "memory.png"
    assert rv.write_e2e({"baseline": [1.0], "candidate": [0.9]}, {}, device_kind="cuda",
                        output_dir=tmp_path) == tmp_path / "e2e.png"
    assert all(reports.png_size(tmp_path / f"{n}.png")[1] > 300
               for n in ("timeline", "memory", "e2e"))
    assert len(shown) == 3
    assert rv.write_timeline(run, (run.runs[2], run.runs[3]), tmp_path) is None  # no traces


def test_views_memory_timeline_of_the_profiled_pair(tmp_path: Path, shown: list,
                                                   capsys: pytest.CaptureFixture) -> None:
    """Emulated-NPU traces with memory records: the figure is written and shown with the
    device kind, every record saved, and what each release handed back (the baseline's
    empty_cache returns the reserved block; the candidate's release returns nothing)."""
    from types import SimpleNamespace

    from residency.reports import views as rv
    from residency.rundir.run import load_run
    from tests.memorytraces import record

    held = {}
    pair = []
    for arm, release in (("baseline", True), ("candidate", False)):
        trace_dir = tmp_path / arm / "trace"
        held[arm] = record(trace_dir / "rank0.trace.json", release=release)
        pair.append(SimpleNamespace(arm=arm, trace_dir=trace_dir))
    run = SimpleNamespace(device_kind="emulated-npu", manifest={"params": {"ranks": 1}},
                          sealed_artifacts=None, injection="none", reading=RunReading())
    out = tmp_path / "out"
    out.mkdir()
    assert rv.write_memory_timeline(run, pair, out) == out / "memory_timeline.png"
    assert reports.png_size(out / "memory_timeline.png")[1] > 300
    fig, table = shown
    assert LABEL in fig._suptitle.get_text() and "Kineto [memory] events" in (
        fig._suptitle.get_text())
    assert [ax.get_title() for ax in fig.axes] == [
        f"baseline, rank 0: peak reserved {humanize.bytes_text(held['baseline'])}",
        f"candidate, rank 0: peak reserved {humanize.bytes_text(held['candidate'])}"]
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert labels == {"reserved", "allocated", "normal release"}
    records = pd.read_csv(out / "memory_timeline.csv")
    assert set(records["arm"]) == {"baseline", "candidate"} and set(records["rank"]) == {0}
    released = pd.read_csv(out / "memory_timeline_releases.csv").set_index("arm")
    assert released.loc["baseline", "released_bytes"] == held["baseline"] > 0
    assert released.loc["candidate", "released_bytes"] == 0
    assert LABEL in table.data and humanize.bytes_text(held["baseline"]) in table.data
    # the recorded run's traces hold memory records; without them the view says so
    recorded = load_run(RECORDED)
    shown.clear()
    assert rv.write_memory_timeline(recorded, (recorded.runs[0], recorded.runs[1]),
                                    tmp_path) == tmp_path / "memory_timeline.png"
    bare = []
    for entry in recorded.runs[:2]:
        trace_dir = tmp_path / "bare" / entry.name / "trace"
        trace_dir.mkdir(parents=True)
        for src in sorted(entry.trace_dir.glob("*.json")):
            doc = json.loads(src.read_text())
            doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
            (trace_dir / src.name).write_text(json.dumps(doc))
        bare.append(SimpleNamespace(arm=entry.arm, trace_dir=trace_dir))
    shown.clear()
    # (the copies lie outside the run)
    unsealed = SimpleNamespace(device_kind=recorded.device_kind, manifest=recorded.manifest,
                               sealed_artifacts=None, injection=recorded.injection,
                               reading=RunReading())
    assert rv.write_memory_timeline(unsealed, bare, tmp_path / "bare") is None
    assert "hold no device-memory records" in capsys.readouterr().out and not shown


def test_views_memory_timeline_of_a_torch_npu_database_pair(tmp_path: Path,
                                                            shown: list) -> None:
    """torch-npu's DB export as both arms: rank 0's MEMORY_RECORD (PTA rows) plotted with the
    source named, and its normal release [400, 700) us handing back 1024 - 256.25 MiB."""
    import shutil
    from types import SimpleNamespace

    from residency.reports import views as rv

    pair = []
    for arm in ("baseline", "candidate"):
        d = shutil.copytree(ROOT / "tests" / "data" / "traces" / "ascend_real_db",
                            tmp_path / arm, ignore=shutil.ignore_patterns("*.parquet.cache"))
        pair.append(SimpleNamespace(arm=arm, trace_dir=Path(d)))
    assert rv.write_memory_timeline(SimpleNamespace(device_kind="npu", manifest={},
                                                    sealed_artifacts=None, injection="none",
                                                    reading=RunReading()),
                                    pair,
                                    tmp_path) == tmp_path / "memory_timeline.png"
    fig, table = shown
    title = fig._suptitle.get_text()
    assert "npu: " in title and "torch-npu the database's MEMORY_RECORD, component PTA" in title
    assert [ax.get_title() for ax in fig.axes] == [  # rank 1 recorded neither
        "baseline, rank 0: peak reserved 1 GiB", "candidate, rank 0: peak reserved 1 GiB"]
    released = pd.read_csv(tmp_path / "memory_timeline_releases.csv")
    assert released["released_bytes"].tolist() == [(1024 - 256.25) * 2**20] * 2
    assert humanize.bytes_text((1024 - 256.25) * 2**20) in table.data


def test_views_whatif_small_tables_and_full_csv(tmp_path: Path, shown: list) -> None:
    from residency.analysis import whatif
    from residency.reports import views as rv

    bounded = whatif.replay_run(RECORDED)
    learned = whatif.replay_run(RECORDED, policy="learned-budget")
    effect = whatif_effect.estimated_effect(RECORDED, bounded)
    own = tuple(bounded.attrs["own_settings"][0])
    grid_csv = rv.write_whatif([bounded, learned], output_dir=tmp_path)
    effect_csv = rv.write_effect(effect.table, output_dir=tmp_path)
    csv = pd.read_csv(grid_csv)
    assert len(csv) == 2 * len(bounded) == 800 and set(csv["policy"]) == {
        "bounded", "learned-budget"}
    assert len(pd.read_csv(effect_csv)) == 200 and own == (0.25, 0.05)
    retention, cost = (o.data for o in shown[-2:])
    assert retention.count("<tr>") == 1 + 9 and "100 %" in retention
    assert "whatif_grid.csv" in retention
    assert cost.count("<tr>") == 1 + 9 and "whatif_effect.csv" in cost
    assert not too_precise(" ".join(visible_text(retention + cost)))


def test_show_table_caps_the_rows(shown: list) -> None:
    from residency.reports.views import show_table

    show_table(pd.DataFrame({"value_ms": np.arange(50) / 3}), caption="values",
               full="values.csv")
    html = shown[-1].data
    assert html.count("<tr>") == 1 + 40
    assert "values — first 40 of 50 rows; all 50 in `values.csv`" in html
    assert "value (ms)" in html and "0.3333" in html and "0.333333" not in html


# ----------------------------------------------------------------------------- hostile runs
HOSTILE = ('<iframe src="file:///etc/passwd"></iframe><script>document.title="x"</script>'
           '<img src=x onerror=alert(1)>`</code><b>npu: Ascend NPU</b> [link](javascript:x) '
           '\r| x |\u2028*bold*')


def _hostile_run(tmp_path: Path) -> Path:
    """A recorded run re-sealed by the project's own code after its host, service and
    versions were set to markup, as a hostile author would ship it."""
    import shutil

    from residency.records.manifest import artifact_hashes
    from residency.records.seal import seal

    run = Path(shutil.copytree(ROOT / "data" / "runs" / "emulated-consecutive-2r2s",
                               tmp_path / "hostile"))
    m = read_manifest(run)
    m.pop("seal", None)
    m["host"] = HOSTILE
    m["started_at"] = HOSTILE
    m["versions"] = {**m.get("versions", {}), "torch": HOSTILE}
    m["artifacts"] = artifact_hashes(run)
    m["seal"] = seal(m)
    write_manifest(run, m)
    return run


def test_run_supplied_strings_reach_the_report_as_text(tmp_path: Path) -> None:
    from nbconvert.filters import markdown2html

    from residency.notebook.outputs import describe_run
    from residency.rundir.run import load_run

    text = describe_run(load_run(_hostile_run(tmp_path)))
    html = markdown2html(text)
    for tag in ("<iframe", "<script", "<img", "<b>", "<a ", "<em>"):
        assert tag not in html, (tag, html)
    assert "&lt;iframe src=" in html  # shown, as text
    assert "\r" not in text and "\u2028" not in text


def test_markdown_table_cells_stay_in_their_row() -> None:
    from residency.humanize import write_markdown_table

    md = write_markdown_table(["a", "b"], [[HOSTILE, 1]])
    assert len(md.strip().splitlines()) == 3  # header, separator, one row
    assert "<script" not in md and "&lt;script&gt;" in md


@needs_chromium
def test_screenshot_runs_no_script_and_reads_no_local_file(tmp_path: Path) -> None:
    """A page that would grow by script, load a tall local image and open a dialog: none of
    it happens, and the capture ends well before its time limit."""
    import base64
    import zlib

    width, height = 10, 3000  # a real PNG 3000 px tall: loaded, the page grows past it
    raw = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", width.to_bytes(4, "big")
           + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0]))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    tall = tmp_path / "tall.png"
    tall.write_bytes(png)
    inline = base64.b64encode(png).decode()
    page = tmp_path / "hostile.html"
    page.write_text(f'<html><body style="margin:0"><p>report</p>'
                    f'<script>document.body.style.height = "9000px"; alert("held")</script>'
                    f'<img src="{tall.as_uri()}"><iframe src="file:///etc/passwd"></iframe>'
                    f'<img src="data:image/png;base64,{inline}" width="10" height="100">'
                    f'</body></html>')
    shot = reports.capture(page, tmp_path / "hostile.png", timeout_s=60)
    assert shot.page_height_px < 1000, shot  # no script ran, the local image never loaded
    assert shot.page_height_px > 100  # the page's own inline image did


HOSTILE_HTML = (
    '<meta http-equiv="refresh" content="0;url=https://evil.example/">'
    '<base href="https://evil.example/"><link rel="stylesheet" href="https://evil.example/s">'
    '<style>.residency-banner{display:none}</style>'
    '<div style="position:fixed;top:0;left:0;z-index:9;background:white">npu: Ascend NPU</div>'
    '<p style="margin-top:-900px;color:red">pulled up</p>'
    '<a href="javascript:alert(1)">j</a><a href="data:text/html,x">d</a>'
    '<a href=" java	script:alert(1)">t</a><img src="https://evil.example/x.png">'
    '<form action="https://evil.example/"><input name="q"></form>')


def test_a_received_notebook_draws_nothing_the_views_would_not(tmp_path: Path) -> None:
    """Markup an executed notebook's outputs and Markdown carry (what a received or edited
    notebook can hold) is shown as text or dropped: no refresh, base, stylesheet or style
    block, nothing positioned or pulled over the banner, no script, data or remote link;
    the package's own banner and table styles are kept."""
    src = _banner_notebook(tmp_path / "received.ipynb", _manifest())
    book = nbformat.read(src, as_version=4)
    book.cells.append(nbformat.v4.new_markdown_cell("text " + HOSTILE_HTML))
    book.cells.append(nbformat.v4.new_code_cell("x", execution_count=2, outputs=[
        nbformat.v4.new_output("display_data", data={"text/html": HOSTILE_HTML}),
        nbformat.v4.new_output("display_data", data={"text/markdown": HOSTILE_HTML}),
        nbformat.v4.new_output("display_data", data={
            "image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg'>{HOSTILE_HTML}</svg>"}),
        nbformat.v4.new_output("display_data", data={
            "text/html": humanize.html_table(pd.DataFrame({"a": [1.5]}))})]))
    nbformat.write(book, src)
    html = reports.render_html(src, tmp_path / "out").read_text()
    parser = BodyTags()
    parser.feed(html)
    names = [t for t, _ in parser.tags]
    for tag in ("meta", "base", "link", "style", "form", "input", "svg", "script"):
        assert tag not in names, tag
    styles = [a["style"] for _, a in parser.tags if "style" in a]
    assert not [s for s in styles if "position" in s or "z-index" in s or "-900" in s]
    assert "color:red" in "".join(styles).replace(" ", "")  # (the rest of it is kept)
    hrefs = [a["href"] for t, a in parser.tags if t == "a" and "href" in a]
    assert all(h.startswith(("#", "http")) for h in hrefs), hrefs
    srcs = [a["src"] for t, a in parser.tags if t == "img" and "src" in a]
    assert not [s for s in srcs if "evil" in s], srcs
    assert any(s.startswith("data:image/svg+xml;base64,") for s in srcs)  # inert: an image
    assert html.count("&lt;meta http-equiv=") >= 3  # shown as what it is, in each place
    assert visible_text(html)[0] == f"emulated-npu: {LABEL}"
    banner_div = next(a for _, a in parser.tags
                      if banner.BANNER_CLASS in a.get("class", "").split())
    assert "border-left" in banner_div["style"]
    assert any("text-align" in a.get("style", "") for t, a in parser.tags if t == "td")


def test_rendered_html_carries_a_policy_that_forbids_script() -> None:
    html = reports.with_csp("<html><head><title>t</title></head><body></body></html>")
    head = html.split("<head>", 1)[1]
    assert head.startswith('<meta http-equiv="Content-Security-Policy"')
    assert "default-src &#x27;none&#x27;" in head and "script-src" not in head


def test_the_notebook_progress_bar_is_output_not_an_error(capsys: pytest.CaptureFixture
                                                          ) -> None:
    """The bar draws on stdout: a notebook renders stderr streams pink, as if they were
    errors (issue 25's first screen)."""
    lines: list[str] = []
    p = RunProgress([("baseline", False), ("candidate", False)], design="alternating",
                    interval_s=0, bar=True, write=lines.append)
    bar = p(total=2, desc="alternating (emulated-npu)")
    bar.update(1)
    bar.close()
    out, err = capsys.readouterr()
    assert "1/2" in out and err == ""
