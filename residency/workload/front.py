"""The service's front process: starts the ranks, queues each request to them, matches their
results, cancels, and watches for dead ranks (`Service`)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from residency.workload.admission import request_error
from residency.workload.config import ServeConfig, log
from residency.workload.ranks import STOP, rank_main

RANK_READY_TIMEOUT_S = 600.0
DEATH_GRACE_S = 3.0             # how long a reported rank error waits for the others' status


def _exit_cause(rank: int, code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"


class Service:
    """The front process: starts the ranks, serves HTTP, watches for dead ranks."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(cfg.ranks)]  # one per rank: no idle collective
        self.results, self.status = ctx.Queue(), ctx.Queue()
        self.cancelled = ctx.Value("q", 0)  # highest cancelled request sequence number
        self.procs = [ctx.Process(target=rank_main, name=f"residency-rank{r}",
                                  args=(r, cfg, self.commands[r], self.results, self.status,
                                        self.cancelled, os.getpid()))
                      for r in range(cfg.ranks)]
        self.ready = False
        self.ready_ranks: set[int] = set()
        self.rank_errors: dict[int, str] = {}
        self.failure: str | None = None
        self.stopping = False
        self.busy = threading.Lock()
        self.counter = 0
        self.pids: list[int] = []
        self._check_lock = threading.Lock()
        self._results_cond = threading.Condition()
        self._waiting: set[str] = set()
        self._arrived: dict[str, dict[str, Any]] = {}
        self._abandoned: dict[str, str] = {}   # request id -> why its result is unwanted
        self._current: tuple[int, str] | None = None
        self._collector: threading.Thread | None = None

    # lifecycle
    def start(self) -> None:
        for p in self.procs:
            p.start()
        self.pids = [p.pid or 0 for p in self.procs]
        self._collector = threading.Thread(target=self._collect_results, name="results",
                                           daemon=True)
        self._collector.start()

    def wait_ready(self, timeout_s: float = RANK_READY_TIMEOUT_S,
                   abort: Callable[[], bool] | None = None) -> None:
        """Wait until every rank is ready (or `abort()` is true); RuntimeError on failure."""
        deadline = time.monotonic() + timeout_s
        while len(self.ready_ranks) < self.cfg.ranks:
            if abort is not None and abort():
                return
            if self.check_ranks():
                raise RuntimeError(self.failure)
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.cfg.ranks)) - self.ready_ranks)
                raise RuntimeError(f"ranks not ready after {timeout_s:.0f} s: {missing}")
            time.sleep(0.1)
        self.ready = True

    def _drain_status(self) -> None:
        while True:  # events from ranks: ready, or an error before exiting
            try:
                event = self.status.get_nowait()
            except queue.Empty:
                return
            if event["event"] == "ready":
                self.ready_ranks.add(event["rank"])
            elif event["event"] == "error":
                self.rank_errors[event["rank"]] = event["error"]
                sys.stderr.write(event.get("traceback", ""))

    def check_ranks(self) -> str | None:
        """Set and return `failure` when a rank died or failed while it should be serving.

        A rank that died without reporting an error (killed) is named first: the errors that
        other ranks then report (a broken collective) are consequences. Before a reported
        error is turned into the diagnosis, every rank gets `DEATH_GRACE_S` to show its exit
        status, so that the survivor's collective error never hides the dead rank.
        """
        with self._check_lock:
            if self.failure or self.stopping:
                return self.failure
            self._drain_status()
            if self.rank_errors:
                deadline = time.monotonic() + DEATH_GRACE_S
                while not all(p.exitcode is not None or r in self.rank_errors
                              for r, p in enumerate(self.procs)):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                    self._drain_status()
            exited = [(r, p.exitcode) for r, p in enumerate(self.procs)
                      if p.exitcode is not None]
            silent = [(r, code) for r, code in exited if r not in self.rank_errors]
            causes = [_exit_cause(r, code) for r, code in silent]
            causes += [f"rank {r} failed: {err}" for r, err in sorted(self.rank_errors.items())]
            if causes:
                self.failure = "; ".join(causes)
                self.ready = False
                self.cancel_current("rank failure")
            return self.failure

    def stop(self, grace_s: float = 20.0) -> None:
        self.stopping = True
        self.cancel_current("service stopping")
        for r, p in enumerate(self.procs):
            if p.exitcode is None:
                self.commands[r].put(dict(STOP))
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    # results: matched on request id; anything else is a late result, logged and dropped
    def _collect_results(self) -> None:
        while True:
            try:
                result = self.results.get(timeout=0.5)
            except queue.Empty:
                if self.stopping and not any(p.is_alive() for p in self.procs):
                    return
                continue
            except (EOFError, OSError):
                return
            rid = str(result.get("request_id"))
            with self._results_cond:
                if rid in self._waiting:
                    self._arrived[rid] = result
                    self._results_cond.notify_all()
                    continue
                why = self._abandoned.pop(rid, "nobody waits for it")
            per_rank = [r for r in result.get("per_rank", []) if isinstance(r, dict)]
            stops = {r.get("cancelled") for r in per_rank}
            where = (f"; {stops.pop()} on every rank" if len(stops) == 1 and None not in stops
                     else "; ranks: " + ", ".join(
                         f"{r.get('rank')}: {r.get('cancelled') or r.get('error') or 'finished'}"
                         for r in per_rank))
            log(f"discarded the late result of request {rid} ({why}){where}")

    def cancel_current(self, why: str) -> None:
        """Cancel the running request (if any) on every rank at its next step boundary."""
        current = self._current
        if current is not None:
            self._abandon(*current, why)

    def _abandon(self, seq: int, request_id: str, why: str) -> None:
        with self._results_cond:
            if request_id not in self._waiting:
                return
            self._waiting.discard(request_id)
            self._abandoned[request_id] = why
            while len(self._abandoned) > 64:
                self._abandoned.pop(next(iter(self._abandoned)))
        with self.cancelled.get_lock():
            self.cancelled.value = max(self.cancelled.value, seq)
        log(f"request {request_id} {why}: cancelled on every rank at the next step boundary")

    # requests
    def generate(self, body: dict[str, Any],
                 client_gone: Callable[[], bool] | None = None) -> tuple[int, dict[str, Any]]:
        """Run one request; `client_gone` is polled while waiting (a gone client cancels)."""
        refused = request_error(body)
        if refused is not None:
            return 400, {"error": refused}
        steps, seed = body["steps"], body.get("seed", 0)
        if self.check_ranks():
            return 503, {"error": self.failure}
        if not self.ready or self.stopping:
            return 503, {"error": "service not ready" if not self.stopping else "stopping"}
        if not self.busy.acquire(blocking=False):
            return 429, {"error": "a request is running; one at a time"}
        self.counter += 1
        seq = self.counter
        request_id = f"{'warmup-' if body.get('warmup') else 'r'}{seq:04d}"
        try:
            with self._results_cond:
                self._waiting.add(request_id)
            self._current = (seq, request_id)
            cmd = {"op": "generate", "request_id": request_id, "seq": seq, "steps": steps,
                   "seed": seed, "profile": not body.get("warmup", False)}
            for q in self.commands:
                q.put(cmd)
            timeout_s = self.cfg.request_timeout_s
            deadline = time.monotonic() + timeout_s
            result = None
            while result is None:
                with self._results_cond:
                    result = self._arrived.pop(request_id, None)
                    if result is None:
                        self._results_cond.wait(0.2)
                        result = self._arrived.pop(request_id, None)
                    given_up = request_id not in self._waiting  # abandoned by the service
                if result is not None:
                    break
                if self.check_ranks():
                    return 503, {"error": self.failure, "request_id": request_id}
                if given_up:  # cancelled by the service itself (stopping)
                    return 503, {"error": f"request {request_id} cancelled: the service "
                                          "is stopping", "request_id": request_id}
                if client_gone is not None and client_gone():
                    self._abandon(seq, request_id, "client disconnected")
                    return 499, {"error": "client disconnected", "request_id": request_id}
                if time.monotonic() > deadline:
                    self._abandon(seq, request_id, f"timed out after {timeout_s:g} s")
                    return 504, {"error": f"request timed out after {timeout_s:g} s "
                                          "(--request-timeout); cancelled at the next step "
                                          "boundary", "request_id": request_id}
            per_rank = result["per_rank"]
            foreign = [r for r in per_rank if r.get("request_id") != request_id]
            if result.get("request_id") != request_id or foreign:
                return 500, {"error": f"results of another request arrived for {request_id}",
                             "request_id": request_id}
            errors = [r for r in per_rank if "error" in r or "cancelled" in r]
            payload = {"request_id": request_id, "arm": self.cfg.arm,
                       "device_kind": self.cfg.device_kind, "ranks": self.cfg.ranks,
                       "steps": steps, "seed": seed, "per_rank": per_rank}
            if errors:
                payload["error"] = "; ".join(
                    f"rank {r['rank']}: {r.get('error') or r.get('cancelled')}" for r in errors)
                return 500, payload
            return 200, payload
        finally:
            with self._results_cond:
                self._waiting.discard(request_id)
            self._current = None
            self.busy.release()

    def health(self) -> tuple[int, dict[str, Any]]:
        failure = self.check_ranks()
        body = {"status": "ok" if self.ready and not failure else
                ("failed" if failure else "starting"),
                "ranks": self.cfg.ranks, "arm": self.cfg.arm,
                "device_kind": self.cfg.device_kind, "rank_pids": self.pids,
                "inject_failure": self.cfg.inject_failure}
        if failure:
            body["error"] = failure
        return (200 if body["status"] == "ok" else 503), body
