"""Capture folders as serving frameworks write them, and our exports as other tools read them
(issue 40, items 2 and 3).

Fixtures: tests/data/captures/<framework>/ (written by make_capture_fixtures.py; layouts of
TraceLens' real test captures). Every expected figure comes from `oracle`: stdlib json with
Decimal times and a plain sort-and-sweep union, never residency's interval code.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from residency.traces.load import TraceNote, load_traces
from tests.helpers import ENV, ROOT, figures, ns, oracle_json, oracle_union
from tests.helpers import idle_cli as cli

CAPTURES = ROOT / "tests" / "data" / "captures"
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
HOST = {"user_annotation", "cpu_op", "python_function"}
FRAMEWORKS = {  # folder: (trace files in rank order, a window marker)
    "vllm": (["graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
              "graph_capture_rank_1.1773709742341311017.pt.trace.json.gz"], "capture_32_FULL"),
    "sglang": (["bs_32_rank0.json.gz"], "capture_32"),
    "xdit": (["capture_trace_rank_0.json.gz", "capture_trace_rank_1.json.gz"],
             "flux_denoise_step"),
    "tensorboard": (["gpu-host-a_4021.1735632360123456789.pt.trace.json",
                     "gpu-host-a_4022.1735632360123457788.pt.trace.json.gz"], "ProfilerStep"),
}
HTA_RANK = re.compile(r'"rank":\s+(\d+)')  # hta/common/trace_file.py, line by line


# -- the oracle ----------------------------------------------------------------------------------

read_json = oracle_json


union = oracle_union


def covered(rows: list[tuple[int, int]], window: list[list[int]]) -> int:
    return sum(max(0, min(e, b) - max(s, a)) for s, e in union(rows) for a, b in window)


def rank_events(path: Path) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int]]]]:
    doc = read_json(path)
    base = int(doc.get("baseTimeNanoseconds", 0))
    device, host = [], {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        start = base + ns(e["ts"])
        row = (start, start + ns(e["dur"]))
        if str(e.get("cat", "")).lower() in DEVICE:
            device.append(row)
        elif e.get("cat") in HOST:
            host.setdefault(e["name"], []).append(row)
    return device, host


def oracle(files: list[Path], window_marker: str | None = None) -> dict[str, object]:
    ranks = [rank_events(f) for f in files]
    every = [r for dev, _ in ranks for r in dev]
    if window_marker is None:
        window = [[min(s for s, _ in every), max(e for _, e in every)]]
    else:
        window = union([r for _, host in ranks for name, rows in host.items()
                        if window_marker in name for r in rows])
    measure = sum(e - s for s, e in window)
    return {"window_measure_ns": measure, "all_rank_idle_ns": measure - covered(every, window),
            "idle_ns": [measure - covered(dev, window) for dev, _ in ranks],
            "span_idle_ns": [max(e for _, e in dev) - min(s for s, _ in dev)
                             - sum(e - s for s, e in union(dev)) for dev, _ in ranks]}


# -- item 2: capture folders ---------------------------------------------------------------------

@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("windowed", [False, True], ids=["span", "marker"])
def test_capture_folder_against_the_oracle(framework, windowed):
    """The folder as the framework leaves it, sidecar included. Before: exit 2, 'cannot tell
    the rank of .../execution_details.json' (any JSON array was taken for a trace)."""
    names, marker = FRAMEWORKS[framework]
    files = [CAPTURES / framework / n for n in names]
    kw = {"window_marker": marker} if windowed else {}
    got = figures(CAPTURES / framework, **kw)
    assert got == oracle(files, marker if windowed else None)
    assert got["all_rank_idle_ns"] > 0 and all(i > 0 for i in got["span_idle_ns"])


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_the_sidecar_is_skipped_with_one_note_naming_it(framework):
    with pytest.warns(TraceNote) as notes:
        ts = load_traces(CAPTURES / framework, cache=False)
    assert list(ts.ranks) == list(range(len(FRAMEWORKS[framework][0])))
    skipped = [str(n.message) for n in notes if "skipped" in str(n.message)]
    assert len(skipped) == 1 and "execution_details.json" in skipped[0]
    assert "no trace events" in skipped[0]


def test_cli_on_the_vllm_capture_folder():
    out = cli(str(CAPTURES / "vllm"), "--json")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("residency idle: note: skipped ")
    assert "execution_details.json" in lines[0]
    got = json.loads(out.stdout)
    want = oracle([CAPTURES / "vllm" / n for n in FRAMEWORKS["vllm"][0]])
    assert got["all_rank_idle_ns"] == want["all_rank_idle_ns"]
    assert got["window_measure_ns"] == want["window_measure_ns"]


def test_a_sidecar_is_judged_by_its_content_not_its_name(tmp_path):
    """A trace named execution_details.json is read; a sidecar named like a trace is not."""
    src = CAPTURES / "xdit"
    trace = tmp_path / "a"
    trace.mkdir()
    (trace / "execution_details.json").write_bytes(
        gzip.decompress((src / "capture_trace_rank_0.json.gz").read_bytes()))
    with pytest.warns(UserWarning, match="world_size is 2 but 1 rank"):  # rank 1 not there
        assert list(load_traces(trace, cache=False).ranks) == [0]
    side = tmp_path / "b"
    shutil.copytree(src, side)
    shutil.move(side / "execution_details.json", side / "capture_trace_rank_7.json")
    with pytest.warns(TraceNote, match=r"capture_trace_rank_7.json: .*no trace events"):
        assert list(load_traces(side, cache=False).ranks) == [0, 1]


def test_a_trace_whose_first_event_lacks_ph_is_still_a_trace(tmp_path):
    """Records without "ph" anywhere are a sidecar; a trace whose first record lacks it (one
    event the loader rejects and counts) is a trace (the fuzz suite's counterexample)."""
    event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 0, "ts": 0, "dur": 5}
    first = {k: v for k, v in event.items() if k != "ph"}
    (tmp_path / "rank0.json").write_text(json.dumps([first, event, {**event, "ts": 10}]))
    traces = load_traces(tmp_path, cache=False)
    assert list(traces.ranks) == [0]


def test_json_nested_past_the_parsers_stack_is_refused_as_input(tmp_path):
    """A JSON object without traceEvents nested 3,000 deep: a TraceError naming the file,
    never a RecursionError (the description of what it holds parsed the head with json)."""
    from residency.traces.files import TraceError

    (tmp_path / "rank0.json").write_text(
        '{"schemaVersion":1,"deviceProperties":' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(TraceError, match="rank0.json"):
        load_traces(tmp_path, cache=False)


# -- F13 of issue 41: format from structure ----------------------------------------------------

@pytest.mark.parametrize("shape", ["object", "array"])
def test_a_kernel_named_ascend_hardware_stays_kineto(tmp_path, shape):
    """Before: read as torch-npu (its device process found by the text 'Ascend Hardware')."""
    src = CAPTURES / "sglang" / "bs_32_rank0.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "Ascend Hardware"
    kernel["args"]["name"] = "Ascend Hardware"  # nested too: still no process_name event
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc if shape == "object" else doc["traceEvents"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = load_traces(path, cache=False)
    assert ts.format == "kineto"
    if shape == "object":
        assert figures(path) == oracle([path])


# -- item 3: the emulator's exports as HTA, TraceLens and Perfetto read them ---------------------

EXPORT = """
import json, sys
from pathlib import Path
from residency import markers
from residency.emulated.device import EmulatedNPU
out = Path(sys.argv[1])
npus = [EmulatedNPU(capacity_bytes=64 << 20) for _ in (0, 1)]  # two ranks, one clock
for npu in npus:
    npu.start_trace()
with markers.span(markers.RELEASE_NORMAL):
    for npu in npus:
        npu.launch("scale", lambda: None)
        npu.synchronize()
for rank, npu in enumerate(npus):
    npu.stop_trace()
    npu.export_trace(out / f"rank{rank}.trace.json", rank=rank, world_size=2)
print(json.dumps({"ok": True}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export")
    proc = subprocess.run([sys.executable, "-c", EXPORT, str(out)], capture_output=True,
                          text=True, env=ENV, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return out


def hta_ranks(folder: Path) -> dict[int, str]:
    """HolisticTraceAnalysis' rank map (hta/common/trace_file.py): the first line of each
    *.json / *.gz file that matches `"rank":\\s+(\\d+)`."""
    ranks = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".gz", ".json")):
            continue
        with open(folder / name) as f:
            for line in f:
                if m := HTA_RANK.search(line):
                    ranks[int(m.group(1))] = name
                    break
    return ranks


def test_hta_finds_every_rank_of_an_emulated_export(exported):
    """Before: one line of compact JSON, '"rank":1': HTA found no rank in either file."""
    assert hta_ranks(exported) == {0: "rank0.trace.json", 1: "rank1.trace.json"}


def test_the_export_is_laid_out_as_kineto_writes(exported):
    real = gzip.decompress((CAPTURES / "vllm" / FRAMEWORKS["vllm"][0][0]).read_bytes()).decode()
    ours = (exported / "rank1.trace.json").read_text()
    keys = re.compile(r'^ {2,6}"(\w+)":', re.MULTILINE)  # the document's own keys
    top = [k for k in keys.findall(ours) if k in json.loads(ours)]
    assert top == ["schemaVersion", "deviceProperties", "distributedInfo", "displayTimeUnit",
                   "baseTimeNanoseconds", "traceEvents", "traceName"]
    order = [k for k in keys.findall(real) if k in top]
    assert order == [k for k in top]  # the same order as the real capture's
    assert '"distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2}' in ours
    # every event's times as Kineto writes them: <us>.<3 digits>
    times = re.findall(r'"(?:ts|dur)": ([^,\n]+)', ours)
    assert times and all(re.fullmatch(r"\d+\.\d{3}", t) for t in times)
    doc = json.loads(ours)
    assert doc["distributedInfo"]["rank"] == 1 and isinstance(doc["traceEvents"], list)
    assert {e["ph"] for e in doc["traceEvents"]} <= {"X", "M", "i"}  # Perfetto's JSON phases


def test_exports_in_both_layouts_read_the_same(exported, tmp_path):
    """Recorded runs hold the compact layout: it still reads, to the same timelines."""
    compact = tmp_path / "compact"
    compact.mkdir()
    for f in exported.iterdir():
        doc = json.loads(f.read_text())
        (compact / f.name).write_text(json.dumps(doc, separators=(",", ":")))
    a, b = load_traces(exported, cache=False), load_traces(compact, cache=False)
    assert list(a.ranks) == list(b.ranks) == [0, 1]
    for r in a.ranks:
        assert a.ranks[r].device.tolist() == b.ranks[r].device.tolist()
        assert a.ranks[r].ranges.tolist() == b.ranks[r].ranges.tolist()
        assert a.ranks[r].range_names.tolist() == b.ranks[r].range_names.tolist()
    assert a.ranks[0].device_tasks == 1
