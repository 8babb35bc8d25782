"""Running work over ranks in parallel: the one execution layer of every path that maps over
ranks (`residency.traces.load` parsing files, `residency.analysis` reducing ranks).

* Here: worker processes (`process_pool`; `map_local`, every item's result at the end;
  `map_in_order`, each item's results handed on in item order while later ones run; and
  `map_threads`, threads of this process for the cache lookups), forked
  where that is safe (from a process with no threads of its own: a notebook kernel has
  some), else spawned. Each worker keeps its C heap between the runs it decodes
  (`keep_heap`): a parse frees and reallocates its 2 MiB runs, their event lists and arrays
  thousands of times, and glibc by default hands such memory back to the kernel and maps it
  again, one page fault per 4 KiB. Measured here (2
  cores, 8 ranks x 110k events, `residency idle --no-cache`, 6 interleaved rounds): 36.7k
  page faults and 0.61 s (median) with glibc's defaults, 20.4k and 0.48 s with the heap kept.
* On a Dask cluster (`map_dask`): ``"local"`` starts a `distributed.LocalCluster` that accepts
  only this process (TLS with credentials made in memory), quietened; an address given is
  used as given (its scheme checked, the handshake bounded by `SCHEDULER_CONNECT_S`). Work goes
  in tasks of a few items each by guided self-scheduling (`task_groups`); a task that fails for
  a reason of the cluster is one line (`task_error`, `DaskTaskError`).
* Reductions over the items (`leaf`, `combine`) run on the workers in a tree: each task's
  results are reduced where they were computed, and the partial results pairwise, so that the
  caller receives one reduced value, not every item's share of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (imported where a pool starts: a warm run answered by the cache, ~8 ms
    from concurrent.futures import ProcessPoolExecutor  # of imports, never starts one)

from residency.errors import BadInput, RunFailed

__all__ = ["Call", "GUIDED_SHARES", "HEAP_KEEP_BYTES", "LOOKUP_THREADS", "PARALLEL_MIN_BYTES",
           "SCHEDULER_CONNECT_S", "WORKER_START_POLL_S", "DaskTaskError", "analysis_version",
           "heap_kept", "keep_heap", "local_security", "map_dask", "map_in_order", "map_local",
           "map_threads",
           "probe_scheduler", "process_pool", "prompt_worker_start", "quiet_dask",
           "reduce_node", "run_group", "scheduler_security", "start_method", "task_error",
           "task_groups", "usable_cpus"]

PARALLEL_MIN_BYTES = 16 << 20  # below this, starting worker processes costs more than it saves

HEAP_KEEP_BYTES = 32 << 20  # freed memory a worker keeps at its heap's top
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_kept = False


def start_method() -> str:
    """How to start worker processes from this process: ``"fork"`` (cheapest) where it is safe,
    from a process with no threads of its own, else ``"spawn"``."""
    import multiprocessing

    return "fork" if (threading.active_count() == 1 and "fork" in
                      multiprocessing.get_all_start_methods()) else "spawn"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def process_pool(n: int) -> ProcessPoolExecutor:
    """`n` worker processes (module doc)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(start_method()),
                               initializer=keep_heap)


def keep_heap() -> bool:
    """In this process, keep up to `HEAP_KEEP_BYTES` of freed memory at the heap's top and
    serve buffers below half of it from the heap (glibc only: elsewhere nothing changes);
    whether it is in effect. Memory stays bounded: what is kept is reused by the next run."""
    global _kept
    if _kept:
        return True
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return False
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_KEEP_BYTES // 2)
                 and mallopt(_M_TRIM_THRESHOLD, HEAP_KEEP_BYTES))
    return _kept


def heap_kept() -> bool:
    """Whether `keep_heap` is in effect in this process."""
    return _kept


# -- the tree: partial results combined pairwise where they were computed ----------------------

def reduce_node(*parts: Any, leaf: Callable[[Any], Any] | None,
                combine: Callable[[Any, Any], Any], raw: Sequence[bool]) -> Any:
    """One node of a reduction tree: each of `parts` that is a task's results (`raw`) reduced
    by `leaf`, then all of them folded by `combine` (associative and commutative)."""
    values = [leaf(p) if r and leaf is not None else p for p, r in zip(parts, raw, strict=True)]
    return functools.reduce(combine, values)


class _Failed:
    """An item's exception, carried back from a worker so that the lowest item's is raised."""

    def __init__(self, item: int, exc: Exception) -> None:
        self.item, self.exc = item, exc


def _local_group(task: Callable[..., Any], args: tuple[Any, ...], items: Sequence[int],
                 kwargs: dict[str, Any], leaf: Callable[[list[Any]], Any] | None
                 ) -> tuple[list[Any], Any] | _Failed:
    """A local worker's job: `task(*args, item, **kwargs)` for each item in ascending order
    (so a job reports its lowest failing item), and `leaf` of the results, where they are."""
    out = []
    for i in sorted(items):
        try:
            out.append(task(*args, i, **kwargs))
        except Exception as exc:  # (raised in the caller: the lowest item's)
            return _Failed(i, exc)
    return out, (leaf(out) if leaf is not None else None)


def map_local(task: Callable[..., Any], groups: Sequence[Sequence[int]], *, workers: int,
              args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
              leaf: Callable[[list[Any]], Any] | None = None,
              combine: Callable[[Any, Any], Any] | None = None
              ) -> tuple[dict[int, Any], Any]:
    """``task(*args, item, **kwargs)`` for every item of `groups`, each group one job of
    `workers` worker processes (submitted in the order given: largest first, so that the last
    job to end is a small one). With `leaf` and `combine`, each job reduces its results with
    `leaf` where it ran, and two partial results are combined by `combine` in the same workers
    as soon as both are there (a tree on the workers); returns every item's result and the
    reduced value (None without `combine` or without items).

    Raises:
        Exception: the error of the lowest item whose task raised (every job runs to its end
            first, as the pool's shutdown waits for them).
    """
    kwargs = kwargs or {}
    results: dict[int, Any] = {}
    failed: list[_Failed] = []
    ready: list[Any] = []
    with process_pool(workers) as pool:
        jobs = {pool.submit(_local_group, task, args, g, kwargs,
                            leaf if combine is not None else None): g for g in groups}
        pending: set[Future[Any]] = set(jobs)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                got = f.result()
                if f not in jobs:
                    ready.append(got)  # a node's partial result
                elif isinstance(got, _Failed):
                    failed.append(got)
                else:
                    results.update(zip(sorted(jobs[f]), got[0], strict=True))
                    ready.append(got[1])
            while combine is not None and not failed and len(ready) > 1:
                a, b = ready.pop(), ready.pop()
                pending.add(pool.submit(reduce_node, a, b, leaf=None, combine=combine,
                                        raw=(False, False)))
    if failed:
        raise min(failed, key=lambda x: x.item).exc
    return results, (ready[0] if combine is not None and ready else None)


LOOKUP_THREADS = 8
"""At most this many threads look cache entries up (`map_threads`)."""


def map_threads(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``fn(item)`` for every item in up to `LOOKUP_THREADS` threads of this process, the
    results in item order: for work that releases the GIL (hashing each rank's trace to check
    its cache entry)."""
    if not items:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(LOOKUP_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""One call a worker makes: ``(function, args, kwargs)``."""


def map_in_order(calls: Sequence[Sequence[Call]], then: Callable[[int, Any], Any], *,
                 workers: int, submit_order: Sequence[int] | None = None) -> list[Any]:
    """Every call of every item in `workers` worker processes (the items' calls submitted
    in `submit_order`, e.g. largest first, so that the last call to end is a small one), and
    ``then(item, got)`` in this process, item by item in item order, as soon as that item's
    calls have ended, while later items' calls still run: `got` is the list of the item's
    results, one per call, or the exception of its first failing call (in call order), for
    `then` to raise or to recover from (e.g. by doing the item again whole). Returns what
    `then` returned, per item.

    Raises:
        Exception: what `then` raised, for the lowest item whose `then` raised (later items'
            `then` are not called; the calls still running end first, as the pool's shutdown
            waits for them).
    """
    order = range(len(calls)) if submit_order is None else list(submit_order)
    if sorted(order) != list(range(len(calls))):
        raise ValueError(f"The value for `submit_order` must order the {len(calls)} items "
                         f"once each, but {order!r} was passed.")
    out = []
    with process_pool(workers) as pool:
        futures = {i: [pool.submit(fn, *args, **kwargs) for fn, args, kwargs in calls[i]]
                   for i in order}
        for i in range(len(calls)):
            try:
                got: Any = [f.result() for f in futures[i]]
            except Exception as exc:  # (the item's first failing call, for `then`)
                got = exc
            out.append(then(i, got))
    return out


# -- Dask -------------------------------------------------------------------------------------

# The cluster `--scheduler local` starts does one map of CPU-bound tasks: Dask's background
# work (the statistical profiler sampling the task thread every 10 ms, event-loop ticks every
# 20 ms, system and memory monitors, work stealing between identical tasks) only competes
# with them for the cores. Quieter (key: distributed's shipped value, ours), each only where
# the user kept the shipped value: 64 ranks x 110k events on 2 cores, the gather took 3.19-3.89
# s against 3.64-4.37 s in 4 interleaved pairs (every pair faster). No HTTP routes (the
# dashboard is off; these are Prometheus, health and JSON endpoints nobody reads from a
# cluster that lives one command): the scheduler starts in 9 ms against 23 ms, the cluster
# is up and closed 9-15 ms sooner (6 interleaved pairs, every pair).
_QUIET_LOCAL_CLUSTER = {
    "distributed.worker.profile.enabled": (True, False),
    "distributed.admin.tick.interval": ("20ms", "500ms"),
    "distributed.admin.system-monitor.interval": ("500ms", "5s"),
    "distributed.worker.memory.monitor-interval": ("100ms", "1s"),
    "distributed.scheduler.work-stealing": (True, False),
    "distributed.scheduler.http.routes": ([
        "distributed.http.scheduler.prometheus", "distributed.http.scheduler.info",
        "distributed.http.scheduler.json", "distributed.http.health", "distributed.http.proxy",
        "distributed.http.statics"], []),
    "distributed.worker.http.routes": ([
        "distributed.http.worker.prometheus", "distributed.http.health",
        "distributed.http.statics"], []),
}


# A nanny polls its worker process's start message every `WorkerProcess._init_msg_interval`
# (50 ms in distributed 2024.1-2026.8, a class attribute with no setting): ~25 ms of waiting on
# average per start. Polled every 2 ms while the cluster here starts: up in 0.050-0.056 s
# against 0.077-0.081 s (4 interleaved starts of 2 workers each).
WORKER_START_POLL_S = 0.002


@contextlib.contextmanager
def prompt_worker_start() -> Iterator[None]:
    """Nannies started inside poll their worker's start message every
    `WORKER_START_POLL_S`; as before afterwards (and unchanged where this distributed has no
    such attribute)."""
    try:
        from distributed.nanny import WorkerProcess
    except ImportError:
        yield
        return
    shipped = getattr(WorkerProcess, "_init_msg_interval", None)
    if not isinstance(shipped, (int, float)) or shipped <= WORKER_START_POLL_S:
        yield
        return
    WorkerProcess._init_msg_interval = WORKER_START_POLL_S
    try:
        yield
    finally:
        WorkerProcess._init_msg_interval = shipped


# How long a scheduler address given by the user may take to connect and answer Dask's
# handshake (distributed's own `connect` waits for the handshake without a bound: a listener
# that accepts and then says nothing held `idle` silent for 480 s).
SCHEDULER_CONNECT_S = 30.0


@contextlib.contextmanager
def quiet_dask() -> Iterator[None]:
    """Dask's own log lines and warnings (a task's "Compute Failed" block, the HTTP port
    moved, sockets closed late, tornado's tracebacks when interrupted) kept from the user:
    each failure reaches the user once, as our one line. Levels as before afterwards."""
    import logging

    names = ("distributed", "tornado", "asyncio")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(distributed|tornado|dask)(\.|$)")
            warnings.simplefilter("ignore", ResourceWarning)
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


def local_security() -> Any:
    """Credentials made in memory for one local cluster, as
    `distributed.security.Security.temporary` makes them (one self-signed certificate that
    every role presents and every role requires, encryption required), with an elliptic-curve
    key (P-256, ECDSA with SHA-256) instead of a 2048-bit RSA one: made in 0.2 ms instead of
    ~50 ms here, and each TLS handshake signs faster. Valid for a day.

    Raises:
        ImportError: `cryptography` is not installed.
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from distributed.security import Security

    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-internal")])
    now = datetime.datetime.now(tz=datetime.timezone.utc).replace(tzinfo=None)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("dask-internal")]),
                           critical=False)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    return Security(require_encryption=True, tls_ca_file=cert_pem,
                    tls_client_key=key_pem, tls_client_cert=cert_pem,
                    tls_scheduler_key=key_pem, tls_scheduler_cert=cert_pem,
                    tls_worker_key=key_pem, tls_worker_cert=cert_pem)


def scheduler_security(scheduler: str) -> Any:
    """The credentials for the user's scheduler address, used as given: Dask's configuration
    (``distributed.comm.tls.*``); refused in one line where its scheme is unknown or needs
    what is not configured or installed.

    Raises:
        BadInput: as said.
    """
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address
    from distributed.security import Security

    try:
        scheme, _ = parse_address(scheduler)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"--scheduler {scheduler!r} is not a Dask address ({exc})") from None
    if scheme not in registry.backends:
        raise BadInput(f"--scheduler {scheduler!r}: unknown address scheme {scheme!r} (Dask "
                       f"knows {', '.join(sorted(registry.backends))})")
    security = Security()
    if scheme in ("tls", "wss") and security.get_connection_args("client").get(
            "ssl_context") is None:
        raise BadInput(f"--scheduler {scheduler!r} needs TLS credentials: set Dask's "
                       "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
                       "distributed.comm.tls.client.key (configuration file or "
                       "DASK_DISTRIBUTED__COMM__TLS__... variables)")
    return security


def probe_scheduler(scheduler: str, security: Any, timeout_s: float) -> None:
    """Connect to `scheduler` and complete Dask's handshake within `timeout_s`, then hang up.

    Raises:
        ValueError: unreachable, or no handshake in time (one line each).
        BadInput: the scheme's transport cannot be used here (not installed).
    """
    import asyncio

    from distributed.comm import connect

    async def probe() -> None:
        comm = await asyncio.wait_for(connect(
            scheduler, timeout=timeout_s, **security.get_connection_args("client")),
            timeout_s)
        await comm.close()

    try:
        asyncio.run(probe())
    except (asyncio.TimeoutError, TimeoutError):
        raise ValueError(f"the Dask scheduler {scheduler!r} did not complete Dask's handshake "
                         f"within {timeout_s:g} s (is a Dask scheduler listening there, with "
                         "the credentials given?)") from None
    except (OSError, ValueError) as exc:
        text = " ".join(str(exc).split())[:300]
        raise ValueError(f"cannot reach the Dask scheduler {scheduler!r}: {text}") from None
    except (ImportError, TypeError, RuntimeError, AttributeError) as exc:
        text = " ".join(str(exc).split())[:300]
        raise BadInput(f"--scheduler {scheduler!r} cannot be used here "
                       f"({type(exc).__name__}: {text})") from None


class DaskTaskError(RunFailed):
    """A Dask task that could not compute its ranks for a reason of the cluster, not of a
    trace (a worker without residency, a worker lost): exit 1, with what to fix."""


def task_error(exc: Exception, root: Any, scheduler: str) -> Exception:
    """What a failed Dask task reports: a trace's own error as the local path gives it; a
    trace path a remote worker cannot read (`root`: the path to name when the error names
    none), or any other failure, as one line saying what every worker needs."""
    from residency.traces.files import TraceError

    where = ("this machine's LocalCluster" if scheduler == "local" else
             f"the cluster at {scheduler}")
    if isinstance(exc, OSError) and scheduler != "local":
        path = exc.filename or root
        return TraceError(path, f"cannot be read on a worker of {where} ({exc.strerror or exc}"
                          "): every worker must read the traces at the paths given here (a "
                          "shared file system mounted at the same path on every worker)")
    if isinstance(exc, (BadInput, OSError, DaskTaskError)):
        return exc  # (the same error as without --scheduler, or already one line)
    kind = type(exc).__name__
    text = " ".join(str(exc).split())[:300]
    if isinstance(exc, ImportError) or kind == "AttributeError":
        need = ("every worker must import residency, the version installed here (install "
                "it into each worker's environment, then restart the workers)")
    elif kind in ("KilledWorker", "CommClosedError", "CancelledError", "TimeoutError"):
        need = ("a worker or the scheduler was lost during the task (out of memory? see the "
                "workers' logs); rerun, or give the workers more memory")
    else:
        need = "see the workers' logs"
    return DaskTaskError(f"a Dask task on {where} failed ({kind}: {text}): {need}")


# A Dask task costs the scheduler and client ~3-6 ms of CPU, which `--scheduler local` takes
# from the cores its workers parse on: 64 ranks x 110k events (26 MB each) on 2 workers, one
# task per rank took 0.35-0.48 s of this process's CPU during the map, against 0.19-0.22 s in
# tasks of 3 ranks. Equal tasks of 3 ranks (22 tasks) still left that CPU and a last task that
# one worker waits on; guided self-scheduling (Polychronopoulos & Kuck 1987: each task takes a
# fixed share of the work not yet handed out) gives 13 tasks, the first of 16 ranks and the
# last four of one: `residency idle --scheduler local` 1.48 s (1.46-1.54) against 1.50 s
# (1.48-1.55), n=9 each, the local path 1.15-1.16 s in both runs (benchmarks/trace_analysis.py).
GUIDED_SHARES = 2  # a task takes 1/(GUIDED_SHARES x threads) of the bytes not yet in a task


def task_groups(sizes: Sequence[int], threads: int) -> list[tuple[int, ...]]:
    """The items of `sizes` (trace bytes per item; 0 where the size cannot be read here)
    grouped into Dask tasks, largest items first: each task takes items until it holds
    1/(`GUIDED_SHARES` x `threads`) of the bytes not yet in a task, so the first tasks are
    large (few tasks) and the last hold one item each (no worker waits long on another's last
    task); an item of unknown size (0) is a task of its own, and so is every item where no
    worker thread is known yet (`threads` 0: a cluster whose workers have not joined)."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    if threads < 1:
        return [(i,) for i in order]
    left = sum(sizes)
    groups: list[tuple[int, ...]] = []
    group: list[int] = []
    held = 0
    for i in order:
        if sizes[i] <= 0:  # (after every known size: the largest first)
            if group:
                groups.append(tuple(group))
                group, held = [], 0
            groups.append((i,))
            continue
        group.append(i)
        held += sizes[i]
        if held >= left // max(1, threads * GUIDED_SHARES):
            groups.append(tuple(group))
            left -= held
            group, held = [], 0
    if group:
        groups.append(tuple(group))
    return groups


@functools.cache
def analysis_version() -> str:
    """This residency's installed version and trace parser version ("0.1.0, parser 7"; the
    version "not installed" for a source tree on the path): what a Dask worker must run for
    its reductions to be this process's."""
    from importlib.metadata import PackageNotFoundError, version

    from residency.traces.cache import PARSER_VERSION

    try:
        installed = version("residency")
    except PackageNotFoundError:
        installed = "not installed"
    return f"{installed}, parser {PARSER_VERSION}"




def run_group(shared: Any, items: Sequence[int], *, task: Callable[..., Any], ours: bool,
              kwargs: dict[str, Any], version: str | None = None) -> list[Any]:
    """A Dask task: ``task(shared, item, **kwargs)`` of each of `items`, in order; `ours`: on
    a worker of the cluster started here, which keeps its heap as the local pool's do (64 x
    110k, 5 interleaved rounds: 1.24x the local path against 1.31x without).

    Raises:
        DaskTaskError: `version` (the client's `analysis_version`) is not this worker's.
    """
    if version is not None and version != analysis_version():
        import socket

        raise DaskTaskError(f"the Dask worker on {socket.gethostname()} runs residency "
                            f"{analysis_version()}, this process {version}: install the same "
                            "residency on every worker (its figures could differ)")
    if ours:
        keep_heap()
    return [task(shared, i, **kwargs) for i in items]


def map_dask(task: Callable[..., Any], shared: Any, sizes: Sequence[int], *, scheduler: str,
             workers: int | None, kwargs: dict[str, Any], root: Any = None,
             leaf: Callable[[list[Any]], Any] | None = None,
             combine: Callable[[Any, Any], Any] | None = None) -> tuple[list[Any], Any]:
    """``task(shared, item, **kwargs)`` for every item (`sizes`: bytes per item, 0 where
    unknown here), on a Dask cluster in tasks of a few items each (`task_groups`), each task's
    results taken here as it ends; `shared` goes to each worker once. With `leaf` and
    `combine`, each task's results are reduced by `leaf` on its worker and the partial results
    pairwise by `combine` on the workers (a tree: only the reduced value comes here). Returns
    the results in item order and the reduced value (None without `combine`).

    `scheduler` ``"local"``: a cluster of `workers` one-thread processes started here that
    accepts only this process: its scheduler and workers speak TLS with credentials made for
    it in memory (`local_security`, mutual authentication), so another
    process of any user on the host cannot connect, submit work or read results. Else the
    scheduler's address, used as given (`scheduler_security`, `probe_scheduler`).

    Raises:
        ValueError: Dask not installed; a scheduler that cannot be reached.
        BadInput: an address that cannot be used here.
        Exception: a task's own error, or `task_error`'s translation (`root`: the path named
            for a file a remote worker cannot read).
    """
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ValueError("--scheduler needs Dask: pip install 'residency[cluster]' "
                         "(dask[distributed])") from None

    import logging

    ours = False
    with contextlib.ExitStack() as stack:
        stack.enter_context(quiet_dask())
        if scheduler == "local":
            import dask

            try:
                security = local_security()
            except ImportError:
                raise ValueError("--scheduler local needs the package cryptography (for the "
                                 "cluster's temporary TLS credentials): pip install "
                                 "'residency[cluster]'") from None
            key = "distributed.worker.multiprocessing-method"
            # fork starts a worker in 0.3 s, spawn in 3 s (measured here); where the local
            # pool would fork, and never over a choice the user made
            if dask.config.get(key, "spawn") == "spawn" and start_method() == "fork":
                stack.enter_context(dask.config.set({key: "fork"}))
            stack.enter_context(dask.config.set({
                k: quiet for k, (shipped, quiet) in _QUIET_LOCAL_CLUSTER.items()
                if dask.config.get(k, shipped) == shipped}))
            # the package versions every worker reports when it registers (and the client
            # checks), read once here (a cached lookup) for the workers forked from here to
            # inherit: the cluster up in 0.15 s against 0.22 s (6 interleaved starts)
            from distributed.versions import get_versions

            get_versions()
            threads = workers or min(usable_cpus(), max(1, len(sizes)))
            with prompt_worker_start():
                cluster = stack.enter_context(LocalCluster(
                    n_workers=threads, threads_per_worker=1, processes=True,
                    host="127.0.0.1", protocol="tls://", security=security,
                    silence_logs=logging.CRITICAL + 1, dashboard_address=None,
                    # (the scheduler's bare HTTP server, no routes: on loopback, any free port)
                    scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}))
            client = stack.enter_context(Client(cluster, security=security))
            ours = True
        else:
            security = scheduler_security(scheduler)
            probe_scheduler(scheduler, security, SCHEDULER_CONNECT_S)
            try:
                client = stack.enter_context(Client(scheduler, security=security,
                                                    timeout=SCHEDULER_CONNECT_S))
            except (OSError, TimeoutError, ValueError) as exc:
                raise ValueError(f"cannot reach the Dask scheduler {scheduler!r}: "
                                 f"{exc}") from None
            threads = sum(client.nthreads().values())  # (workers that join later: more)
        groups = task_groups(sizes, threads)
        # `shared` (every rank's path) goes to each worker once, not once per task: pickled
        # into every task it grew with the square of the ranks
        scattered = client.scatter(shared, broadcast=True, hash=False)
        futures = client.map(run_group, [scattered] * len(groups), groups,
                             pure=False, ours=ours, task=task, kwargs=kwargs,
                             # (workers forked from here run this code: ~65 ms not spent)
                             version=None if ours else analysis_version())
        # each task's results fetched as it ends, while the others run (a gather at the end
        # fetched all 64 of 64 x 110k after the last task: ~0.06 s); two finished parts of
        # the reduction are combined on the workers at once, the data staying there
        at = {f.key: g for f, g in zip(futures, groups, strict=True)}
        got: dict[int, Any] = {}
        ready: list[tuple[Any, bool]] = []  # (future, whether a task's raw results)
        reduced = None
        try:
            for future, results in as_completed(futures, with_results=True):
                got.update(zip(at[future.key], results, strict=True))
                if combine is None:
                    continue
                ready.append((future, True))
                if len(ready) > 1:
                    (a, ra), (b, rb) = ready.pop(), ready.pop()
                    ready.insert(0, (client.submit(reduce_node, a, b, leaf=leaf,
                                                   combine=combine, raw=(ra, rb),
                                                   pure=False), False))
            if combine is not None and ready:
                while len(ready) > 1:
                    (a, ra), (b, rb) = ready.pop(), ready.pop()
                    ready.insert(0, (client.submit(reduce_node, a, b, leaf=leaf,
                                                   combine=combine, raw=(ra, rb),
                                                   pure=False), False))
                last, raw = ready[0]
                reduced = (client.submit(reduce_node, last, leaf=leaf, combine=combine,
                                         raw=(True,), pure=False) if raw else last).result()
        except Exception as exc:  # sorted by kind in task_error
            raise task_error(exc, root, scheduler) from exc
        return [got[i] for i in range(len(sizes))], reduced
