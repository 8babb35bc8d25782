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
