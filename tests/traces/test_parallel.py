"""The one parallel-execution layer (`residency.traces.parallel`): work mapped over worker
processes here or a Dask cluster, and the all-rank reduction done on the workers in a tree,
exactly the flat reduction the client would do."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from residency.analysis import idle
from residency.traces import busy as busydef
from residency.traces import intervals as iv
from residency.traces import parallel

SEED = 2101


def random_busy(seed: int, i: int) -> np.ndarray:
    """Item `i`'s random interval set (not merged: overlapping, touching and empty rows)."""
    rng = np.random.default_rng([seed, i])
    n = int(rng.integers(0, 60))
    starts = rng.integers(0, 1_000_000, n)
    ends = starts + rng.integers(0, 2_000, n)
    return np.stack([starts, ends], axis=1).astype(np.int64).reshape(-1, 2)


def union_of(parts: list[np.ndarray]) -> np.ndarray:
    return iv.union(*parts)


class ItemFailed(Exception):
    pass


def failing(seed: int, i: int) -> np.ndarray:
    if i in (5, 9, 17):
        raise ItemFailed(f"item {i}")
    return random_busy(seed, i)


@pytest.mark.parametrize("items, workers", [(1, 2), (2, 2), (13, 2), (37, 3), (64, 2)])
def test_the_tree_on_local_workers_is_the_flat_union(items, workers):
    sizes = [int(s) for s in np.random.default_rng(items).integers(1, 1 << 20, items)]
    groups = parallel.task_groups(sizes, workers)
    got, reduced = parallel.map_local(random_busy, groups, workers=workers, args=(SEED,),
                                      leaf=union_of, combine=iv.union)
    flat = [random_busy(SEED, i) for i in range(items)]
    assert sorted(got) == list(range(items))
    for i in range(items):
        assert np.array_equal(got[i], flat[i])
    assert np.array_equal(reduced, iv.union(*flat))
    _, none = parallel.map_local(random_busy, groups, workers=workers, args=(SEED,))
    assert none is None  # no reduction asked for


def test_a_local_job_error_is_the_lowest_failing_items():
    """Whichever job ends first, the error raised is the lowest failing item's, as the pool
    gave it one rank at a time (results read in plan order)."""
    groups = [(20, 17, 3), (9, 0), (5, 1, 2)] + [(i,) for i in range(21, 30)]
    with pytest.raises(ItemFailed, match=re.escape("item 5")):
        parallel.map_local(failing, groups, workers=2, args=(SEED,), leaf=union_of,
                           combine=iv.union)


def square_or_fail(x: int) -> int:
    if x < 0:
        raise ItemFailed(f"call {x}")
    return x * x


def wait_for(flag: str, x: int) -> int:
    """A call that ends only once `flag` exists (made by the caller's `then` of an earlier
    item): bounded, so that a caller that waits for every call first fails, not hangs."""
    import os
    import time

    for _ in range(6000):
        if os.path.exists(flag):
            return x
        time.sleep(0.01)
    raise ItemFailed(f"{flag} never appeared: the earlier item was not handed on first")


def test_in_order_hands_each_item_on_while_later_ones_run(tmp_path: Path) -> None:
    """Item 1's call ends only after `then(0, ...)` ran: each item is handed on as soon as
    its calls have ended, in item order, whatever order they were submitted in."""
    flag = str(tmp_path / "item-0-handed-on")
    seen: list[tuple[int, object]] = []

    def then(i: int, got: object) -> int:
        seen.append((i, got))
        if i == 0:
            Path(flag).touch()
        return i

    calls = [[(square_or_fail, (3,), {}), (square_or_fail, (4,), {})],
             [(wait_for, (flag, 7), {})], [(square_or_fail, (5,), {})]]
    out = parallel.map_in_order(calls, then, workers=2, submit_order=[1, 2, 0])
    assert out == [0, 1, 2] and seen == [(0, [9, 16]), (1, [7]), (2, [25])]
    with pytest.raises(ValueError, match="submit_order"):
        parallel.map_in_order(calls, then, workers=2, submit_order=[0, 0, 1])


def test_in_order_gives_then_the_first_failing_call_and_raises_the_first_items_error() -> None:
    """An item's `then` receives its first failing call's error (in call order) and may
    recover; the error raised is the lowest item's whose `then` raised, and no later item's
    `then` runs."""
    seen: list[tuple[int, object]] = []

    def then(i: int, got: object) -> object:
        seen.append((i, str(got) if isinstance(got, Exception) else got))
        if isinstance(got, ItemFailed) and i >= 2:
            raise got
        return "recovered" if isinstance(got, Exception) else got

    calls = [[(square_or_fail, (2,), {})],
             [(square_or_fail, (1,), {}), (square_or_fail, (-1,), {}),
              (square_or_fail, (-2,), {})],
             [(square_or_fail, (-3,), {})], [(square_or_fail, (-4,), {})]]
    with pytest.raises(ItemFailed, match="call -3"):
        parallel.map_in_order(calls, then, workers=2, submit_order=[3, 2, 1, 0])
    assert seen == [(0, [4]), (1, "call -1"), (2, "call -3")]


def test_threads_keep_the_items_order() -> None:
    assert parallel.map_threads(lambda i: i * i, range(20)) == [i * i for i in range(20)]
    assert parallel.map_threads(lambda i: i, []) == []


def reduction(rank: int, busy: np.ndarray, markers: np.ndarray,
              window: np.ndarray) -> idle.RankReduction:
    merged = iv.merge(busy)
    bounds = (int(busy[:, 0].min()), int(busy[:, 1].max())) if len(busy) else None
    return idle.RankReduction(rank, Path(f"rank{rank}.json"), len(busy), 0, merged, bounds,
                              {}, {}, markers, window, None, None, bounds, None)


@pytest.mark.parametrize("window_marker", [None, "w"])
@pytest.mark.parametrize("ranks", [1, 2, 16, 64])
def test_the_summary_from_the_tree_union_is_the_flat_summary(ranks, window_marker):
    """`summarize` given the union reduced on the workers gives every figure the flat
    reduction over every rank's busy intervals gives, to the nanosecond."""
    reductions = [reduction(r, random_busy(SEED, r), random_busy(SEED + 1, r),
                            random_busy(SEED + 2, r)) for r in range(ranks)]
    definition = busydef.resolve("all", "kineto")
    groups = parallel.task_groups([1] * ranks, 2)
    tree = iv.union(*(idle.busy_union([reductions[i] for i in g]) for g in groups))
    kw = dict(marker="m", window_marker=window_marker, allow_no_device_tasks=True)
    flat = idle.summarize("kineto", reductions, definition, **kw)
    assert flat.all_rank_idle_ns > 0 and (flat.marker_ns > 0 or ranks == 1)
    assert idle.summarize("kineto", reductions, definition, busy_union=tree, **kw) == flat


@pytest.mark.slow
def test_the_tree_on_a_dask_cluster_is_the_flat_union():
    pytest.importorskip("distributed", reason="dask[distributed] is not installed "
                        "(pip install 'residency[cluster]')")
    sizes = [int(s) for s in np.random.default_rng(7).integers(1, 1 << 20, 23)]
    got, reduced = parallel.map_dask(random_busy_on_worker, SEED, sizes, scheduler="local",
                                     workers=2, kwargs={}, leaf=union_of, combine=iv.union)
    flat = [random_busy(SEED, i) for i in range(len(sizes))]
    assert all(np.array_equal(a, b) for a, b in zip(got, flat, strict=True))
    assert np.array_equal(reduced, iv.union(*flat))


def random_busy_on_worker(seed: int, i: int) -> np.ndarray:
    return random_busy(seed, i)
