"""The compiled reader of torch-npu's text export (`residency.traces.kineto_scan.scan_ascend`)
against the msgspec path of `residency.traces.ascend_text`.

A run it reads gives exactly the columns the msgspec path gives (every column `AscendColumns`
keeps, and every field of the `Parsed` it finishes into); a run it does not read goes the
msgspec way. So, on runs in the forms torch-npu writes and on hostile ones (times as text, int,
float, exponent or junk; missing and null fields; pids of every type; names with escapes and
non-ASCII; args null, not an object, nested, with a Task Type that is no string; metadata of
other names; other phases; escaped and repeated keys; invalid bytes), the two outcomes are
equal; and on torch-npu's own shapes the compiled path is the one taken.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import ascend_text, kineto_scan, load, units
from residency.traces.files import TraceError
from tests.helpers import ROOT

FUZZ = settings(derandomize=True, database=None, deadline=None,
                max_examples=int(os.environ.get("RESIDENCY_FUZZ_EXAMPLES", "300")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
needs_reader = pytest.mark.skipif(
    not kineto_scan.available() or kineto_scan.scan_ascend(b"[]") is None,
    reason="the compiled reader (with scan_ascend) is not built here")
FIXTURES = sorted((ROOT / "tests" / "data" / "traces").glob("ascend_*/**/trace_view.json"))


def columns_of(cols: ascend_text.AscendColumns) -> tuple:
    """What the builder kept of its runs, before `finish`."""
    def cat(parts: list[np.ndarray]) -> list:
        return np.concatenate(parts).tolist() if parts else []
    return (dict(cols.pids), cat(cols.pid), cat(cols.ts), cat(cols.dur), cat(cols.ok),
            cat(cols.name), cat(cols.bad), cat(cols.task), dict(cols.names.codes),
            dict(cols.tasks), cols.name_error, cols.metas)


def parsed_of(p) -> tuple:
    """Every field of a `Parsed`, as plain values."""
    def plain(v):
        return v.tolist() if isinstance(v, np.ndarray) else v
    return tuple((k, plain(v)) for k, v in vars(p).items())


def outcome(data: bytes) -> tuple:
    """The columns of one run (`AscendColumns.add`, then `finish`), or the error."""
    cols = ascend_text.AscendColumns()
    try:
        n = cols.add(data)
        kept = columns_of(cols)
        p = cols.finish(Path("trace_view.json"), None)
    except (msgspec.MsgspecError, TraceError) as exc:
        return "error", type(exc).__name__, str(exc)
    return "ok", n, kept, parsed_of(p)


def both(data: bytes) -> tuple[tuple, tuple]:
    got = outcome(data)
    with kineto_scan.msgspec_only():
        return got, outcome(data)


# -- torch-npu's own shapes -------------------------------------------------------------------

def npu_run(rng: random.Random, n: int) -> bytes:
    """A run as torch-npu writes trace_view.json: metadata, host ranges, device tasks with
    a Task Type, flow events, times as %.3f epoch microseconds text."""
    events = ['{"name": "process_name", "pid": 2, "tid": 0, "ph": "M", '
              '"args": {"name": "Ascend Hardware"}}',
              '{"name": "process_name", "pid": 4242, "tid": 0, "ph": "M", '
              '"args": {"name": "Python"}}',
              '{"name": "process_name", "pid": 5, "tid": 0, "ph": "M", '
              '"args": {"name": "Overlap Analysis"}}',
              '{"name": "thread_name", "pid": 2, "tid": 2, "ph": "M", '
              '"args": {"name": "Stream 2"}}']
    t = 1764500000000000.0
    for i in range(n):
        t += rng.randint(0, 20000) / 1000
        ts, dur = f'"{t:.3f}"', f"{rng.randint(0, 30000) / 1000:.3f}"
        kind = rng.randint(0, 4)
        if kind == 0:
            events.append(f'{{"name": "aten::mm_{i % 7}", "pid": 4242, "tid": 1, "ts": {ts}, '
                          f'"dur": {dur}, "ph": "X", "args": {{"Sequence number": {i}, '
                          f'"Input Dims": "8,4096;4096,4096"}}}}')
        elif kind == 1:
            task = rng.choice(["AI_CORE", "AI_VECTOR_CORE", "EVENT_WAIT_SQE", "SDMA_SQE"])
            events.append(f'{{"name": "Op_{i % 11}", "pid": 2, "tid": 2, "ts": {ts}, '
                          f'"dur": {dur}, "ph": "X", "args": {{"Model Id": 4294967295, '
                          f'"Task Type": "{task}", "Task Id": {i}}}}}')
        elif kind == 2:
            events.append(f'{{"ph": "s", "bp": "e", "name": "HostToDevice{i}", "id": "{i}", '
                          f'"pid": 4242, "tid": 1, "ts": {ts}, "cat": "HostToDevice"}}')
        elif kind == 3:
            events.append(f'{{"name": "Computing", "pid": 5, "tid": 0, "ts": {ts}, '
                          f'"dur": {dur}, "ph": "X"}}')
        else:
            events.append(f'{{"name": "hcom_allReduce_{i % 3}", "pid": "3", "tid": 7, '
                          f'"ts": {ts}, "dur": {dur}, "ph": "X", '
                          f'"args": {{"Task Type": null}}}}')
    return ("[" + ",\n".join(events) + "]").encode()


@needs_reader
@pytest.mark.parametrize("seed", range(5))
def test_a_torch_npu_run_is_read_by_the_compiled_reader_with_the_same_columns(seed):
    run = npu_run(random.Random(seed), 400)
    assert kineto_scan.scan_ascend(run) is not None  # the compiled path, not its fallback
    got, reference = both(run)
    assert got[0] == "ok" and got == reference
    assert len(got[2][1]) > 200  # kept rows: the comparison is not of empty columns


def parse(path: Path) -> tuple:
    p = load.parse_source("ascend", path, root=None, chunk_bytes=1 << 10, max_bytes=1 << 40,
                          digest=True)
    return parsed_of(p)


@needs_reader
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.parent.name)
def test_the_fixtures_are_read_by_the_compiled_reader(path, monkeypatch):
    with kineto_scan.msgspec_only():
        reference = parse(path)
    # with the msgspec path unusable, the same columns come from the compiled reader alone
    monkeypatch.setattr(ascend_text, "add_run", None)
    assert parse(path) == reference


@needs_reader
@pytest.mark.parametrize("text", [
    "0", "-0", "7", "1.5", "0.0004", "0.0005", "-0.0005", "0.00049999", "1.2345", "-1.2345",
    "00012.5", "1764500000000000.123", "1764500000000000.1235", "1764499999999999.9995",
    "8999999999999999.9995", "123456789.123456789"])
def test_times_as_text_are_the_nanoseconds_us_to_ns_gives(text):
    run = (f'[{{"ph": "X", "name": "k", "pid": 1, "ts": "{text}", "dur": 0}}]').encode()
    got = kineto_scan.scan_ascend(run)
    assert got is not None
    assert got.ts.tolist() == units.us_to_ns([text])[0].tolist()
    assert both(run)[0] == both(run)[1]


@needs_reader
@pytest.mark.parametrize("ts", ['"1."', '".5"', '"1e3"', '" 1"', '"+1"', '"1_0"', '"abc"',
                                '"\\u0031"', '"9000000000000001"', "1e3", "1.5E2"])
def test_times_it_does_not_read_go_the_msgspec_way(ts):
    run = f'[{{"ph": "X", "name": "k", "pid": 1, "ts": {ts}, "dur": 1}}]'.encode()
    assert kineto_scan.scan_ascend(run) is None
    got, reference = both(run)
    assert got == reference


@needs_reader
@pytest.mark.parametrize("fields", [
    '"ts": 1.5, "dur": 1', '"ts": true, "dur": 1', '"ts": [1], "dur": 1', '"ts": "7", "dur": "30"',
    '"ts": "7", "dur": "-0.0005"', '"ts": "7", "dur": null', '"ts": "7", "dur": {}',
    '"ts": "7", "dur": 1, "args": null', '"ts": "7", "dur": 1, "args": [1]',
    '"ts": "7", "dur": 1, "args": {"Task Type": 5}', '"ts": "7", "dur": 1, "pid": true'])
def test_forms_only_the_any_type_path_reads_are_read_as_it_reads_them(fields):
    """msgspec's typed decode rejects these; its any-type reading (the run's columns) is what
    the compiled reader gives."""
    run = (f'[{{"ph": "X", "name": "k", "pid": 1, {fields}}}, '
           '{"ph": "X", "name": "j", "pid": 2, "ts": "5.5", "dur": 2.25, '
           '"args": {"Task Type": "AI_CORE"}}, {"ph": "Q"}]').encode()
    if '"pid": true' in fields:
        run = run.replace(b'"pid": 1, ', b"")
    assert kineto_scan.scan_ascend(run) is not None
    got, reference = both(run)
    assert got[0] == "ok" and got == reference


@needs_reader
@pytest.mark.parametrize("name", ["1.50", "[1.50]", "1e400", "[1e400]", "5", "null"])
@pytest.mark.parametrize("dur", ["0.0025", "1"])
def test_a_name_that_is_no_string_goes_the_msgspec_way(name, dur):
    """msgspec's paths read such a name each their own way (a float inside: its repr on the
    typed path, its text on the any-type one, which a duration float64 may round wrong sends
    the run to; 1e400: an error only where the name is used)."""
    run = f'[{{"ph": "X", "name": {name}, "pid": 1, "ts": "5", "dur": {dur}}}]'.encode()
    assert (kineto_scan.scan_ascend(run) is None) is (name != "null")
    assert both(run)[0] == both(run)[1]


# -- hostile runs -----------------------------------------------------------------------------

PHASES = ['"X"'] * 10 + ['"M"'] * 3 + ['"B"', '"s"', '"f"', '"i"', '"C"', '"Z"', '"x"',
                                        '"\\u0058"', '""', "null", "1"]
VALUES = {
    '"pid"': ["2", "4242", '"3"', "0", "-1", "-0", '"x\\u0041"', '"\u540d"', "100000000000000000",
              "10000000000000000000", "2.0", "1e2", "null", "true", '["2"]'],
    '"ts"': ['"1764500000000000.123"', '"1764500000000000.1235"', '"-12.5"', '"0001.5"',
             '"1."', '".5"', '"1e3"', '"abc"', '" 12"', '"1_0"', '"\\u0031.5"', '"NaN"',
             '"99999999999999999999"', '"9223372036854775.807"', "1764500000000000",
             "12", "9223372036854775", "-9223372036854775", "9223372036854776",
             "12.5", "1e3", "null", "[1]", "false"],
    '"dur"': ["18.843", "7.2935", "0.0005", "0.0025", "5", "0", "-0.0", "-1.5", "1e2", "null",
              '"3"', "0.00025", "562949953421.3125", "4611686018427387.904",
              "9000000000000001", "4611686018427.388", "1.5E-3"],
    '"name"': ['"aten::mm"', '"Op_1"', '"a\\"b"', '"\\u00e9t\\u00e9"', '"\u00fcn\u00ef\u4e2d"',
               '"process_name"', '"process\\u005fname"', '"thread_name"', "1.50", "5",
               '[1.50, "x"]', "null", '{"a": 1}', "true", '""', "1e400"],
    '"args"': ['{"Task Type": "AI_CORE"}', '{"Task Type": "SDMA_SQE", "Task Id": 3}',
               '{"Task Type": null}', '{"Task Type": 5}', '{"Task\\u0020Type": "X"}',
               '{"Task Type": "A", "Task Type": "B"}', "null", "[1]", '"s"', "{}",
               '{"name": "Ascend Hardware"}', '{"name": "Overlap Analysis"}',
               '{"name": "Python"}', '{"name": 5}', '{"name": ["x"]}',
               '{"x": {"y": [1, {"z": 2.5}]}, "Task Type": "AI_VECTOR_CORE"}',
               '{"Task Type": "\\u00e9"}', "[" * 70 + "]" * 70],
}
SANE_KEYS = ['"ph"', '"name"', '"pid"', '"ts"', '"dur"', '"args"', '"tid"']
ODD_KEYS = SANE_KEYS + ['"p\\u0069d"', '"cat"', '"id"', '""', '"PID"']
OTHER = ["0", '"7"', "null", '{"ts": 5, "nested": [{"ph": "X"}]}', "[[[]]]", "1.5E-7"]
WS = st.sampled_from(["", " ", "\n"])


@st.composite
def event_text(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 29)) == 0:  # now and then, an element that is no event object
        return draw(st.sampled_from([b"1", b'"x"', b"[]", b"null", b"{}", b'{"ph": "X"']))
    if draw(st.integers(0, 5)):  # mostly the usual keys, each once, in any order
        keys = ['"ph"'] + draw(st.permutations(SANE_KEYS[1:]))[:draw(st.integers(2, 6))]
        keys = draw(st.permutations(keys))
    else:  # else any keys, repeated or escaped
        keys = draw(st.lists(st.sampled_from(ODD_KEYS), max_size=9))
    pairs = []
    for k in keys:
        pool = PHASES if k == '"ph"' else VALUES.get(k, OTHER)
        if k in VALUES and draw(st.integers(0, 2)):  # mostly the first (torch-npu's) values
            pool = pool[:4]
        pairs.append(f"{k}:{draw(WS)}{draw(st.sampled_from(pool))}".encode())
    text = b"{" + b", ".join(pairs) + b"}"
    if draw(st.integers(0, 39)) == 0:  # an invalid UTF-8 byte inside
        text = text.replace(b'"', b'"\xff', 1) if b'"' in text else text
    return text


runs_st = st.builds(lambda evs: b"[" + b",\n".join(evs) + b"]",
                    st.lists(event_text(), max_size=14))


@needs_reader
@FUZZ
@given(runs_st)
def test_hostile_runs_give_the_msgspec_outcome(run):
    got, reference = both(run)
    assert got == reference


@needs_reader
def test_the_hostile_runs_are_read_by_both_paths_often():
    """The property above compares the compiled reader's columns, not only its declining: a
    good share of its runs is read by it, with kept rows."""
    taken = kept = 0
    for seed in range(300):
        rng = random.Random(seed)
        events = []
        for _ in range(rng.randint(1, 10)):
            ph = rng.choice(['"X"'] * 4 + ['"M"', '"B"'])
            pairs = [f'"ph": {ph}']
            for k in ('"pid"', '"ts"', '"dur"', '"name"', '"args"'):
                if rng.random() < 0.9:
                    pairs.append(f"{k}: {rng.choice(VALUES[k][:4])}")
            rng.shuffle(pairs)
            events.append("{" + ", ".join(pairs) + "}")
        run = ("[" + ",".join(events) + "]").encode()
        got = kineto_scan.scan_ascend(run)
        taken += got is not None
        kept += got is not None and len(got.ts) > 0
        assert both(run)[0] == both(run)[1]
    assert taken > 150 and kept > 100
