"""Every device side by side: the cross-device table of the recorded emulated and CUDA runs
plus the published NPU figures, its numbers computed independently here from the run files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from residency.evidence.crossdevice import cross_device, injected
from residency.records import decisions as decisions_format
from residency.records.manifest import read_manifest
from residency.reports import cross_device as view
from residency.rundir.run import load_run
from tests.helpers import ROOT, run_cli

EMULATED = ROOT / "data/runs/emulated-paired-profile-2r50s"
CUDA = ROOT / "data/runs/cuda-paired-profile-1r50s"
PUBLISHED = ROOT / "residency/data/h3_ref2va_910b1.json"


def known(run_dir: Path) -> dict:
    """The table's numbers straight from manifest.json, client.json and the decisions JSONL:
    unprofiled runs' measured requests (warm-ups by request id), E2E paired in run order."""
    m = read_manifest(run_dir)
    calls = {(arm, kind): [] for arm in ("baseline", "candidate") for kind in ("normal",
                                                                               "forced")}
    released = {"baseline": 0, "candidate": 0}
    cached, reserved = [], []
    e2e = {"baseline": [], "candidate": []}
    for entry in m["runs"]:
        e2e_list = e2e[entry["arm"]]
        if entry["profiled"]:
            continue
        e2e_list.append(entry["e2e_s"])
        ids = set(entry.get("request_ids") or [entry["request_id"]])
        for path in sorted((run_dir / entry["dir"]).glob(decisions_format.DECISIONS_GLOB)):
            for d in decisions_format.read_records(path):
                if d["request_id"] not in ids:
                    continue
                calls[entry["arm"], d["kind"]].append((d["end_ns"] - d["start_ns"]) / 1e6)
                if d["kind"] == "normal":
                    released[entry["arm"]] += d["outcome"] == "released"
                    if d["snapshot"]:
                        s = d["snapshot"]
                        cached.append(s["reserved"] - s["allocated"])
                        reserved.append(s["reserved"])
    deltas = [c - b for b, c in zip(e2e["baseline"], e2e["candidate"], strict=True)]
    base_rel = [v for (a, k), vs in calls.items() if (a, k) == ("baseline", "normal")
                for v in vs]
    return {"normal": {a: statistics.median(calls[a, "normal"]) for a in e2e},
            "forced": {a: statistics.median(calls[a, "forced"]) for a in e2e},
            "calls": {a: len(calls[a, "normal"]) for a in e2e}, "released": released,
            "reserved": int(statistics.median(reserved)),
            "per_gib": (statistics.median(base_rel) / (statistics.median(cached) / 2**30)
                        if released["baseline"] else None),
            "delta": statistics.median(deltas),
            "share": statistics.median(deltas) / statistics.median(e2e["baseline"])}


@pytest.fixture(scope="module")
def columns():
    return cross_device([load_run(EMULATED), load_run(CUDA)], published=True)


def test_each_runs_column_matches_its_files(columns) -> None:
    for col, run_dir in zip(columns, (EMULATED, CUDA), strict=False):
        k = known(run_dir)
        assert col.name == run_dir.name and col.injected == "no" and col.scale == "1.0"
        assert col.reserved_bytes == k["reserved"]
        for arm in ("baseline", "candidate"):
            assert col.normal_ms[arm].median == pytest.approx(k["normal"][arm])
            assert col.normal_ms[arm].n == k["calls"][arm]
            assert col.forced_ms[arm].median == pytest.approx(k["forced"][arm])
            assert col.normal_released[arm] == (k["released"][arm], k["calls"][arm])
        assert col.e2e_delta_s == pytest.approx(k["delta"])
        assert col.e2e_share == pytest.approx(k["share"])
        if k["per_gib"] is None:
            assert col.normal_ms_per_gib["baseline"] is None
            assert col.missing["normal_ms_per_gib.baseline"] == "no normal call released"
        else:
            assert col.normal_ms_per_gib["baseline"] == pytest.approx(k["per_gib"])
    emulated, cuda, _ = columns
    assert emulated.released_gib_per_call["baseline"] == 0.75  # 805306368 B cached per call
    assert cuda.normal_released["baseline"] == (0, 18)  # the bug is absent on CUDA


def test_the_published_column_and_labels(columns) -> None:
    pub = json.loads(PUBLISHED.read_text())["rows"]
    col = columns[-1]
    assert col.published and col.device_kind == "npu" and col.label == "Ascend NPU"
    assert (col.normal_ms["baseline"].low, col.normal_ms["baseline"].high) == tuple(
        pub[0]["baseline"])
    assert col.idle_intersection_ms == {"baseline": pub[3]["baseline"],
                                        "candidate": pub[3]["candidate"]}
    assert col.e2e_delta_s == pytest.approx(pub[4]["candidate"] - pub[4]["baseline"])
    assert col.forced_ms["baseline"] is None and col.missing["forced_ms"] == "not published"
    table = view.cross_device_table(columns)
    headers = list(table.columns)
    assert headers == ["quantity",
                       "emulated-paired-profile-2r50s (emulated NPU — not an NPU measurement)",
                       "cuda-paired-profile-1r50s (CUDA GPU)", "published (Ascend NPU)"]
    assert "these are not NPU figures" in table.attrs["footer"]
    row = dict(zip(table["quantity"], table.iloc[:, 3], strict=True))
    assert row["normal-release markers ∩ all-rank no-device-task time"] == \
        "221.296680 ms → 3.164550 ms"  # published precision
    assert row["normal-call cost per call"] == "216.822–251.161 ms (8 ranks) → " \
                                              "1.334–1.579 ms (8 ranks)"


def test_injected_reads_the_manifest_field_else_no() -> None:
    assert injected({"params": {}}) == "no"
    assert injected({"params": {"inject_failure": {"kind": "generic-telemetry",
                                                   "accelerator_patch": "vllm-ascend"}}}) == \
        "generic-telemetry (vllm-ascend)"
    assert injected({"params": {"inject_failure": None}}) == "no"


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_cli_tables_several_runs_in_every_format(fmt) -> None:
    rc, out, err = run_cli("tables", str(EMULATED), str(CUDA), "--published", "--format", fmt)
    assert rc == 0 and err == ""
    text = out
    assert "emulated NPU — not an NPU measurement" in text and "Ascend NPU" in text
    if fmt == "json":
        doc = json.loads(text)
        assert [c["device_kind"] for c in doc["columns"]] == ["emulated-npu", "cuda", "npu"]
        assert [c["measurement"] for c in doc["columns"]] == [False, True, True]
    elif fmt == "md":
        assert text.startswith("### Cross-device: ") and "| normal-call cost per call |" in text


def test_cli_refuses_pr_and_aa_for_several_runs() -> None:
    for extra in (["--format", "pr"], ["--aa", str(EMULATED)]):
        rc, _, err = run_cli("tables", str(EMULATED), str(CUDA), *extra)
        assert rc == 2 and len(err.splitlines()) == 1


def test_normal_call_figure_is_log_scale(columns) -> None:
    fig = view.normal_call_figure(columns)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert [t.get_text().splitlines()[0] for t in ax.get_xticklabels()] == [
        c.name for c in columns]


def test_notebook_compare_and_require_exclusive_parameters() -> None:
    from residency import notebook as nb

    params = nb.check_parameters(compare=[str(CUDA)], require_exclusive=True)
    assert params == {"compare": [str(CUDA.resolve())], "require_exclusive": True}
    with pytest.raises(nb.ParameterError, match="`compare` must be a readable run directory"):
        nb.check_parameters(compare=[str(ROOT / "data")])
    with pytest.raises(nb.ParameterError, match="`require_exclusive` must be True or False"):
        nb.check_parameters(require_exclusive="yes")
    table, fig, cols = nb.cross_device(load_run(EMULATED), [str(CUDA)])
    assert [c["name"] for c in cols] == [EMULATED.name, CUDA.name, "published"]
    assert list(table.columns)[1:] == [view.header(c) for c in
                                       cross_device([load_run(EMULATED), load_run(CUDA)],
                                                    published=True)]
