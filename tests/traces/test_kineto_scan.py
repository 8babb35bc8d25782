"""The compiled reader of Kineto runs (`residency.traces.kineto_scan`) against the msgspec path.

A run it reads gives exactly the columns the msgspec path gives; a run it does not read goes
the msgspec way, with msgspec's columns or errors. So, on hostile runs (escaped and repeated
keys, every value type where a time, category or name goes, invalid bytes, truncation):
the two outcomes are equal, and the reader never accepts text msgspec rejects. Whole traces
(the fixtures, the fuzz corpus, the committed run's profiles) parse the same with it and
without it (the streamed-versus-whole tests of test_trace_stream compare the two as well).
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import formats, kineto, kineto_scan, units
from residency.traces.files import TraceError
from tests.helpers import ROOT

FUZZ = settings(derandomize=True, database=None, deadline=None,
                max_examples=int(os.environ.get("RESIDENCY_FUZZ_EXAMPLES", "300")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
needs_reader = pytest.mark.skipif(not kineto_scan.available(),
                                  reason="the compiled reader is not built here")


msgspec_only = kineto_scan.msgspec_only


def outcome(data: bytes, names: bool) -> tuple:
    """The columns of one run (`KinetoColumns.add`, `finish`), or the error's type and text."""
    cols = kineto.KinetoColumns(names)
    try:
        n = cols.add(data)
        p = cols.finish(Path("run.json"), None)
    except (msgspec.MsgspecError, TraceError) as exc:
        return "error", type(exc).__name__, str(exc)
    return ("ok", n, p.device.tolist(), p.ranges.tolist(), p.names.tolist(), p.rejected,
            None if p.device_names is None else p.device_names.tolist())


def both(data: bytes, names: bool) -> tuple[tuple, tuple]:
    got = outcome(data, names)
    with msgspec_only():
        return got, outcome(data, names)


def msgspec_accepts(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def scanned(data: bytes) -> kineto_scan.Scanned | None:
    return kineto_scan.scan(data, kineto.KinetoColumns().kind_of, 2)


# -- realistic runs ---------------------------------------------------------------------------

PLAIN_RUN = ("[" + ",\n".join([
    '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, '
    '"ts": 0.0, "dur": 2000.125, "args": {"External id": 0}}',
    '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": -10.0, '
    '"dur": 18.843, "args": {"Input Dims": [[4096, 1], [1, 4096]], "Input type": ["float"]}}',
    '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
    '"ts": -7.893, "dur": 4.125, "args": {"correlation": 2}}',
    '{"ph": "s", "id": 2, "pid": 1, "tid": 1, "ts": -7.893, "cat": "ac2g", "name": "ac2g"}',
    '{"ph": "X", "cat": "kernel", "name": "void gemm<128>(float*, int)", "pid": 0, "tid": 7, '
    '"ts": 0.0005, "dur": 7.2935, "args": {"grid": [1, 2, 3], "stream": 7}}',
    '{"ph": "f", "id": 2, "pid": 0, "tid": 7, "ts": 0.0, "cat": "ac2g", "name": "ac2g", '
    '"bp": "e"}',
    '{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, '
    '"tid": 7, "ts": 167.948, "dur": 4, "args": {"bytes": 1048576}}',
    '{"ph": "X", "cat": "python_function", "name": "module.py(1762): _call_impl \\u00e9", '
    '"pid": 1, "tid": 1, "ts": 18.327, "dur": 40.756}',
    '{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python3"}}',
]) + "]").encode()


@needs_reader
@pytest.mark.parametrize("names", [False, True])
def test_a_realistic_run_is_read_by_the_compiled_reader_with_the_same_columns(names):
    assert scanned(PLAIN_RUN) is not None  # the fast path is taken, not only its fallback
    got, reference = both(PLAIN_RUN, names)
    assert got[0] == "ok" and got == reference
    # nearest ns, ties away from zero: 0.0005 us is 1 ns, 7.2935 us 7294 ns
    assert got[2] == [[1, 7295], [167948, 171948]]


@needs_reader
@pytest.mark.parametrize("text,ns", [
    ("0", 0), ("-0", 0), ("7", 7000), ("-7", -7000), ("1.5", 1500), ("0.0004", 0),
    ("0.0005", 1), ("-0.0005", -1), ("0.00049999", 0), ("1.23449999", 1234),
    ("1.2345", 1235), ("-1.2345", -1235), ("123456789.123456789", 123456789123),
    ("8999999999999999.9995", 9 * 10**18), ("1700000000000000.125", 1700000000000000125),
])
def test_times_are_the_exact_nanoseconds_of_their_decimal_text(text, ns):
    run = f'[{{"ph": "X", "cat": "kernel", "name": "k", "ts": {text}, "dur": 0}}]'.encode()
    got = scanned(run)
    assert got is not None and got.ts.tolist() == [ns]
    assert units.decimal_us_to_ns(text) == ns  # what the msgspec path's exact reading gives


@needs_reader
@pytest.mark.parametrize("value", ["1e3", "1E-3", "0.5e1", '"12.5"', "9000000000000001",
                                   "12345678901234567890"])
def test_times_it_does_not_read_go_the_msgspec_way(value):
    run = f'[{{"ph": "X", "cat": "kernel", "name": "k", "ts": {value}, "dur": 1}}]'.encode()
    assert scanned(run) is None
    got, reference = both(run, True)
    assert got == reference


@needs_reader
@pytest.mark.parametrize("names", [False, True])
def test_many_distinct_names_and_repeats_keep_their_order(names):
    events = [f'{{"ph": "X", "cat": "{("kernel", "cpu_op")[i % 2]}", "name": "n{i % 3000}", '
              f'"ts": {i}, "dur": 1}}' for i in range(9000)]  # the name table grows 3 times
    events += ['{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1}',  # no name: ""
               '{"ph": "X", "cat": "cpu_op", "name": null, "ts": 1, "dur": 1}',  # ""
               '{"ph": "X", "cat": "cpu_op", "name": "\\u006e0", "ts": 1, "dur": 1}']  # "n0"
    run = ("[" + ",".join(events) + "]").encode()
    got = scanned(run)
    assert got is not None and len(msgspec.json.decode(got.names)) == 3000 + 3
    assert both(run, names)[0] == both(run, names)[1]


@needs_reader
@pytest.mark.parametrize("names", [False, True])
@pytest.mark.parametrize("name", ["1.50", "1e400", "-0.0", "true", "[1]", "{}"])
def test_a_kept_name_that_is_no_string_reads_as_msgspec_reads_it(names, name):
    """A name that is a number, a boolean or a container reads as msgspec reads it (on its
    any-type path a number's text as written, "1.50", not "1.5"; 1e400 out of range): such a
    run is msgspec's (the compiled reader declines it)."""
    for dur in ("2", "0.0025"):  # (msgspec's typed path, and its any-type path)
        run = ('[{"ph": "X", "cat": "cpu_op", "ts": 5, "dur": ' + dur + ', "name": ' + name
               + "}]").encode()
        compiled, pure = both(run, names)
        assert compiled == pure
    assert pure[0] == "ok" or name == "1e400"


# -- hostile runs -----------------------------------------------------------------------------

KEYS = ['"ph"', '"cat"', '"name"', '"ts"', '"dur"', '"pid"', '"args"', '"p\\u0068"',
        '"c\\u0061t"', '"id"', '""', '"ph "', '"TS"']
VALUES = {
    '"ph"': ['"X"', '"X"', '"X"', '"B"', '"M"', '"s"', '"x"', '"\\u0058"', '"XX"', '1', 'null',
             '""', '"i"'],
    '"cat"': ['"kernel"', '"Kernel"', '"KERNEL"', '"cpu_op"', '"cuda_runtime"', '"gpu_memcpy"',
              '"Memset"', '"user_annotation"', '"python_function"', '"ker\\u006eel"', '1',
              'null', '["kernel"]', '"caf\u00e9"', '"\\ud83d\\ude00"', '""', '"kernel "'],
    '"name"': ['"k"', '"a\\"b"', '"\\u00e9t\\u00e9"', '"\u00e9\u4e2d\U0001f600"', '1', '1.5',
               '1.50', '1e400', '12345678901234567890',
               '-0', 'null', 'true', '{"a": [1, "}"]}', '[1, 2]', '""', '"],{\\"ph\\": 1"',
               '"\\\\"', '"\\/\\b\\f\\n\\r\\t"'],
    '"ts"': ['0', '1', '-7', '0.0005', '-0.0005', '1.2345', '1.23449999', '-7.893', '1e3',
             '1E-3', '"12.5"', '"x"', 'null', 'true', '9000000000000000', '9000000000000001',
             '12345678901234567890', '123456.123456789', '[1]', '{"v": 1}'],
}
VALUES['"dur"'] = VALUES['"ts"']
OTHER = ['0', '"7"', 'null', 'false', '{"ts": 5, "cat": "kernel", "nested": [{"ph": "X"}]}',
         '[[[]]]', '"\\u0000"', '-0.0e+0', '1.5E-7']
# values the reader reads (no escaped ph or surrogate, no time as text or with an exponent)
def _sane(key: str, v: str) -> bool:
    if v.startswith('"\\u0058') or "\\ud" in v:
        return False
    if key == '"name"':  # (a kept name that is no string: msgspec's run)
        return v.startswith('"') or v == "null"
    return key not in ('"ts"', '"dur"') or not (v.startswith('"') or "e" in v.lower()
                                                or len(v) > 16)


SANE = {k: [v for v in vs if _sane(k, v)] for k, vs in VALUES.items()}
SANE['"ph"'] = ['"X"'] * 8 + SANE['"ph"']
WS = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


@st.composite
def event_text(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 19)) == 0:  # now and then, an element that is no event object
        return draw(st.sampled_from(["1", '"x"', "[]", "null", "{}", "[{}]", "true"]))
    if draw(st.integers(0, 7)):  # mostly an event of the usual keys, in any order
        keys = draw(st.permutations(['"ph"', '"cat"', '"name"', '"ts"', '"dur"', '"pid"',
                                     '"args"']))[:draw(st.integers(3, 7))]
        values = SANE
    else:  # else any keys, repeated or escaped, with any of the values
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=9))
        values = VALUES
    pairs = []
    for k in keys:
        v = draw(st.sampled_from(values.get(k, OTHER)))
        pairs.append(f"{k}{draw(WS)}:{draw(WS)}{v}")
    return "{" + draw(WS) + ("," + draw(WS)).join(pairs) + draw(WS) + "}"


runs_st = st.builds(lambda ws, evs, sep: ("[" + ws + sep.join(evs) + ws + "]").encode(),
                    WS, st.lists(event_text(), max_size=12), st.sampled_from([",", ", ", ",\n"]))


@needs_reader
@FUZZ
@given(runs_st, st.booleans())
def test_hostile_runs_give_the_msgspec_outcome(run, names):
    got, reference = both(run, names)
    assert got == reference
    if scanned(run) is not None:
        assert msgspec_accepts(run)


SANE_KEYS = ['"ph"', '"cat"', '"name"', '"ts"', '"dur"', '"pid"', '"args"']


@st.composite
def sane_event(draw: st.DrawFn) -> str:
    keys = draw(st.permutations(SANE_KEYS))[:draw(st.integers(0, 7))]
    pairs = [f"{k}{draw(WS)}:{draw(WS)}"
             f"{draw(st.sampled_from([v for v in SANE.get(k, OTHER) if v != '9000000000000001']))}"
             for k in keys]
    return "{" + ("," + draw(WS)).join(pairs) + "}"


@needs_reader
@FUZZ
@given(st.lists(sane_event(), max_size=12), st.booleans())
def test_runs_of_the_forms_it_reads_are_read_by_it_with_the_msgspec_columns(events, names):
    run = ("[" + ",\n".join(events) + "]").encode()
    assert scanned(run) is not None
    got, reference = both(run, names)
    assert got == reference


def _mutate(run: bytes, data: st.DataObject) -> bytes:
    b = bytearray(run)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, max(len(b) - 1, 0)))
        what = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        byte = data.draw(st.sampled_from([0x00, 0x0A, 0x1F, 0x22, 0x2C, 0x5C, 0x5D, 0x7D, 0x80,
                                          0xC0, 0xED, 0xF5, 0xFF, 0x31, 0x2E, 0x65]))
        if what == "flip" and b:
            b[i] = byte
        elif what == "insert":
            b.insert(i, byte)
        elif what == "delete" and b:
            del b[i]
        else:
            del b[i:]
    return bytes(b)


@needs_reader
@FUZZ
@given(st.data())
def test_mutated_runs_are_never_read_where_msgspec_rejects_them(data):
    run = _mutate(data.draw(st.sampled_from([PLAIN_RUN, PLAIN_RUN[:400] + b"]"]))
                  if data.draw(st.booleans()) else data.draw(runs_st), data)
    got = scanned(run)
    if got is not None:
        assert msgspec_accepts(run)
    assert both(run, True)[0] == both(run, True)[1]


@needs_reader
@pytest.mark.parametrize("run", [
    b'[{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "ts": 2}]',  # a repeated key
    b'[{"p\\u0068": "X", "cat": "kernel", "ts": 1, "dur": 1}]',  # an escaped key
    b'[{"ph": "\\u0058", "cat": "kernel", "ts": 1, "dur": 1}]',  # an escaped ph
    b'[' + b'{"a": ' * 70 + b'1' + b'}' * 70 + b']',  # deeper than the reader goes
    b'[1, {"ph": "X"}]',  # an element that is no object
    b'[{"ph": "X", "cat": "kernel", "name": "\\ud800", "ts": 1, "dur": 1}]',  # a surrogate
    b'{"ph": "X"}',  # no array
    b'[{"ph": "X"}] ',  # (white space after the array is fine: handled)
])
def test_runs_outside_its_forms_are_left_to_msgspec_with_the_same_outcome(run):
    handled = scanned(run) is not None
    assert handled == run.endswith(b" ")
    got, reference = both(run, True)
    assert got == reference


@needs_reader
@pytest.mark.parametrize("run", [
    b'[{"ph": "X"}', b'[{"ph": "X"},]', b'[{"ph": "X"} {"ph": "X"}]', b'[{"ph": "X"}]]',
    b'[{"ph": "X", "name": "\xff"}]', b'[{"ph": "X", "name": "\xed\xa0\x80"}]',
    b'[{"ph": "X", "name": "\xc0\xaf"}]', b'[{"ph": "X", "name": "a\x01"}]',
    b'[{"ph": "X", "ts": 01}]', b'[{"ph": "X", "ts": 1.}]', b'[{"ph": "X", "ts": .5}]',
    b'[{"ph": "X", "ts": +1}]', b'[{"ph": "X", "ts": -}]', b'[{"ph": "X", "ts": 1e}]',
    b'[{"ph": "X", "a": tru}]', b'[{"ph": "X", "a": nul}]', b'[{"ph": "X", "a": "\\x"}]',
    b'[{"ph": "X", "a": "\\u12G4"}]', b'[{ph: "X"}]', b'[{"ph" "X"}]', b'[{"ph": "X",}]',
    b'', b'[', b'[]x',
])
def test_invalid_json_is_never_read(run):
    assert not msgspec_accepts(run)
    assert scanned(run) is None


# -- whole traces, and where it is built ------------------------------------------------------

def _kineto_traces() -> list[Path]:
    out = []
    for base in (ROOT / "tests" / "data" / "traces", ROOT / "tests" / "data" / "fuzz",
                 ROOT / "data" / "runs"):
        out += [p for p in sorted(base.rglob("*.json")) if p.name != "trace_view.json"
                and "cache" not in str(p) and p.name != "expected.json"
                and not p.name.startswith("profiler_info")
                and (base.name != "runs" or p.parent.name == "trace")]
    return out


def _whole(path: Path, names: bool) -> tuple:
    try:
        p = formats.parse_trace("kineto", path, device_names=names)
    except TraceError as exc:
        return "error", exc.message, exc.position
    return ("ok", p.rank, p.device.tolist(), p.ranges.tolist(), p.names.tolist(), p.rejected,
            None if p.device_names is None else p.device_names.tolist())


@needs_reader
def test_every_kineto_fixture_and_profile_parses_the_same_with_and_without_it():
    paths = _kineto_traces()
    assert len(paths) >= 10
    read = 0
    for path in paths:
        for names in (False, True):
            got = _whole(path, names)
            with msgspec_only():
                assert got == _whole(path, names), path
        read += got[0] == "ok"
    assert read >= 5


def test_the_compiled_reader_is_built_where_a_compiler_is():
    if os.environ.get(kineto_scan.DISABLE_ENV, "") not in ("", "0"):
        pytest.skip(f"{kineto_scan.DISABLE_ENV} is set: the compiled reader is off")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here: the package installs without the reader")
    assert kineto_scan.available(), (
        "a C compiler is here but residency.traces._kineto_scan is not built: reinstall "
        "(pip install -e .) so that Kineto traces are read at full speed")


def test_it_can_be_turned_off_from_the_environment(subprocess_python):
    env = {**os.environ, kineto_scan.DISABLE_ENV: "1"}
    got = subprocess_python("""
        import json
        from residency.traces import kineto_scan
        print(json.dumps({"available": kineto_scan.available(),
                          "scan": kineto_scan.scan(b"[]", lambda raw: 0, 0)}))
    """, env=env)
    assert got == {"available": False, "scan": None}

