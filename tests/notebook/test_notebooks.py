"""Notebook support (`residency.notebook`), reports (`residency.reports.html`) and the three
notebooks executed with papermill at small parameters (slow)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from residency import notebook as nb
from residency.records import client as client_record
from residency.records import decisions as decisions_format
from residency.records.manifest import MANIFEST, read_manifest, write_manifest
from residency.reports import html as reports
from residency.reports import views as rv
from residency.reports.plots import e2e_slopegraph
from residency.rundir.run import load_run
from tests.helpers import ROOT, Papermill

DATA = ROOT / "tests" / "data" / "notebooks"
PAIRED = DATA / "paired-profile"  # paired-profile, 2 ranks, 2 steps, scale 0.02, pairs=1
CONSECUTIVE = DATA / "consecutive"  # consecutive, 2 ranks, 3 requests of 2 steps, scale 0.02
NOTEBOOKS = ROOT / "notebooks"
SENTENCE_END = (".", ")")


def one_sentence(text: str) -> bool:
    return "\n" not in text and "Traceback" not in text and text.endswith(SENTENCE_END)


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Bad:
    params: dict[str, Any]
    words: str  # must appear in the message


def _incomplete(tmp: Path) -> Path:
    run = tmp / "incomplete"
    shutil.copytree(CONSECUTIVE, run)
    m = read_manifest(run)
    m.update(status="incomplete", error="ExperimentError: service exited with code 1")
    write_manifest(run, m)
    return run


BAD = [
    Bad({"device": "gpu"}, "`device` must be one of ['auto', 'npu', 'cuda', 'emulated-npu']"),
    Bad({"device": 1}, "`device` must be one of"),
    Bad({"steps": "2"}, "`steps` must be an integer >= 1, but '2' (str) was passed"),
    Bad({"steps": 0}, "`steps` must be an integer >= 1, but 0 was passed"),
    Bad({"ranks": True}, "`ranks` must be an integer >= 1"),
    Bad({"ranks": 2.0}, "`ranks` must be an integer >= 1"),
    Bad({"pairs": -1}, "`pairs` must be an integer >= 0"),
    Bad({"seed": "x"}, "`seed` must be an integer >= 0"),
    Bad({"scale": "big"}, "`scale` must be a number > 0, but 'big' (str) was passed"),
    Bad({"scale": 0}, "`scale` must be a number > 0"),
    Bad({"scale": math.nan}, "`scale` must be a number > 0"),
    Bad({"source": "/nonexistent/run"}, "'/nonexistent/run' does not exist"),
    Bad({"source": ""}, "`source` must be \"run\" or a recorded run directory"),
    Bad({"source": 3}, "`source` must be \"run\" or a recorded run directory"),
    Bad({"source": "@incomplete"}, "is marked 'incomplete' in its manifest.json"),
    Bad({"source": "@empty"}, "`source` must be a readable run directory"),
    Bad({"source": str(CONSECUTIVE), "designs": ("paired-profile",)},
        "has design 'consecutive'"),
    Bad({"source": str(CONSECUTIVE), "device": "cuda"},
        "the recorded run's device kind 'emulated-npu', but 'cuda' was passed"),
    Bad({"output_dir": str(CONSECUTIVE / MANIFEST)}, "is a file"),
    Bad({"colour": "red"}, "The parameter `colour` is not one this notebook knows"),
    Bad({"accelerator_patch": "yes"},
        "`accelerator_patch` must be one of ['none', 'vllm-ascend', 'both'], but 'yes'"),
    Bad({"service": "/nonexistent/svc.toml"},
        "`service` must be a usable service file, but /nonexistent/svc.toml: service file "
        "not found"),
    Bad({"service": 3}, "`service` must be None or a service file (TOML), but 3 was passed"),
    Bad({"service": "@standin", "source": str(CONSECUTIVE)},
        "`service` must be None when `source` is a recorded run directory"),
    Bad({"service": "@standin", "source": "run", "device": "cuda"},
        "must be 'auto' or the service file's device kind 'emulated-npu', but 'cuda'"),
    Bad({"service": "@bad-toml"}, "`service` must be a usable service file, but "),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.words[:40])
def test_check_parameters_refuses_with_one_sentence(case: Bad, tmp_path: Path) -> None:
    params = dict(case.params)
    if params.get("source") == "@incomplete":
        params["source"] = str(_incomplete(tmp_path))
    elif params.get("source") == "@empty":
        params["source"] = str(tmp_path)
    if params.get("service") == "@standin":
        params["service"] = str(ROOT / "tests" / "data" / "services" / "standin_2r.toml")
    elif params.get("service") == "@bad-toml":
        (tmp_path / "bad.toml").write_text("name = \"x\"\n[serve\n")
        params["service"] = str(tmp_path / "bad.toml")
    with pytest.raises(nb.ParameterError) as err:
        nb.check_parameters(**params)
    message = str(err.value)
    assert case.words in message
    assert one_sentence(message), message
    assert err.value._render_traceback_() == [f"ParameterError: {message}"]


def test_check_parameters_returns_checked_values() -> None:
    got = nb.check_parameters(device="auto", output_dir=None, source=str(PAIRED), ranks=2,
                              steps=50, seed=2101, scale=1, pairs=0,
                              designs=("paired-profile",))
    assert got == {"device": "auto", "output_dir": None, "source": str(PAIRED.resolve()),
                   "ranks": 2, "steps": 50, "seed": 2101, "scale": 1.0, "pairs": 0}
    assert nb.check_parameters(source="run", device="emulated-npu")["source"] == "run"
    assert nb.check_parameters(source=str(PAIRED), device="emulated-npu")["device"] == \
        "emulated-npu"


def test_parameter_error_shows_one_line_in_ipython(tmp_path: Path) -> None:
    code = ("from traitlets.config import Config\n"
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "config = Config({'HistoryManager': {'enabled': False}})\n"
            "shell = InteractiveShell.instance(config=config)\n"
            "result = shell.run_cell('from residency.notebook import check_parameters\\n'\n"
            "                        'check_parameters(device=\"gpu\")')\n"
            "assert type(result.error_in_exec).__name__ == 'ParameterError'\n")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path)}  # IPython's own files stay in tmp
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=True)
    assert out.stdout + out.stderr == (
        "ParameterError: The value for `device` must be one of ['auto', 'npu', 'cuda', "
        "'emulated-npu'], but 'gpu' was passed.\n")


def test_gate_error_lists_each_failure() -> None:
    err = nb.GateError(["First failed.", "Second failed."])
    assert err._render_traceback_() == ["GateError: 2 gates failed:", "  - First failed.",
                                        "  - Second failed."]
    with pytest.raises(nb.GateError):
        nb.check_gates(["x."])


# ----------------------------------------------------------------------------- outputs
def test_prepare_output_dir_default_is_a_new_timestamped_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    first = nb.prepare_output_dir(None, "paired_profile")
    second = nb.prepare_output_dir(None, "paired_profile")
    assert first.parent == second.parent == tmp_path / "reports" / "paired_profile"
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.endswith("Z") and second.name.startswith(first.name)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"paired_profile: results.json, tables and figures go to {p}"
                       for p in (first, second)]
    given = nb.prepare_output_dir(str(tmp_path / "a" / "b"), "x")
    assert given == (tmp_path / "a" / "b").resolve() and given.is_dir()


def test_write_results_is_atomic_plain_json(tmp_path: Path) -> None:
    import numpy as np

    path = nb.write_results(tmp_path, {"a": np.int64(3), "b": math.nan, "c": (1.5, Path("/x")),
                                       "d": {"e": np.float32(0.5)}})
    assert path == tmp_path / "results.json"
    assert json.loads(path.read_text()) == {"a": 3, "b": None, "c": [1.5, "/x"],
                                            "d": {"e": 0.5}}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


# ----------------------------------------------------------------------------- consecutive
def test_consecutive_table_counts_per_rank_and_request() -> None:
    run = load_run(CONSECUTIVE)
    table = nb.consecutive_table(run)
    assert len(table) == 6  # 2 ranks x 3 requests
    assert table[["request", "rank"]].values.tolist() == [[1, 0], [2, 0], [3, 0], [1, 1],
                                                          [2, 1], [3, 1]]
    assert (table["normal_checks"] == 1).all() and (table["normal_retained"] == 1).all()
    assert (table["forced"] == 2).all() and (table["forced_released"] == 2).all()
    summary = nb.consecutive_summary(run, table)
    service = summary.pop("service")
    attributed = summary.pop("request_attribution")
    note = summary.pop("attribution_note")
    assert summary == {"device_kind": "emulated-npu", "ranks": 2, "requests": 3,
                       "normal_total": 6, "normal_retained": 6, "forced_total": 12,
                       "forced_released": 12, "telemetry_errors": 0, "oom": 0}
    assert (service["kind"], service["name"]) == ("builtin", "residency-builtin")
    # recorded before the client kept wall-clock windows: attributed by id; the service's
    # own start-up warm-up (warmup-service, 3 calls per rank) is a warm-up (issue 25), never
    # "outside every request"
    assert [(a["method"], a["outside_count"], a["startup_count"]) for a in attributed] == [
        ("id", 0, 6)]
    assert note == ("1 service run after its warm-up; decisions attributed to requests by "
                    "request id; warm-up decisions excluded: service start-up (warmup-service) "
                    "6 (4 forced, 2 normal), client warm-up 6 (4 forced, 2 normal); no "
                    "decision outside every request.")
    notes = nb.consecutive_notes(summary)
    assert notes["normal_retained"].startswith("6 of 6 (100 %); Clopper-Pearson 95 %")


def _tampered(tmp: Path, edit_decision: Any = None, edit_client: Any = None) -> Any:
    run_dir = tmp / "run"
    shutil.copytree(CONSECUTIVE, run_dir)
    dec = run_dir / "runs" / "00-candidate" / decisions_format.decisions_file(1)
    if edit_decision:
        lines = [edit_decision(d) if d["request_id"] == "r0003" and d["kind"] == "normal"
                 else d for d in decisions_format.read_records(dec)]
        decisions_format.write_records(dec, lines)
    if edit_client:
        client = run_dir / "runs" / "00-candidate" / client_record.CLIENT
        data = client_record.read_raw(client)
        edit_client(data)
        client_record.write_raw(client, data)
    return load_run(run_dir, verify=False)


def _crossed(d: dict) -> dict:  # recorded as retained, but cached > 25 % of total
    d["snapshot"] = {**d["snapshot"], "reserved": d["snapshot"]["total"] // 2,
                     "allocated": 0}
    return d


def _telemetry_error(d: dict) -> dict:
    d.update(outcome="released", reason="telemetry-unavailable", snapshot=None,
             error="registered telemetry unavailable: RuntimeError: boom")
    return d


def _oom(data: dict) -> None:
    data["requests"][2]["response"]["per_rank"][0]["oom"] = 1


@pytest.mark.parametrize(("edit_decision", "edit_client", "words"), [
    (_crossed, None, "re-evaluated on its snapshot released (cached-bound)"),
    (_telemetry_error, None, "1 telemetry error(s) (first: registered telemetry unavailable"),
    (None, _oom, "reported 1 out-of-memory error(s)"),
], ids=["replay-mismatch", "telemetry-error", "oom"])
def test_gates_fail_on_each_kind_of_problem(tmp_path: Path, edit_decision: Any,
                                            edit_client: Any, words: str) -> None:
    run = _tampered(tmp_path, edit_decision, edit_client)
    failures = nb.gate_failures(run)
    assert len(failures) == 1 and words in failures[0], failures
    assert all(one_sentence(f) for f in failures)


def test_gates_pass_on_the_recorded_runs() -> None:
    assert nb.gate_failures(load_run(CONSECUTIVE)) == []
    assert nb.gate_failures(load_run(PAIRED)) == []  # replay also checks the baseline arm


def test_fractions_are_of_total_and_plot_names_device_bounds_and_n() -> None:
    run = load_run(CONSECUTIVE)
    frame = nb.fractions(run)
    assert len(frame) == 6
    first = json.loads((CONSECUTIVE / "runs/00-candidate/decisions-rank0.jsonl")
                       .read_text().splitlines()[6])  # r0002's normal check on rank 0
    snap = first["snapshot"]
    row = frame[(frame["rank"] == 0) & (frame["request_id"] == "r0002")].iloc[0]
    assert row["cached_fraction"] == (snap["reserved"] - snap["allocated"]) / snap["total"]
    assert row["free_fraction"] == snap["free"] / snap["total"]
    fig = nb.plot_fractions(frame)
    title = fig._suptitle.get_text()
    assert "emulated NPU — not an NPU measurement" in title and "n = 6 normal checks" in title
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert "bound: retain while <= 0.25" in labels and "bound: retain while >= 0.05" in labels


# ----------------------------------------------------------------------------- paired profile
def test_paired_profile_attributions_and_results_keys() -> None:
    run = load_run(PAIRED)
    ev = nb.paired_profile(run)
    assert ev.reference_pair == ("00-baseline", "01-candidate")
    rows = [json.loads(line) for f in sorted((PAIRED / "runs/00-baseline").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    expected = [sum(d["end_ns"] - d["start_ns"] for d in rows if d["rank"] == r
                    and d["kind"] == "normal" and d["request_id"] == "r0002") / 1e6
                for r in (0, 1)]
    assert list(ev["normal_call_per_rank"].values["baseline"]) == expected
    assert ev["normal_call_per_rank"].p_value is None  # ranks of one run: no test
    results = nb.paired_results(ev)
    assert results["normal_calls"] == {"baseline": {"total": 4, "released": 4},
                                       "candidate": {"total": 4, "released": 0}}
    assert results["forced_calls"]["candidate"] == {"total": 8, "released": 8}
    assert ev.idle_error is None and "idle_intersection" in ev
    assert ev["preparation_window"].source == "trace window marker residency.phase[prepare]"
    assert [ev[k].n["baseline"] for k in ("e2e_profiled", "e2e_unprofiled")] == [1, 1]
    for key in ("device_kind", "normal_call_ms", "idle_intersection_ms", "e2e_s", "notes",
                "evidence"):
        assert key in results
    assert set(results["normal_call_ms"]) == set(results["idle_intersection_ms"]) == \
        set(results["e2e_s"]) == {"baseline", "candidate"}
    assert results["e2e_s"] == results["e2e_s_unprofiled"]
    # issue 25: one profiled and one unprofiled run per arm: no per-run comparison (the
    # profiled and unprofiled runs are never pooled into a 2 vs 2)
    assert set(results["notes"]) == {"normal_call_per_rank",
                                     "normal_released", "forced_released",
                                     "idle_intersection", "all_rank_idle",
                                     "preparation_window", "e2e_profiled", "e2e_unprofiled"}
    assert "Every rank, in this run pair" in results["notes"]["normal_call_per_rank"]
    assert "normal_call_per_run" not in ev and results["normal_call_per_run_ms"] == {
        "baseline": [], "candidate": []}
    assert nb.note(ev, "e2e_profiled").startswith("**Statistical note (client E2E, profiled "
                                                  "pair).** Single observation")
    assert "Judged on: pair" in nb.note(ev, "e2e_profiled")
    assert json.loads(json.dumps(results))  # plain JSON


def test_paired_profile_frames_and_plots() -> None:
    ev = nb.paired_profile(load_run(PAIRED))
    assert nb.normal_call_frame(ev).index.tolist() == [0, 1]
    per_run = nb.per_run_frame(ev)
    assert per_run.empty and list(per_run.reset_index().columns) == nb.PER_RUN_COLUMNS
    assert nb.releases_frame(ev).loc["candidate", "normal calls released"] == "0/4"
    assert nb.idle_frame(ev).notna().all().all()
    assert nb.e2e_frame(ev)["pair"].tolist() == ["profiled pair", "1"]  # one numbering
    for fig, n in ((nb.plot_normal_calls(ev), "n = 2 vs 2 ranks"),
                   (nb.plot_idle(ev), "n = 1 profiled run per arm")):
        title = (fig._suptitle or fig.axes[0].title).get_text()
        assert "emulated-npu (emulated NPU — not an NPU measurement)" in title and n in title
    e2e = e2e_slopegraph(*rv.e2e_pairs(ev), device_kind=ev.device_kind)
    assert "emulated-npu: emulated NPU — not an NPU measurement; n = 1 profiled pair, 1 " \
        "unprofiled pair" in e2e._suptitle.get_text()
    evidence, published = nb.evidence_tables(ev)
    assert evidence.attrs["device_kind"] == "emulated-npu"
    assert published.attrs["device_kind"] == "npu"


def test_write_tables_and_finish(tmp_path: Path) -> None:
    ev = nb.paired_profile(load_run(PAIRED))
    paths = nb.write_tables(tmp_path, {"normal_calls": nb.normal_call_frame(ev)})
    assert [p.name for p in paths] == ["normal_calls.md", "normal_calls.csv"]
    assert (tmp_path / "normal_calls.csv").read_text().splitlines()[0] == \
        "rank,baseline (ms),candidate (ms),baseline / candidate"
    nb.save_figure(e2e_slopegraph(*rv.e2e_pairs(ev), device_kind=ev.device_kind), tmp_path,
                   "e2e")
    path = nb.finish(tmp_path, {"device_kind": "emulated-npu"})
    got = json.loads(path.read_text())
    assert got["files"] == ["e2e.png", "normal_calls.csv", "normal_calls.md"]
    assert got["output_dir"] == str(tmp_path.resolve())


# ----------------------------------------------------------------------------- API reproduction
def test_api_from_a_recorded_run_detects_the_bug() -> None:
    probes = nb.api_reproduction(str(PAIRED))
    assert list(probes) == ["emulated-npu"]
    results = nb.api_results(probes)
    assert results["bug_present"] is True and results["recorded"] is True
    assert results["generic"]["allocated"]["ok"] is False
    assert "Allocator for npu is not a DeviceAllocator" in results["generic"]["reserved"]["error"]
    assert results["registered"]["allocated"] == {"ok": True, "value": 14684160}
    table = nb.probe_table(probes)
    assert table["outcome"].tolist() == ["error", "error", "ok", "ok"]
    assert "never assumed" in nb.verdict_markdown(probes)


def _cell(table: Any, patch: str, call: str) -> dict:
    (row,) = table[(table["accelerator patch"] == patch) & (table["call"] == call)].to_dict(
        "records")
    return row


def test_api_from_a_run_under_the_vllm_ascend_patch_shows_the_second_query_raising(
        tmp_path: Path) -> None:
    """A run whose baseline failed on `[query: torch.accelerator.memory_allocated]` (as
    under vllm-ascend's patch): reserved answered, allocated raised; the row names the
    patch the manifest recorded."""
    run = tmp_path / "patched"
    shutil.copytree(PAIRED, run)
    m = read_manifest(run)
    m["params"]["emulated_npu"] = {"accelerator_patch": "vllm-ascend"}
    write_manifest(run, m)
    for path in run.glob("runs/*-baseline/decisions-rank*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for r in rows:
            if r["error"]:
                r["error"] += " [query: torch.accelerator.memory_allocated]"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = nb.api_from_run(load_run(run, verify=False))  # edited: no longer matches its seal
    probes = {nb.row_label(entry): entry}
    assert list(probes) == ["emulated-npu + vllm-ascend"]
    assert entry["generic"]["reserved"] == {"ok": True, "value": None}
    assert entry["generic"]["allocated"]["ok"] is False
    assert entry["generic"]["allocated"]["error"].endswith("not a DeviceAllocator.")
    assert entry["bug_present"] is True and "second query" in entry["verdict"]
    table = nb.probe_table(probes)
    reserved = _cell(table, "vllm-ascend", "torch.accelerator.memory_reserved(d)")
    assert (reserved["outcome"], reserved["value (bytes) or exception"]) == (
        "ok", "answered (value not recorded)")


def test_api_probe_detects_what_it_cannot_run_under_the_patch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real NPU without vllm-ascend, or on CUDA, the patched probe is not run, and its
    row says why (detected from the plain probe, never assumed)."""
    from residency.notebook import api

    calls: list[tuple[str, str]] = []

    def fake(spec: str, *, patch: str = "none", timeout_s: float) -> dict:
        calls.append((spec, patch))
        kind = {"auto": "npu"}.get(spec, spec)
        return {"device_kind": kind, "accelerator_patch": patch, "vllm_ascend": None,
                "generic": {}, "registered": {}, "bug_present": False, "verdict": "x"}

    monkeypatch.setattr(api, "_run_probe", fake)
    probes = nb.probe("auto")
    assert list(probes) == ["npu", "npu + vllm-ascend", "cpu"]
    assert calls == [("auto", "none"), ("cpu", "none")]  # no patched probe was started
    assert probes["npu + vllm-ascend"]["skipped"].startswith("vllm-ascend is not installed")
    table = nb.probe_table(probes)
    assert _cell(table, "vllm-ascend", "")["outcome"] == "not probed"
    cuda = nb.probe("cuda", accelerator_patch="vllm-ascend")
    assert list(cuda) == ["cuda + vllm-ascend"]
    assert "NPU devices only" in cuda["cuda + vllm-ascend"]["skipped"]
    assert nb.api_results(cuda)["device_kind"] == "cuda"


def test_api_probe_on_the_emulated_npu_shows_both_rows() -> None:
    """Plain PyTorch: both generic queries raise. Under the emulated vllm-ascend patch:
    memory_reserved answers through the redirect, memory_allocated raises PyTorch's own
    error."""
    probes = nb.probe("emulated-npu")  # accelerator_patch="both" by default
    assert list(probes) == ["emulated-npu", "emulated-npu + vllm-ascend"]
    table = nb.probe_table(probes)
    detail = "value (bytes) or exception"
    plain = _cell(table, "none", "torch.accelerator.memory_reserved(d)")
    assert plain["outcome"] == "error" and "not a DeviceAllocator" in plain[detail]
    assert plain["function that ran"].endswith("memory_reserved (PyTorch's own)")
    reserved = _cell(table, "vllm-ascend", "torch.accelerator.memory_reserved(d)")
    assert reserved["outcome"] == "ok" and reserved[detail].isdigit()
    assert reserved["function that ran"] == \
        "residency.emulated.device.EmulatedNPU.memory_reserved (redirected)"
    allocated = _cell(table, "vllm-ascend", "torch.accelerator.memory_allocated(d)")
    assert allocated["outcome"] == "error"
    assert "Allocator for npu is not a DeviceAllocator" in allocated[detail]
    assert allocated["function that ran"] == \
        "torch.accelerator.memory.memory_allocated (PyTorch's own)"
    for patch in ("none", "vllm-ascend"):
        module = _cell(table, patch, "torch.get_device_module(d).memory_allocated(d)")
        assert module["outcome"] == "ok"
    results = nb.api_results(probes)
    assert (results["device_kind"], results["accelerator_patch"]) == ("emulated-npu", "none")
    patched = results["comparison"]["emulated-npu + vllm-ascend"]
    assert patched["bug_present"] is True and "second query" in patched["verdict"]
    verdict = nb.verdict_markdown(probes)
    assert "with the vllm-ascend patch, applied by residency.emulated.patches" in verdict
    assert ("Redirected: `reserved`, `memory_stats`, `get_memory_info`; PyTorch's own: "
            "`allocated`.") in verdict
    arms = nb.arms_table(probes)
    assert set(arms["accelerator patch"]) == {"none", "vllm-ascend"}


def test_probe_refuses_an_unknown_device_before_starting_anything() -> None:
    with pytest.raises(nb.ParameterError, match="`device` must be one of"):
        nb.probe("tpu")


# ----------------------------------------------------------------------------- build.py
def test_committed_notebooks_are_what_build_py_writes(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(NOTEBOOKS / "build.py"), str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    for name in nb.NOTEBOOKS:
        assert (tmp_path / f"{name}.ipynb").read_bytes() == \
            (NOTEBOOKS / f"{name}.ipynb").read_bytes(), f"run python notebooks/build.py ({name})"


@pytest.mark.parametrize(("name", "expected"), [
    ("api_reproduction", {"device": "auto", "output_dir": None, "source": "run",
                          "accelerator_patch": "both"}),
    ("consecutive_requests", {"device": "auto", "output_dir": None, "source": "run",
                              "ranks": 2, "requests": 3, "steps": 2, "scale": 1.0,
                              "service": None, "inject_failure": "none",
                              "require_exclusive": False}),
    ("paired_profile", {"device": "auto", "output_dir": None, "source": "run", "ranks": 2,
                        "steps": 50, "seed": 2101, "scale": 1.0, "pairs": 10, "requests": 5,
                        "service": None, "aa_source": None, "inject_failure": "none",
                        "stop_when_decided": False, "plan_pilot": None, "plan_cv": None,
                        "plan_effect_s": None, "plan_budget_hours": None,
                        "require_exclusive": False, "compare": None}),
])
def test_notebook_parameters_cell(name: str, expected: dict) -> None:
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# ")
    params = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and book.cells[1] is params[0]
    values: dict = {}
    exec(params[0].source, {}, values)
    assert values == expected
    assert "nb.check_parameters(" in book.cells[2].source
    assert "nb.prepare_output_dir(" in book.cells[2].source
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in book.cells if c.cell_type == "code")


# ----------------------------------------------------------------------------- reports
def _executed_notebook(path: Path) -> Path:
    book = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A report"),
        nbformat.v4.new_code_cell("secret_source_code = 41 + 1\nprint(secret_source_code)",
                                  execution_count=1, outputs=[nbformat.v4.new_output(
                                      "stream", name="stdout", text="42\n")]),
        nbformat.v4.new_code_cell("progress()", execution_count=2, outputs=[
            nbformat.v4.new_output("stream", name="stderr", text=f"\rbar {i}/3")
            for i in (1, 2, 3)]),
    ])
    nbformat.write(book, path)
    return path


def test_report_hides_inputs(tmp_path: Path) -> None:
    src = _executed_notebook(tmp_path / "demo.ipynb")
    html = reports.render_html(src, tmp_path / "out")
    assert html == (tmp_path / "out" / "demo.html").resolve()
    text = html.read_text()
    assert "42" in text and "A report" in text
    assert "secret_source_code" not in text and "In&nbsp;[" not in text
    assert "bar 3/3" in text and "bar 1/3" not in text  # a redrawn progress bar: last state


def test_report_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from residency.cli.main import main

    (tmp_path / "nbs").mkdir()
    _executed_notebook(tmp_path / "nbs" / "a.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]),
                   tmp_path / "nbs" / "never_run.ipynb")
    (tmp_path / "nbs" / "torn.ipynb").write_text('{"cells": [')
    code = main(["report", str(tmp_path / "nbs"), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2  # bad input: the notebooks that could not be used
    assert captured.out.splitlines() == [str((tmp_path / "out" / "a.html").resolve()),
                                         str((tmp_path / "out" / "index.html").resolve())]
    assert "never_run.ipynb: has no outputs: execute it first" in captured.err
    assert "torn.ipynb: cannot read notebook" in captured.err
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_report_cli_exits_1_when_a_usable_notebook_fails(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A screenshot that cannot be taken is a failure of the work, not of the input."""
    from residency.cli.main import main

    _executed_notebook(tmp_path / "a.ipynb")
    monkeypatch.setenv("CHROMIUM", "/bin/false")
    code = main(["report", str(tmp_path / "a.ipynb"), "--screenshot", "--out",
                 str(tmp_path / "out")])
    assert code == 1, capsys.readouterr().err
    assert (tmp_path / "out" / "a.html").is_file()


# ----------------------------------------------------------------------------- slow: papermill
SMALL = ("-p", "ranks", "2", "-p", "steps", "2", "-p", "scale", "0.02")


@pytest.fixture(scope="module")
def executions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Papermill]]:
    """Every notebook execution of the slow tests, started at once (each mostly waits on
    service start-up, so together they take about as long as the longest)."""
    def folder(name: str) -> Path:
        return tmp_path_factory.mktemp(name)

    paired, consecutive, api, bad, bare = (folder(n) for n in (
        "paired", "consecutive", "api", "bad", "bare"))
    starts = {
        "paired": lambda: Papermill("paired_profile", paired / "paired_profile.ipynb", *SMALL,
                                    "-p", "pairs", "1", "-r", "output_dir", str(paired),
                                    cwd=paired),
        "consecutive": lambda: Papermill("consecutive_requests", consecutive / "c.ipynb",
                                         *SMALL, "-p", "requests", "3", "-r", "output_dir",
                                         str(consecutive), cwd=consecutive),
        "api": lambda: Papermill("api_reproduction", api / "a.ipynb", "-r", "output_dir",
                                 str(api), cwd=api),
        "bad": lambda: Papermill("paired_profile", bad / "bad.ipynb", "-r", "source",
                                 str(bad / "missing"), cwd=bad),
        "bare": lambda: Papermill("paired_profile", None, "-r", "source", str(PAIRED),
                                  cwd=bare),
    }
    runs = {}
    for name, start in starts.items():  # kernels one after another, then all run together
        runs[name] = start()
        runs[name].kernel_up()
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


@pytest.mark.slow
def test_paired_profile_notebook_on_a_fresh_run(executions: dict[str, Papermill]) -> None:
    run = executions["paired"]
    run.ok()
    results = json.loads((run.cwd / "results.json").read_text())
    assert results["device_kind"] == "emulated-npu" and results["source"] == "run"
    assert [len(results["normal_call_ms"][a]) for a in ("baseline", "candidate")] == [2, 2]
    assert [len(results["e2e_s"][a]) for a in ("baseline", "candidate")] == [1, 1]
    assert all(v is not None for v in results["idle_intersection_ms"].values())
    assert results["normal_calls"]["candidate"]["released"] == 0
    assert results["normal_calls"]["baseline"]["released"] == \
        results["normal_calls"]["baseline"]["total"] > 0
    for arm in ("baseline", "candidate"):
        forced = results["forced_calls"][arm]
        assert forced["released"] == forced["total"] > 0
    for name in ("evidence.md", "evidence.csv", "published.md", "normal_calls.png", "idle.png",
                 "e2e.png"):
        assert name in results["files"] and (run.cwd / name).is_file()
    assert load_run(run.cwd / "run").design == "paired-profile"


@pytest.mark.slow
def test_fresh_run_reports_progress_on_papermills_terminal(
        executions: dict[str, Papermill]) -> None:
    """The kernel's progress lines reach papermill's standard error (its terminal): what
    runs now, runs done, the time left."""
    done = executions["paired"].ok()
    lines = [ln.split("residency: ", 1)[1] for ln in done.stderr.splitlines()
             if "residency: paired-profile" in ln]  # (after papermill's bar in a file)
    assert any("run 1/4: baseline, profiled pair" in ln for ln in lines), lines
    assert any("1/4 runs done" in ln and "left" in ln for ln in lines), lines
    assert lines[-1].startswith("paired-profile: finished: 4/4 runs in"), lines


@pytest.mark.slow
def test_consecutive_requests_notebook_on_a_fresh_run(executions: dict[str, Papermill]) -> None:
    run = executions["consecutive"]
    run.ok()
    r = json.loads((run.cwd / "results.json").read_text())
    assert (r["device_kind"], r["ranks"], r["requests"]) == ("emulated-npu", 2, 3)
    assert r["normal_retained"] == r["normal_total"] == 6
    assert r["forced_released"] == r["forced_total"] > 0
    assert (r["telemetry_errors"], r["oom"], r["gate_failures"]) == (0, 0, [])
    assert (run.cwd / "fractions.png").is_file()


@pytest.mark.slow
def test_api_reproduction_notebook_detects_the_bug(executions: dict[str, Papermill]) -> None:
    run = executions["api"]
    run.ok()
    r = json.loads((run.cwd / "results.json").read_text())
    assert (r["device_kind"], r["bug_present"]) == ("emulated-npu", True)
    assert r["generic"]["allocated"]["ok"] is False and r["registered"]["allocated"]["ok"]
    assert list(r["comparison"]) == ["emulated-npu + vllm-ascend", "cpu"]
    assert r["comparison"]["cpu"]["bug_present"] is False
    patched = r["comparison"]["emulated-npu + vllm-ascend"]
    assert patched["generic"]["reserved"]["ok"] and not patched["generic"]["allocated"]["ok"]


@pytest.mark.slow
def test_bad_source_fails_the_first_cell_with_one_sentence(
        executions: dict[str, Papermill]) -> None:
    run = executions["bad"]
    done = run.wait()
    sentence = (f"ParameterError: The value for `source` must be \"run\" or a recorded run "
                f"directory, but '{run.cwd / 'missing'}' does not exist.")
    assert done.returncode != 0 and sentence in done.stderr
    assert run.out is not None
    errors = [o for c in nbformat.read(run.out, as_version=4).cells
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert [e.traceback for e in errors] == [[sentence]]
    assert not (run.cwd / "reports").exists()  # nothing ran before the check


@pytest.mark.slow
def test_papermill_without_output_path_writes_to_a_new_reports_folder(
        executions: dict[str, Papermill]) -> None:
    """Stdout not a terminal: papermill writes the executed notebook to stdout; the notebook
    puts its outputs under ./reports/paired_profile/<UTC timestamp>/ and says so on stderr."""
    run = executions["bare"]
    done = run.ok()
    (folder,) = (run.cwd / "reports" / "paired_profile").iterdir()
    assert f"residency: paired_profile: results.json, tables and figures go to {folder}" \
        in done.stderr
    # issue 25: a table is a name with a .md and/or a .csv (CSV-only tables count too)
    names = {p.stem for p in folder.iterdir() if p.suffix in (".md", ".csv")}
    assert len(names) > 7
    assert f"residency: done: results.json, {len(names)} table(s) (.md/.csv) and 5 figure(s) " \
        f"(.png) in {folder}" in done.stderr
    assert nbformat.reads(done.stdout, as_version=4).metadata.papermill["output_path"] == "-"
    assert json.loads((folder / "results.json").read_text())["run_dir"] == str(PAIRED.resolve())


@pytest.mark.slow
def test_report_of_an_executed_notebook_and_its_screenshot(
        executions: dict[str, Papermill]) -> None:
    run = executions["paired"]
    run.ok()
    assert run.out is not None
    html = reports.render_html(run.out, run.cwd / "r")
    text = html.read_text()
    assert "check_parameters" not in text and "Statistical note" in text
    assert "emulated NPU — not an NPU measurement" in text
    if reports.find_chromium() is None:
        pytest.skip("no Chromium installed (apt-get install chromium): screenshot not taken")
    png = reports.screenshot(html, run.cwd / "r" / "paired_profile.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
