"""The torch-npu database reader's columns are built without a second copy of a rank's rows
(`ascend_db.taken_pair`, `first_codes` block by block, `load.timeline_of` keeping the
parse's own arrays where no lane is derived): the same values as before, to the row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from residency.traces import ascend_db
from residency.traces.load import parse_source, timeline_of

DATA = Path(__file__).parent.parent / "data" / "traces"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 5),
       st.sampled_from([np.int8, np.int32, np.int64]))
def test_first_codes_number_by_first_appearance_in_any_block_size(codes, block, dtype):
    seen: dict[int, int] = {}
    want = [seen.setdefault(c, len(seen)) for c in codes]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ascend_db, "BLOCK_ROWS", block)
        new, old = ascend_db.first_codes(np.array(codes, dtype))
    assert new.dtype == np.int16 and new.tolist() == want and old.tolist() == list(seen)


def test_taken_pairs_are_written_in_place_without_a_copy_of_a_column(monkeypatch):
    import tracemalloc

    rng = np.random.default_rng(5)
    start = rng.integers(0, 1000, 200_000)
    end = start + rng.integers(0, 9, len(start))
    order = np.argsort(start, kind="stable")
    want = np.column_stack([start[order], end[order]])
    monkeypatch.setattr(ascend_db, "BLOCK_ROWS", 1000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        got = ascend_db.taken_pair(start, end, order)
        extra = tracemalloc.get_traced_memory()[1] - before - got.nbytes
    finally:
        tracemalloc.stop()
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert extra < start.nbytes // 4  # (np.take into a strided column buffered a whole one)


def test_a_timeline_without_derived_lanes_keeps_the_parse_arrays():
    db = next((DATA / "ascend_real_db").rglob("ascend_pytorch_profiler_*.db"))
    p = parse_source("ascend", db, root=db.parent)
    t = timeline_of(p, 0, db, None)
    assert len(t.ranges) and not len(t.overlap)
    assert t.ranges is p.ranges and t.range_names is p.names and t.range_lane is p.range_lane
