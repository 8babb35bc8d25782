"""Interval algebra against a naive point-set model (hypothesis), plus edge cases."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from residency.traces import intervals as iv
from residency.traces.kineto_scan import DISABLE_ENV

# small coordinates so a set of covered integer points is an exact model of [start, end)
interval = st.tuples(st.integers(-20, 60), st.integers(0, 25)).map(lambda p: (p[0], p[0] + p[1]))
interval_sets = st.lists(interval, max_size=12)


def points(rows) -> set[int]:
    """The integer instants covered by half-open rows: the naive model."""
    return {t for s, e in rows for t in range(s, e)}


def normalised(a: np.ndarray) -> bool:
    """Sorted, disjoint, non-adjacent, non-empty rows."""
    return bool(np.all(a[:, 1] > a[:, 0]) and np.all(a[1:, 0] > a[:-1, 1]))


def arr(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


@settings(max_examples=300, deadline=None)
@given(interval_sets)
def test_merge_matches_naive_and_leaves_input_alone(rows):
    a = arr(rows)
    before = a.copy()
    m = iv.merge(a)
    assert np.array_equal(a, before)  # HTA's merge sorts its argument in place; ours must not
    assert normalised(m)
    assert points(m.tolist()) == points(rows)
    assert iv.measure(a) == len(points(rows))


@settings(max_examples=300, deadline=None)
@given(interval_sets, interval_sets, interval_sets)
def test_union_and_intersection_match_naive(a, b, c):
    u = iv.union(arr(a), arr(b), arr(c))
    i = iv.intersection(arr(a), arr(b), arr(c))
    assert normalised(u) and normalised(i)
    assert points(u.tolist()) == points(a) | points(b) | points(c)
    assert points(i.tolist()) == points(a) & points(b) & points(c)


@settings(max_examples=300, deadline=None)
@given(interval_sets, interval_sets)
def test_complement_matches_naive(rows, window_rows):
    c = iv.complement(arr(rows), arr(window_rows))
    assert normalised(c)
    assert points(c.tolist()) == points(window_rows) - points(rows)


@given(interval_sets, interval)
def test_complement_of_single_window_pair(rows, w):
    c = iv.complement(arr(rows), w)
    assert points(c.tolist()) == set(range(*w)) - points(rows)


def test_touching_intervals_join_and_empty_ones_vanish():
    assert iv.merge([[0, 5], [5, 9], [12, 12], [11, 13]]).tolist() == [[0, 9], [11, 13]]


def test_half_open_ends_do_not_intersect():
    assert iv.intersection([[0, 5]], [[5, 9]]).shape == (0, 2)
    assert iv.measure(iv.intersection([[0, 6]], [[5, 9]])) == 1


def test_empty_inputs():
    empty = np.empty((0, 2), np.int64)
    assert iv.merge(empty).shape == (0, 2)
    assert iv.union().shape == (0, 2)
    assert iv.intersection().shape == (0, 2)
    assert iv.measure([]) == 0
    assert iv.complement(empty, (3, 8)).tolist() == [[3, 8]]
    assert iv.complement([[0, 10]], (3, 8)).shape == (0, 2)


def test_int64_nanosecond_epoch_values_stay_exact():
    t = 1_764_500_000_123_456_789
    a = np.array([[t, t + 1], [t + 1, t + 3]], dtype=np.int64)
    assert iv.merge(a).tolist() == [[t, t + 3]]
    assert iv.measure(iv.complement(a, (t - 5, t + 5))) == 7


@pytest.mark.parametrize("bad, match", [
    ([[5, 4]], "ends before it starts"),
    ([1, 2, 3], "shape"),
    ([[0.5, 1.0]], "integer"),
])
def test_bad_intervals_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        iv.merge(bad)


# -- sorted inputs: linear paths, never sorted again (issue 44) -------------------------------

sorted_sets = interval_sets.map(sorted)  # sorted by start, overlapping and empty rows kept
normalised_sets = interval_sets.map(lambda rows: iv.merge(arr(rows)).tolist())


ORIGINAL_SORT = np.sort


class MergeOnlySorts:
    """np.sort in place of NumPy's: only a stable sort (the merge of sorted runs) is allowed,
    and only of an array made of at most `runs` ascending runs; anything else is a sort of
    sorted input from scratch."""

    def __init__(self, runs: int) -> None:
        self.runs = runs

    def __call__(self, a, *args, kind=None, **kwargs):
        a = np.asarray(a)
        if kind != "stable":
            raise AssertionError("sorted input sorted again")
        runs = 1 + int(np.count_nonzero(a[1:] < a[:-1]))
        assert runs <= self.runs, f"a stable sort of {runs} runs, not a merge of sorted sets"
        return ORIGINAL_SORT(a, *args, kind=kind, **kwargs)


@pytest.fixture
def no_sort(monkeypatch):
    monkeypatch.setattr(np, "sort", MergeOnlySorts(1))


@settings(max_examples=300, deadline=None)
@given(sorted_sets, st.lists(normalised_sets, min_size=1, max_size=5), st.integers(1, 5))
def test_sorted_inputs_match_naive_without_a_sort(rows, sets, block_rows):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np, "sort", MergeOnlySorts(1 + len(sets)))
        mp.setattr(iv, "BLOCK_ROWS", block_rows)  # work done in blocks: any size, same sets
        m = iv.merge(arr(rows))
        owned = arr(rows)
        in_place = iv.merge_in_place(owned)
        u = iv.union(arr(rows), *(arr(s) for s in sets))
        i = iv.intersection(arr(rows), *(arr(s) for s in sets))
        c = iv.complement(arr(rows), arr(sets[0]))
        size = iv.measure(arr(rows))
    everyone = [points(s) for s in sets]
    assert normalised(m) and normalised(u) and normalised(i) and normalised(c)
    assert points(m.tolist()) == points(rows) and size == len(points(rows))
    assert np.array_equal(in_place, m)
    assert points(u.tolist()) == points(rows).union(*everyone)
    assert points(i.tolist()) == points(rows).intersection(*everyone)
    assert points(c.tolist()) == everyone[0] - points(rows)


@settings(max_examples=200, deadline=None)
@given(st.lists(normalised_sets, min_size=2, max_size=9))
def test_union_of_many_normalised_sets_is_their_merge(sets):
    u = iv.union(*(arr(s) for s in sets))
    assert np.array_equal(u, iv.merge(arr([r for s in sets for r in s])))


def test_a_normalised_set_comes_back_read_only_and_unsorted_input_is_still_sorted(no_sort):
    a = arr([[0, 3], [5, 9], [12, 20]])
    m = iv.merge(a)
    assert m.tolist() == a.tolist() and not m.flags.writeable and a.flags.writeable
    with pytest.raises(AssertionError, match="sorted input sorted again"):
        iv.merge(arr([[5, 9], [0, 3]]))  # unsorted: the one case that sorts


@settings(max_examples=300, deadline=None)
@given(st.lists(interval_sets, max_size=4), st.one_of(st.none(), interval_sets),
       st.integers(1, 4))
# one set inside one window interval (measured without a sweep), at and past its bounds
@example([[[0, 3], [5, 9]]], [[0, 9]], 1)
@example([[[0, 3], [5, 9]]], [[1, 9]], 1)
@example([[[0, 3], [5, 9]]], [[0, 8]], 2)
@example([[[0, 3], [2, 9]]], [[-5, 20]], 1)
def test_measure_union_matches_naive_in_any_block_size(sets, within, block_rows):
    got = iv.measure_union(*(arr(s) for s in sets),
                           within=None if within is None else arr(within),
                           block_rows=block_rows)
    covered = set().union(*(points(s) for s in sets))
    assert got == len(covered if within is None else covered & points(within))


@settings(max_examples=300, deadline=None)
@given(st.lists(interval_sets, max_size=5), st.one_of(st.none(), interval_sets),
       st.integers(1, 4))
def test_the_compiled_merge_measures_as_numpy_does(sets, within, block_rows):
    """The compiled merge (every set merged by start in one pass, packed sets decoded row by
    row, clipped to `within`) gives numpy's measure, to the ns, for sets and packed sets."""
    if not iv.compiled():
        pytest.skip("residency.traces._intervals is not built or turned off here")
    args = [arr(s) for s in sets]
    w = None if within is None else arr(within)
    got = iv.measure_union(*args, within=w, block_rows=block_rows)
    packed = [iv.Packed(iv.merge(a)) if k % 2 else a for k, a in enumerate(args)]
    assert iv.measure_union(*packed, within=w, block_rows=block_rows) == got  # (read packed)
    with iv.numpy_only():
        assert not iv.compiled()
        assert got == iv.measure_union(*args, within=w, block_rows=block_rows)
        assert got == iv.measure_union(*packed, within=w, block_rows=block_rows)


def test_packed_sets_are_decoded_across_chunks():
    """Sets of thousands of rows (the compiled merge decodes a packed set 512 rows at a time),
    with gaps and lengths of every width: the same measures packed, as rows and by numpy."""
    rng = np.random.default_rng(11)
    for widths in ((1, 50), (1, 1 << 12), (1 << 20, 1 << 33)):
        sets = [iv.merge(np.cumsum(rng.integers(*widths, 2 * n)).reshape(-1, 2))
                for n in (1, 700, 5_000, 12_345)]
        hi = max(int(x[-1, 1]) for x in sets)
        for within in (None, [[0, hi // 3]], np.sort(rng.integers(0, hi, 40)).reshape(-1, 2)):
            packed = [iv.Packed(x) for x in sets]
            want = iv.measure_union(*sets, within=within)
            assert iv.measure_union(*packed, within=within) == want
            assert iv.measure_union(*packed[1:3], within=within) == iv.measure_union(
                *sets[1:3], within=within)
            with iv.numpy_only():
                assert iv.measure_union(*sets, within=within) == want


def test_the_compiled_merge_is_built_where_a_compiler_is():
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if os.environ.get(DISABLE_ENV, "") not in ("", "0") or shutil.which(cc) is None:
        pytest.skip("the compiled merge is off here (RESIDENCY_PURE_PYTHON or no compiler)")
    assert iv.compiled(), "residency.traces._intervals is not built: reinstall (pip install -e .)"


def test_few_rows_within_are_measured_alone():
    """Markers inside two 400k-row sets (a few rows each): the same measure by the rows they
    overlap alone (found by search, clipped, a group of intervals at a time) as by the union."""
    rng = np.random.default_rng(5)
    sets = [np.cumsum(rng.integers(1, 50, 400_000)).reshape(-1, 2) for _ in range(2)]
    within = np.cumsum(rng.integers(1_000, 30_000, 600)).reshape(-1, 2)
    want = iv.measure(iv.intersection(iv.union(*sets), within))
    for block_rows in (None, 1_000, 10):
        assert iv.measure_union(*sets, within=within, block_rows=block_rows) == want
        with iv.numpy_only():
            assert iv.measure_union(*sets, within=within, block_rows=block_rows) == want


def test_merge_in_place_writes_over_the_rows_it_was_given():
    rows = arr([[0, 4], [2, 6], [6, 7], [9, 12], [10, 11], [20, 30]])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(iv, "BLOCK_ROWS", 2)
        got = iv.merge_in_place(rows)
    assert got.tolist() == [[0, 7], [9, 12], [20, 30]] and np.shares_memory(got, rows)
    frozen = arr([[0, 4], [2, 6]])
    frozen.flags.writeable = False
    assert iv.merge_in_place(frozen).tolist() == [[0, 6]] and frozen.tolist() == [[0, 4], [2, 6]]


# packed sets (cache entries, a worker's reduction on its way to the client): exact, any width
wide_sets = st.lists(st.tuples(st.integers(1, 2**40), st.integers(1, 2**40)), max_size=40).map(
    lambda steps: np.cumsum([d for pair in steps for d in pair], dtype=np.int64).reshape(-1, 2)
    - 2**41)


@settings(max_examples=300, deadline=None)
@given(st.one_of(interval_sets.map(lambda rows: iv.merge(arr(rows))), wide_sets),
       st.integers(1, 5))
def test_pack_and_unpack_give_the_set_back_exactly(x, block_rows):
    import pickle

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(iv, "BLOCK_ROWS", block_rows)
        head, lengths, gaps = iv.pack(x)
        back = iv.unpack(head, lengths, gaps)
        sent = pickle.loads(pickle.dumps(iv.Packed(x)))
    assert back.dtype == np.int64 and np.array_equal(back, x.reshape(-1, 2))
    assert isinstance(sent, iv.Packed) and np.array_equal(iv.unpacked(sent), back)
    widest = max([1, *(np.diff(x.reshape(-1)).tolist())])
    assert len(x) < 2 or lengths.itemsize + gaps.itemsize <= 2 * (
        1 if widest < 2**8 else 2 if widest < 2**16 else 4 if widest < 2**32 else 8)


def test_a_device_dense_union_packs_into_6_bytes_a_row():
    rng = np.random.default_rng(7)
    flat = np.cumsum(np.stack([rng.integers(1, 150_000, 10_000),  # gaps up to 150 us
                               rng.integers(1_000, 14_000, 10_000)], 1).reshape(-1))
    x = (flat + 1_700_000_000_000_000_000).reshape(-1, 2)
    head, lengths, gaps = iv.pack(x)
    assert (lengths.dtype, gaps.dtype) == (np.uint16, np.uint32)
    assert np.array_equal(iv.unpack(head, lengths, gaps), x)


@pytest.mark.parametrize("damage", ["zero length", "zero gap", "beyond 2**62", "lengths short",
                                    "float", "head of two rows"])
def test_unpack_refuses_what_pack_cannot_give(damage):
    head, lengths, gaps = iv.pack(arr([[0, 5], [10, 12], [20, 30]]))
    lengths, gaps = lengths.copy(), gaps.copy()
    if damage == "zero length":
        lengths[0] = 0
    elif damage == "zero gap":
        gaps[1] = 0
    elif damage == "beyond 2**62":
        gaps = np.array([5, 2**62], np.int64)
    elif damage == "lengths short":
        lengths = lengths[:1]
    elif damage == "float":
        gaps = gaps.astype(np.float64)
    else:
        head = arr([[0, 5], [10, 12]])
    with pytest.raises(ValueError):
        iv.unpack(head, lengths, gaps)


# -- folding rows into their union run by run (a rank's device tasks as they are parsed) ------

def _runs(rows, cuts):
    """`rows` split into consecutive runs at the sorted positions `cuts`."""
    bounds = [0, *sorted(c % (len(rows) + 1) for c in cuts), len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(st.one_of(interval_sets, wide_sets.map(lambda x: x.tolist())),
       st.lists(st.integers(0, 40), max_size=5), st.booleans())
def test_folded_runs_pack_exactly_as_the_merge_of_every_row(rows, cuts, in_order):
    rows = arr(sorted(rows) if in_order else rows)
    f = iv.Folded()
    for run in _runs(rows, cuts):
        f.add(run.copy())
    head, lengths, gaps = f.packed()
    want = iv.pack(iv.merge(rows))
    for got, w in zip((head, lengths, gaps), want, strict=True):
        assert got.dtype == w.dtype and np.array_equal(got, w)
    assert np.array_equal(iv.unpack(head, lengths, gaps), iv.merge(rows).reshape(-1, 2))


def test_rows_in_order_are_folded_never_held_whole():
    rng = np.random.default_rng(3)
    starts = np.cumsum(rng.integers(0, 3_000, 200_000))
    rows = np.stack([starts, starts + rng.integers(0, 5_000, len(starts))], 1)
    f = iv.Folded()
    held = 0
    for lo in range(0, len(rows), 5_000):
        f.add(rows[lo:lo + 5_000].copy())
        held = max(held, len(f.open))
    assert f.loose is None and held < 5_000  # (the open tail: about a run's union at most)
    assert np.array_equal(iv.unpack(*f.packed()), iv.merge(rows))
    g = iv.Folded()  # a run that starts before the last one: held whole from there, exact
    for run in (rows[100:200], rows[:50], rows[200:300], rows[50:100]):
        g.add(run.copy())
    assert g.loose is not None
    assert np.array_equal(iv.unpack(*g.packed()), iv.merge(rows[:300]))
