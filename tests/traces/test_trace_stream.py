"""Streaming the trace parse (issue 18) and reading trace files safely (issue 14, items 2-3).

* The streamed parse gives the same outcome as the whole-file parse (`parse_whole`, decoding
  the document in one call) on every fixture and fuzz-corpus file, for chunk sizes down to one
  byte, so chunk boundaries fall inside strings, escapes and numbers; on mutated fixtures and
  on generated documents full of boundary look-alikes (hypothesis).
* Decompression is streamed: a gzip bomb ends in one clear error with bounded memory (peak RSS
  of a child process, its VmHWM); truncated input names its byte position.
* Only regular files are read; links leaving the folder are refused; cache digests are checked.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import load as traces
from residency.traces.files import TraceError
from residency.traces.formats import (
    NotAligned,
    join_parts,
    parse_part,
    parse_trace,
    parse_whole,
    part_bounds,
)
from residency.traces.load import CACHE_DIR, load_traces
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data"
# RESIDENCY_FUZZ_EXAMPLES=1500 for a deeper run
FUZZ = settings(derandomize=True, database=None, deadline=None,
                max_examples=int(os.environ.get("RESIDENCY_FUZZ_EXAMPLES", "150")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHUNKS = [1, 2, 3, 7, 64, 4096, 8 << 20]
# Chunks of a few bytes cost ~25 s per MB of trace here (the reader's boundary handling, run
# at every byte): they run on the files up to this size; larger files (the real CUDA profiles
# of data/runs, 0.4-2.6 MB) in chunks of at least LARGE_FILE_MIN_CHUNK bytes.
TINY_CHUNKS_MAX_BYTES = 128 << 10
LARGE_FILE_MIN_CHUNK = 4096


def chunks_for(path: Path, chunks: list[int]) -> list[int]:
    """`chunks`, without those under LARGE_FILE_MIN_CHUNK for a file over
    TINY_CHUNKS_MAX_BYTES."""
    if path.stat().st_size <= TINY_CHUNKS_MAX_BYTES:
        return chunks
    return [c for c in chunks if c >= LARGE_FILE_MIN_CHUNK]


def trace_files() -> list[tuple[str, Path]]:
    out = []
    # the fixtures, the fuzz corpus and the torch.profiler traces of the committed run
    for base in (DATA / "traces", DATA / "fuzz", ROOT / "data" / "runs"):
        for p in sorted(base.rglob("*.json*")):
            if CACHE_DIR in p.parts or p.name.startswith("profiler_info") or (
                    p.name == "expected.json") or (base.name == "runs" and
                                                   p.parent.name != "trace"):
                continue
            out.append(("ascend" if p.name == "trace_view.json" else "kineto", p))
    return out


def outcome(fn) -> tuple:
    """Everything a parse yields, or its error's message and position."""
    try:
        p = fn()
    except TraceError as exc:
        return "error", exc.message, exc.position
    return ("ok", p.rank, p.device.tolist(), p.ranges.tolist(), p.names.tolist(), p.rejected,
            p.device_task_type.tolist(), p.range_task_type.tolist(), p.range_lane.tolist(),
            p.task_types, p.lanes, None if p.device_names is None else p.device_names.tolist())


def whole(fmt: str, path: Path, raw: bytes) -> tuple:
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error):
            return ("error", "cannot read")
    return outcome(lambda: parse_whole(fmt, path, raw))


MALFORMED = "invalid JSON: JSON is malformed: "


def same(streamed: tuple, reference: tuple) -> bool:
    """Equal outcomes. Two wordings may differ: the gzip layer's (`gzip` vs `zlib`), and
    msgspec's reason for malformed JSON where it depends on bytes after the error (a tagged
    event whose ``ph`` comes after a broken value: msgspec skips ahead looking for the tag),
    which a stream has not read yet; the error's position is the same."""
    if reference[:2] == ("error", "cannot read"):
        return streamed[0] == "error" and streamed[1].startswith("cannot read")
    if reference[0] == streamed[0] == "error" and all(
            o[1].startswith(MALFORMED) for o in (reference, streamed)):
        return streamed[2] == reference[2]
    return streamed == reference


@pytest.mark.parametrize("fmt,path", trace_files(),
                         ids=[str(p.relative_to(ROOT)) for _, p in trace_files()])
def test_streamed_equals_whole_on_every_fixture(fmt, path):
    reference = whole(fmt, path, path.read_bytes())
    for chunk in chunks_for(path, CHUNKS):
        got = outcome(lambda c=chunk: parse_trace(fmt, path, chunk_bytes=c))
        assert same(got, reference), (chunk, got, reference)


def _mutate(raw: bytes, data: st.DataObject) -> bytes:
    kind = data.draw(st.sampled_from(["truncate", "flip", "delete", "duplicate", "insert"]))
    n = len(raw)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(i, min(n, i + 200)))
    if kind == "truncate":
        return raw[:i]
    if kind == "flip":
        return raw[:i] + bytes([raw[i] ^ (1 << data.draw(st.integers(0, 7)))]) + raw[i + 1:]
    if kind == "delete":
        return raw[:i] + raw[j:]
    if kind == "duplicate":
        return raw[:j] + raw[i:j] + raw[j:]
    junk = data.draw(st.sampled_from([b"},{", b'"', b"\\", b"]", b",", b"[", b"{", b"1e",
                                      b'"},{"', b"\\u00", b"  \n", b"-"]))
    return raw[:i] + junk + raw[i:]


PLAIN = [(f, p) for f, p in trace_files() if not p.name.endswith(".gz") and
         "deep" not in str(p)][:12]


@FUZZ
@given(st.sampled_from(PLAIN), st.data(), st.sampled_from([1, 2, 5, 16, 97]))
def test_streamed_equals_whole_on_mutated_fixtures(tmp_path_factory, case, data, chunk):
    fmt, path = case
    raw = _mutate(path.read_bytes(), data)
    d = tmp_path_factory.mktemp("m")
    target = d / path.name
    target.write_bytes(raw)
    assert same(outcome(lambda: parse_trace(fmt, target, chunk_bytes=chunk)),
                whole(fmt, target, raw))


TRICKY = st.sampled_from(['k', '},{', '}, {"ph": "X"', '\\"', 'a\\\\', '\\\\"', ']', '[{',
                          '\\u00e9', 'caf\u00e9', ',', '"ts": 1', ' ']).map(
    lambda s: s)
NUMBER = st.one_of(st.integers(-10**6, 10**15), st.floats(-1e9, 1e12, allow_nan=False),
                   st.from_regex(r"[0-9]{1,16}\.[0-9]{1,6}", fullmatch=True))


def _event(draw: st.DrawFn) -> dict:
    ev = {"ph": draw(st.sampled_from(["X", "X", "X", "B", "M"])),
          "cat": draw(st.sampled_from(["kernel", "cpu_op", "user_annotation", "cuda_runtime",
                                       "gpu_memcpy"])),
          "name": "".join(draw(st.lists(TRICKY, max_size=4))),
          "pid": draw(st.sampled_from([0, 1, 7, "7"])), "ts": draw(NUMBER),
          "dur": draw(NUMBER)}
    if draw(st.booleans()):
        ev["args"] = {"Task Type": draw(st.sampled_from(["AI_CORE", "EVENT_WAIT_SQE", "x"])),
                      "nested": [{"a": "},{"}, {"b": [1, {"c": "]"}]}]}
    if ev["ph"] == "M":
        ev.update(name="process_name", args={"name": draw(st.sampled_from(
            ["Ascend Hardware", "CANN", "Communication", "Overlap Analysis"]))})
    return ev


events_st = st.lists(st.composite(_event)(), min_size=0, max_size=25)


@FUZZ
@given(events_st, st.booleans(), st.sampled_from([1, 3, 8, 33, 200]),
       st.sampled_from(["kineto", "ascend"]), st.sampled_from(["", " ", "\n  "]))
def test_streamed_equals_whole_on_generated_documents(tmp_path_factory, events, wrapped,
                                                      chunk, fmt, indent):
    sep = "," + indent
    body = "[" + indent + sep.join(json.dumps(e) for e in events) + indent + "]"
    text = (f'{{"schemaVersion": 1, "traceEvents": {body}, "traceName": "x]}}",'
            f' "baseTimeNanoseconds": 1000}}' if wrapped else body)
    path = tmp_path_factory.mktemp("g") / "rank0.json"
    path.write_text(text)
    got = outcome(lambda: parse_trace(fmt, path, chunk_bytes=chunk))
    assert got[0] == "ok"
    assert same(got, whole(fmt, path, path.read_bytes()))


def test_streamed_errors_keep_positions_with_tiny_chunks(tmp_path):
    good = json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1,
                                        "dur": 2}] * 50}).encode()
    bad = good[:300] + b"@" + good[301:]
    (tmp_path / "rank0.json").write_bytes(bad)
    for chunk in (1, 4, 64):
        with pytest.raises(TraceError, match="invalid JSON: JSON is malformed") as err:
            parse_trace("kineto", tmp_path / "rank0.json", chunk_bytes=chunk)
        assert err.value.position == 300
    # truncated input, also when compressed: the position is the end of the decompressed JSON
    gz = tmp_path / "rank1.json.gz"
    gz.write_bytes(gzip.compress(good[:-40]))
    for chunk in (1, 4, 64, 1 << 20):
        with pytest.raises(TraceError, match="truncated") as err:
            parse_trace("kineto", gz, chunk_bytes=chunk)
        assert err.value.position == len(good) - 40


@pytest.mark.parametrize("text", [
    b'[{"ph": "X"},,{}]', b'[{"ph": "X"} , ]', b'[ ,{}]', b'[]', b'[ ]', b'[{"ph": "X"},\n {}]',
    b'[{"ph": "X"}]]', b'{"traceEvents": [{"ph": "X"}]]}', b'[{"ph": "X"},\n,\n "tid": 0}]'],
    ids=["comma-comma", "trailing-comma", "leading-comma", "empty", "empty-spaced", "two",
         "extra-bracket", "extra-bracket-in-object", "duplicated-comma-then-key"])
def test_empty_runs_between_separators_are_errors_as_whole(tmp_path, text):
    """Found by the mutation test: a run with no event (``,,``) decodes alone as ``[]``."""
    path = tmp_path / "rank0.json"
    path.write_bytes(text)
    reference = whole("kineto", path, text)
    for chunk in (1, 2, 3, 5, 100):
        assert same(outcome(lambda c=chunk: parse_trace("kineto", path, chunk_bytes=c)),
                    reference), chunk


# -- bombs, limits and odd files --------------------------------------------------------------

# peak RSS of the child: VmHWM of its own address space (getrusage's ru_maxrss would keep the
# peak of the forking parent, pytest, across exec)
BOMB = """
import sys
from residency.traces.load import TraceError, load_traces
try:
    load_traces(sys.argv[1], cache=False, **eval(sys.argv[2]))
    print("loaded")
except TraceError as exc:
    print("error:", exc)
with open("/proc/self/status") as f:
    print(next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) // 1024)
"""


def _bomb(path: Path, head: bytes, fill: bytes, total: int) -> Path:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = fill * (16 << 20 // len(fill))
    with path.open("wb") as f:
        f.write(z.compress(head))
        for _ in range(total // len(block)):
            f.write(z.compress(block))
        f.write(z.flush())
    return path


def _run_bomb(path: Path, **kwargs) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", BOMB, str(path), repr(kwargs)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and not out.stderr, out.stderr
    message, peak_mb = out.stdout.strip().splitlines()
    return message, int(peak_mb)


@pytest.mark.slow
@pytest.mark.parametrize("head,fill,expect", [
    (b"", b" ", "only white space: no JSON value"),  # not a trace: found by content
    (b'{"traceEvents": [', b"\n", "truncated JSON"),
    (b"", b"0", "not JSON (it starts with b'00000000')"),
    (b"", b"\0", "not JSON (it starts with b'\\x00"),
    (b'{"traceEvents": ["', b"0", "an event longer than"),
], ids=["whitespace", "whitespace-in-events", "zeros", "nul-bytes", "one-long-string"])
def test_gzip_bomb_of_1_gb_is_one_error_with_bounded_memory(tmp_path, head, fill, expect):
    bomb = _bomb(tmp_path / "rank0.json.gz", head, fill, 1 << 30)
    assert bomb.stat().st_size < 8 << 20
    message, peak_mb = _run_bomb(bomb)
    assert message.startswith("error:") and expect in message and "rank0.json.gz" in message
    # the whole 1 GiB would need 1024 MB and more; the stream holds a few chunks of 8 MiB
    # (one long string: up to the 16 MiB cap on one event, twice while it is decoded)
    assert peak_mb < 128, peak_mb  # measured here: 45-87 MB


def test_decompressed_size_limit(tmp_path):
    bomb = _bomb(tmp_path / "rank0.json.gz", b'{"traceEvents": [', b" ", 64 << 20)
    with pytest.raises(TraceError, match=r"decompresses to more than 1048576 bytes"):
        load_traces(bomb, cache=False, max_trace_bytes=1 << 20)
    message, peak_mb = _run_bomb(bomb, max_trace_bytes=1 << 20)
    assert "decompresses to more than" in message and peak_mb < 160


def test_file_size_limit(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": []}) + " " * 2000)
    with pytest.raises(TraceError, match=r"rank0\.json: \d+ bytes, more than the limit of "
                                         r"1000 bytes"):
        load_traces(tmp_path, cache=False, max_trace_bytes=1000)


def _kernel_trace(path: Path) -> Path:
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k",
                                                 "ts": 1, "dur": 1}]}))
    return path


def test_fifo_named_like_a_trace_is_refused_without_blocking(tmp_path):
    _kernel_trace(tmp_path / "rank0.json")
    os.mkfifo(tmp_path / "rank1.json")
    with pytest.raises(TraceError, match=r"rank1\.json: a FIFO, not a regular file"):
        load_traces(tmp_path, cache=False)
    with pytest.raises(TraceError, match="a FIFO, not a regular file"):
        load_traces(tmp_path / "rank1.json", cache=False)
    # the command line: one line, exit 2, no hang (a timeout here would be the hang)
    out = subprocess.run([sys.executable, "-m", "residency", "idle", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("residency idle: error: ") and "a FIFO" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_socket_and_device_are_refused(tmp_path):
    _kernel_trace(tmp_path / "rank0.json")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "rank1.json"))
        with pytest.raises(TraceError, match="a socket, not a regular file"):
            load_traces(tmp_path, cache=False)
    finally:
        s.close()
    (tmp_path / "rank1.json").unlink()
    link = tmp_path / "rank1.json.gz"
    link.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="rank1.json.gz: a symbolic link to /dev/zero"):
        load_traces(tmp_path, cache=False)
    with pytest.raises(TraceError, match="a character device, not a regular file"):
        load_traces(link, cache=False)  # named itself: followed, and still refused


def test_links_inside_the_folder_are_followed_links_leaving_it_refused(tmp_path):
    inside, outside = tmp_path / "run", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    _kernel_trace(inside / "real.json")
    (inside / "rank0.json").symlink_to(inside / "real.json")
    (inside / "real.json").rename(inside / "sub.txt")
    (inside / "rank0.json").unlink()
    (inside / "rank0.json").symlink_to("sub.txt")
    assert list(load_traces(inside, cache=False).ranks) == [0]
    (inside / "rank1.json").symlink_to(_kernel_trace(outside / "x.txt"))
    with pytest.raises(TraceError, match=r"rank1\.json: a symbolic link to .*elsewhere"):
        load_traces(inside, cache=False)
    # a torch-npu tree linked in from outside
    shutil.copytree(DATA / "traces" / "ascend_basic", outside / "npu")
    npu = tmp_path / "npu"
    npu.mkdir()
    for d in (outside / "npu").iterdir():
        (npu / d.name).symlink_to(d)
    with pytest.raises(TraceError, match="a symbolic link to"):
        load_traces(npu, cache=False)


# -- the cache: digests ------------------------------------------------------------------------

def _copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(DATA / "traces" / name, tmp_path / name,
                                ignore=shutil.ignore_patterns(CACHE_DIR)))


def _timeline(ts) -> list:
    return [(r, t.device.tolist(), t.ranges.tolist(), t.range_names.tolist(), t.rejected_events)
            for r, t in ts.ranks.items()]


def _entries() -> list[Path]:
    from residency.traces import cache as tracecache

    return sorted(tracecache.cache_dir().glob("*.entry"))


def test_edited_cache_is_never_trusted(tmp_path):
    import struct

    d = _copy(tmp_path, "kineto_basic")
    fresh = _timeline(load_traces(d))
    (entry,) = [p for p in _entries() if b'"kind": "columns"' in p.read_bytes()
                and b"rank0.trace.json" in p.read_bytes()]
    data = bytearray(entry.read_bytes())
    magic = data.index(b"\n") + 1
    (n,) = struct.unpack_from("<Q", data, magic)
    header = json.loads(bytes(data[magic + 8:magic + 8 + n]))
    (offset,) = [a[3] for a in header["arrays"] if a[0] == "device"]
    at = magic + 8 + n + offset + 8  # the first device task's end
    end = struct.unpack_from("<q", data, at)[0]
    struct.pack_into("<q", data, at, end + 3_000_000_000)  # 3 s longer, header kept
    entry.write_bytes(bytes(data))
    assert _timeline(load_traces(d)) == fresh  # ignored, parsed anew...
    assert struct.unpack_from("<q", entry.read_bytes(), at)[0] == end  # ...and rewritten


def test_cache_of_a_trace_changed_in_place_is_not_used(tmp_path):
    d = _copy(tmp_path, "kineto_basic")
    fresh = load_traces(d)
    src = d / "rank0.trace.json"
    st = src.stat()
    text = src.read_text()
    changed = text.replace('"dur": 50', '"dur": 90', 1)
    assert changed != text and len(changed) == len(text)
    src.write_text(changed)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    again = load_traces(d)
    assert again.ranks[0].device.tolist() != fresh.ranks[0].device.tolist()
    assert again.ranks[0].device.tolist() == load_traces(d, cache=False).ranks[0].device.tolist()


def test_cache_that_is_a_fifo_is_ignored(tmp_path):
    d = _copy(tmp_path, "kineto_basic")
    fresh = _timeline(load_traces(d, cache=False))
    load_traces(d)
    for p in _entries():  # every entry of the user's cache a FIFO: never blocks
        p.unlink()
        os.mkfifo(p)
    assert _timeline(load_traces(d)) == fresh


# -- torch-npu: task types and lanes -----------------------------------------------------------

def test_ascend_task_types_and_lanes_are_kept(tmp_path):
    def meta(pid, name):
        return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}

    def x(pid, ts, name, task=None):
        ev = {"ph": "X", "name": name, "pid": pid, "tid": 1, "ts": ts, "dur": 1.5}
        if task:
            ev["args"] = {"Task Type": task, "Stream Id": 3}
        return ev

    events = [x(9, "1764500000000003.000", "hcom_allReduce_", "COMMUNICATION"),
              x(7, "1764500000000001.000", "MatMul", "AI_CORE"),
              x(7, "1764500000000002.000", "wait", "EVENT_WAIT_SQE"),
              x(8, "1764500000000000.500", "aclnnMatmul"),
              x(7, "1764500000000000.000", "copy", "SDMA_SQE"),
              meta(7, "Ascend Hardware"), meta(8, "CANN"), meta(9, "Communication")]
    tree = tmp_path / "h_1_ascend_pt"
    (tree / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (tree / "profiler_info_0.json").write_text("{}")
    (tree / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(events))
    for chunk in (1, 50, 1 << 20):
        t = load_traces(tmp_path, cache=False, chunk_bytes=chunk).ranks[0]
        # device rows sorted by start: copy, MatMul, wait (metadata came last)
        assert [t.task_types[c] for c in t.device_task_type] == ["SDMA_SQE", "AI_CORE",
                                                                "EVENT_WAIT_SQE"]
        assert t.range_names.tolist() == ["aclnnMatmul", "hcom_allReduce_"]
        assert [t.lanes[c] for c in t.range_lane] == ["CANN", "Communication"]
        assert t.range_task_type[0] == -1 and t.task_types[t.range_task_type[1]] == (
            "COMMUNICATION")
    load_traces(tmp_path)
    cached = load_traces(tmp_path).ranks[0]  # the cache keeps them
    assert [cached.task_types[c] for c in cached.device_task_type] == [
        "SDMA_SQE", "AI_CORE", "EVENT_WAIT_SQE"]
    assert [cached.lanes[c] for c in cached.range_lane] == ["CANN", "Communication"]
    assert np.array_equal(cached.range_task_type, t.range_task_type)


def test_kineto_timelines_have_no_task_types():
    t = load_traces(DATA / "traces" / "kineto_basic", cache=False).ranks[0]
    assert t.task_types == () and t.lanes == ()
    assert t.device_task_type.tolist() == [-1] * t.device_tasks


# -- one file in parts, in parallel ------------------------------------------------------------

def parts_outcome(fmt: str, path: Path, k: int, chunk: int) -> tuple | None:
    """The parse of `path` in about `k` parts (in-process), or None when the parts do not
    align (the loader then parses the file whole)."""
    bounds = part_bounds(path, path.stat().st_size, k)
    try:
        got = [parse_part(fmt, path, a, b, first=i == 0, last=i == len(bounds) - 1,
                          chunk_bytes=chunk) for i, (a, b) in enumerate(bounds)]
        return outcome(lambda: join_parts(path, got))
    except (NotAligned, TraceError):
        return None


def test_parts_equal_the_whole_parse_on_every_fixture():
    used = 0
    for fmt, path in trace_files():
        if path.name.endswith(".gz"):
            continue
        reference = outcome(lambda f=fmt, p=path: parse_trace(f, p))
        for k in (2, 3, 7):
            for chunk in chunks_for(path, [1, 5, 1 << 20]):
                got = parts_outcome(fmt, path, k, chunk)
                # real torch.profiler output has no `}, {` in strings: its parts always align
                assert got is not None or "runs" not in path.parts, (path, k, chunk)
                if got is not None:
                    assert got == reference, (path, k, chunk)
                    used += len(part_bounds(path, path.stat().st_size, k)) > 1
    assert used > 20  # parts really ran (most fixtures split at a `}, {`)


@FUZZ
@given(events_st, st.booleans(), st.integers(2, 6), st.sampled_from(["kineto", "ascend"]))
def test_parts_equal_the_whole_parse_on_generated_documents(tmp_path_factory, events, wrapped,
                                                          k, fmt):
    body = "[" + ", ".join(json.dumps(e) for e in events) + "]"
    text = (f'{{"traceEvents": {body}, "baseTimeNanoseconds": 1000}}' if wrapped else body)
    path = tmp_path_factory.mktemp("p") / "rank0.json"
    path.write_text(text)
    got = parts_outcome(fmt, path, k, 3)
    assert got is None or got == outcome(lambda: parse_trace(fmt, path))


@pytest.mark.parametrize("name", ["k{}", "k}}, {{{}"], ids=["plain", "boundary-in-names"])
def test_load_traces_splits_a_large_file_across_workers(tmp_path, monkeypatch, name):
    events = [{"ph": "X", "cat": "kernel" if i % 7 else "cpu_op", "name": name.format(i % 5),
               "ts": i * 3.5, "dur": 2.25} for i in range(20_000)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 7}))
    monkeypatch.setattr(traces, "PART_MIN_BYTES", 100_000)
    joined = []  # parts that were joined (not refused as misaligned)
    real = traces.join_parts
    monkeypatch.setattr(traces, "join_parts", lambda *a: (real(*a), joined.append(1))[0])
    one = load_traces(path, cache=False, workers=1).ranks[0]
    two = load_traces(path, cache=True, workers=2).ranks[0]
    # with `}, {` in every name, a part may begin inside a string: refused, parsed whole
    assert joined == [1] or "}" in name
    assert two.device.tolist() == one.device.tolist() and len(one.device) > 17_000
    assert two.range_names.tolist() == one.range_names.tolist()
    assert two.ranges.tolist() == one.ranges.tolist()
    again = load_traces(path, cache=True, workers=2).ranks[0]  # the cache: no parse at all
    assert again.device.tolist() == one.device.tolist() and len(joined) <= 1
