"""The workload service: `ranks` processes with torch.distributed behind an HTTP front end.

The front process serves HTTP on loopback and watches the ranks; rank 0 takes each request
from it and broadcasts it; every rank runs the pipeline on its own device; rank 0 gathers the
per-rank summaries and hands them back.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import ipaddress
import json
import multiprocessing as mp
import os
import queue
import select
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from residency.policy.cache import decisions_file
from residency.processes import die_with_parent, parent_gone, remove_scratch, watched_parent
from residency.protocol import MAX_SEED, MAX_STEPS
from residency.workload import profiling

STOP = {"op": "stop"}
RANK_READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 3600.0      # default of `serve --request-timeout`
COLLECTIVE_TIMEOUT_S = 1800.0   # torch.distributed timeout; collectives run only in a request
READ_TIMEOUT_S = 10.0           # per socket read/write of the HTTP front end
HEADER_TIMEOUT_S = 10.0         # a request line and all its headers must arrive within this
BODY_TIMEOUT_S = 30.0           # a whole request body must arrive within this
MAX_BODY_BYTES = 1 << 20
MAX_HANDLERS = 16               # concurrent HTTP connections; more get 503 and are closed
MAX_PER_CLIENT = 8              # of those, at most this many from one client (local user)
DEATH_GRACE_S = 3.0             # how long a reported rank error waits for the others' status
ORPHAN_GRACE_S = 3.0            # rank stop grace once the starting process is gone


@dataclass(frozen=True)
class ServeConfig:
    """Everything a rank needs; picklable for spawned processes."""

    arm: str
    device_kind: str
    ranks: int
    decisions_dir: str
    profile_dir: str | None = None
    scale: float = 1.0
    capacity_bytes: int | None = None
    resident_mib: float = 1024
    rendezvous: str = ""        # file:// init method; empty: serve() makes a private one
    warmup_steps: int = 1
    request_timeout_s: float = REQUEST_TIMEOUT_S
    inject_failure: str = "none"  # devices.INJECTIONS: injected into the baseline arm only
    accelerator_patch: str = "none"  # with inject_failure: vllm-ascend's redirection on top
    resident_on_device: bool = False  # the resident footprint made on the device (scale auto)


def _log(message: str) -> None:
    sys.stderr.write(f"[service] {message}\n")
    sys.stderr.flush()


def _loopback_ifname() -> str:
    return "lo0" if sys.platform == "darwin" else "lo"


class RequestCancelled(Exception):
    """Raised on every rank at the step boundary where a cancelled request stops."""


# --- rank processes ---------------------------------------------------------------------------

def _rank_main(rank: int, cfg: ServeConfig, commands: Any, results: Any, status: Any,
               cancelled: Any, front_pid: int) -> None:
    """Body of one rank process; reports `ready`/`error` on `status`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the front process coordinates shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)                # no rank outlives the front process
    if parent_gone(front_pid):
        return
    try:
        _rank_loop(rank, cfg, commands, results, status, cancelled, front_pid)
    except Exception as exc:  # report, then die: the front process turns it into a 503
        status.put({"rank": rank, "event": "error", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})
        raise SystemExit(1) from exc


def _rank_loop(rank: int, cfg: ServeConfig, commands: Any, results: Any, status: Any,
               cancelled: Any, front_pid: int) -> None:
    import torch
    import torch.distributed as dist

    from residency import devices
    from residency.policy.cache import JsonlRecorder, policy_for
    from residency.workload.inject import inject_for_arm
    from residency.workload.pipeline import Pipeline, WorkloadConfig, open_device

    torch.set_num_threads(1)
    ops = open_device(cfg.device_kind, rank, devices=cfg.ranks,
                      capacity_bytes=cfg.capacity_bytes)
    injected = inject_for_arm(cfg.device_kind, cfg.arm, cfg.inject_failure,
                              cfg.accelerator_patch)
    if injected is not None and rank == 0:
        _log(f"arm {cfg.arm}: generic torch.accelerator telemetry failure injected "
             f"({injected['error']}; redirected by {cfg.accelerator_patch}: "
             f"{', '.join(injected['redirected']) or 'nothing'})")
    backend = devices.backend(cfg.device_kind)
    # every listener on loopback: the rendezvous is a file, gloo/nccl sockets bind to `lo`
    os.environ["GLOO_SOCKET_IFNAME"] = _loopback_ifname()
    os.environ["NCCL_SOCKET_IFNAME"] = _loopback_ifname()
    os.environ["HCCL_IF_IP"] = "127.0.0.1"  # HCCL's host NIC for its root info (CANN docs)
    dist.init_process_group(backend, init_method=cfg.rendezvous, rank=rank,
                            world_size=cfg.ranks,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    jsonl = JsonlRecorder(Path(cfg.decisions_dir) / decisions_file(rank),
                          device_kind=cfg.device_kind)
    recorder = _Tee(jsonl)
    release = getattr(ops, "module", None)
    policy = policy_for(cfg.arm, ops.device, recorder=recorder, rank=rank,
                        release=None if release is None else release.empty_cache)
    pipeline = Pipeline(ops, policy, WorkloadConfig(scale=cfg.scale, resident_mib=cfg.resident_mib,
                                                    resident_on_device=cfg.resident_on_device),
                        rank=rank, world_size=cfg.ranks)
    profiler = profiling.profiler(cfg.device_kind, rank=rank, world_size=cfg.ranks,
                                module=getattr(ops, "module", None))
    exchange_device = ops.device if backend != "gloo" else None
    current = {"seq": 0, "cancel": False}

    def barrier() -> None:
        if backend == "gloo":  # dist.barrier() asks the (emulated) accelerator for a device
            dist.all_reduce(torch.zeros(1))
        else:
            dist.barrier()

    def wants_cancel() -> float:
        return 1.0 if current["seq"] and cancelled.value >= current["seq"] else 0.0

    def exchange(t: torch.Tensor) -> torch.Tensor:
        # the per-step all-reduce carries one more element: this rank's view of "cancelled";
        # the sum is the same on every rank, so all ranks stop at the same step boundary
        flag = torch.tensor([wants_cancel()], dtype=t.dtype)
        t = torch.cat([t.reshape(-1), flag])
        t = t if exchange_device is None else t.to(exchange_device)
        dist.all_reduce(t)
        t = t.cpu()
        current["cancel"] = bool(t[-1] > 0)
        return t[:-1]

    def on_step(step: int) -> None:
        agreed = current["cancel"] if cfg.ranks > 1 else bool(wants_cancel())
        if agreed:
            raise RequestCancelled(f"cancelled after step {step + 1}")

    def serve_one(cmd: dict[str, Any]) -> dict[str, Any]:
        jsonl.set_context(request_id=cmd["request_id"])
        current.update(seq=int(cmd.get("seq", 0)), cancel=False)
        profile = cfg.profile_dir is not None and cmd.get("profile", True)
        if profile:
            profiler.start(Path(cfg.profile_dir) / cmd["request_id"])
        try:
            result = pipeline.run(cmd["request_id"], steps=cmd["steps"], seed=cmd["seed"],
                                  exchange=exchange if cfg.ranks > 1 else None,
                                  on_step=on_step)
        finally:
            if profile:
                profiler.stop()
        summary = result.summary()
        summary["request_id"] = cmd["request_id"]
        summary["profiled"] = bool(profile)
        return summary

    # service warm-up: every rank runs a short request before the service reports ready
    serve_one({"request_id": "warmup-service", "steps": cfg.warmup_steps, "seed": 0,
               "profile": False})
    barrier()
    status.put({"rank": rank, "event": "ready", "pid": os.getpid()})
    while True:
        # waiting for work is local (this rank's own queue), never a collective: an idle
        # service has no timeout
        cmd = _next_command(commands, front_pid)
        if cmd.get("op") == "stop":
            break
        try:
            summary: dict[str, Any] = serve_one(cmd)
        except RequestCancelled as exc:
            summary = {"rank": rank, "request_id": cmd["request_id"], "cancelled": str(exc)}
        except Exception as exc:  # the request fails on this rank; report it, keep serving
            summary = {"rank": rank, "request_id": cmd["request_id"],
                       "error": f"{type(exc).__name__}: {exc}"}
        gathered: list[Any] = [None] * cfg.ranks if rank == 0 else []
        dist.gather_object(summary, gathered if rank == 0 else None, dst=0)
        barrier()
        if rank == 0:
            results.put({"request_id": cmd["request_id"], "per_rank": gathered})
    jsonl.close()
    dist.destroy_process_group()
    del recorder


class _Tee:
    """Records to a JSONL file and keeps the decisions in memory for the request summary."""

    def __init__(self, jsonl: Any) -> None:
        from residency.policy.cache import ListRecorder

        self.jsonl, self._list = jsonl, ListRecorder()

    @property
    def decisions(self) -> list[Any]:
        return self._list.decisions

    def record(self, decision: Any) -> None:
        self._list.record(decision)
        self.jsonl.record(decision)


def _next_command(commands: Any, front_pid: int) -> dict[str, Any]:
    while True:
        try:
            return commands.get(timeout=1.0)
        except queue.Empty:
            if parent_gone(front_pid):
                return dict(STOP)


# --- front process ----------------------------------------------------------------------------

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
        self.procs = [ctx.Process(target=_rank_main, name=f"residency-rank{r}",
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
            _log(f"discarded the late result of request {rid} ({why}){where}")

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
        _log(f"request {request_id} {why}: cancelled on every rank at the next step boundary")

    # requests
    def generate(self, body: dict[str, Any],
                 client_gone: Callable[[], bool] | None = None) -> tuple[int, dict[str, Any]]:
        """Run one request; `client_gone` is polled while waiting (a gone client cancels)."""
        steps, seed = body.get("steps"), body.get("seed", 0)
        if (not isinstance(steps, int) or isinstance(steps, bool)
                or not 1 <= steps <= MAX_STEPS):
            return 400, {"error": f"`steps` must be an integer in [1, {MAX_STEPS}], "
                                  f"got {_short(steps)}"}
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
            return 400, {"error": f"`seed` must be an integer in [0, 2**53 - 1], "
                                  f"got {_short(seed)}"}
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each socket read bounded by `READ_TIMEOUT_S` and, while a
    request's line and headers are read, by the whole-header deadline too (a client that
    trickles one byte every few seconds cannot hold a handler for longer)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = READ_TIMEOUT_S
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"request headers not complete within {HEADER_TIMEOUT_S:g} s")
            timeout = min(timeout, left)
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


def _handler(service: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S  # every socket read and write; an idle keep-alive closes

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the plain makefile() reader: replaced by a bounded one
            self._reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            # the request line and headers of each request (keep-alive too) within one
            # deadline; the body has its own (`BODY_TIMEOUT_S`)
            self._reader.deadline = time.monotonic() + HEADER_TIMEOUT_S
            super().handle_one_request()

        def parse_request(self) -> bool:
            ok = super().parse_request()
            self._reader.deadline = None
            return ok

        def _framing_error(self) -> tuple[int, str] | None:
            """A request whose body framing could be read two ways (request smuggling)."""
            if self.headers.get_all("Transfer-Encoding"):
                return 501, "Transfer-Encoding is not supported: send a Content-Length body"
            if len(self.headers.get_all("Content-Length") or []) > 1:
                return 400, "more than one Content-Length header"
            return None

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write(f"[http] {self.address_string()} {fmt % args}\n")

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _read_body(self) -> bytes:
            raw = self.headers.get("Content-Length")
            if raw is None:
                return b""
            if not raw.strip().isdigit() or not raw.strip().isascii():
                raise _BadRequest(400, f"Content-Length must be a non-negative integer, "
                                       f"got {_short(raw)}")
            length = int(raw.strip())
            if length > MAX_BODY_BYTES:
                raise _BadRequest(413, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            deadline = time.monotonic() + BODY_TIMEOUT_S
            chunks, remaining = [], length
            while remaining:
                if time.monotonic() > deadline:
                    raise _BadRequest(408, f"body not received within {BODY_TIMEOUT_S:g} s")
                try:
                    chunk = self.rfile.read1(min(remaining, 65536))
                except TimeoutError:
                    raise _BadRequest(408, f"no body data for {READ_TIMEOUT_S:g} s") from None
                if not chunk:
                    raise _BadRequest(400, f"body ended after {length - remaining} of "
                                           f"{length} bytes (Content-Length)")
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)

        def _client_gone(self) -> bool:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except (OSError, ValueError):
                return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            framing = self._framing_error()
            if framing is not None or self.headers.get("Content-Length") not in (None, "0"):
                self.close_connection = True  # a body we do not read: never a next request
            if framing is not None:
                self._send(framing[0], {"error": framing[1]})
                return
            if self.path == "/health":
                self._send(*service.health())
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            framing = self._framing_error()
            if framing is not None:
                self.close_connection = True
                self._send(framing[0], {"error": framing[1]})
                return
            try:
                data = self._read_body()
            except _BadRequest as exc:
                self.close_connection = True  # the stream position is unknown
                self._send(exc.code, {"error": str(exc)})
                return
            if self.path != "/v1/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                body = json.loads(data or b"null")
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object")
            except (ValueError, RecursionError) as exc:
                self._send(400, {"error": f"invalid JSON body: {exc}"})
                return
            code, payload = service.generate(body, client_gone=self._client_gone)
            if code == 499:  # nobody to answer
                self.close_connection = True
                return
            self._send(code, payload)

    return Handler


def _proc_net_key(sock: socket.socket) -> str | None:
    """The local user of a loopback peer: the uid owning the peer's end of `sock` in
    /proc/net/tcp{,6} (Linux); None when it cannot be told."""
    try:
        peer = sock.getpeername()
        mine = sock.getsockname()
    except OSError:
        return None

    def hexaddr(addr: tuple[Any, ...], v6: bool) -> str:
        packed = ipaddress.ip_address(addr[0]).packed
        if v6:  # four host-order 32-bit words
            words = [packed[i:i + 4][::-1].hex() for i in range(0, 16, 4)]
            return f"{''.join(words).upper()}:{addr[1]:04X}"
        return f"{packed[::-1].hex().upper()}:{addr[1]:04X}"

    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.read().split("\n")[1:]
            local, remote = hexaddr(peer, v6), hexaddr(mine, v6)
        except (OSError, ValueError):
            continue
        for line in lines:
            f = line.split()
            if len(f) > 7 and f[1] == local and f[2] == remote:
                return f"uid {f[7]}"
    return None


def client_key(sock: socket.socket, address: Any) -> str:
    """Who a connection comes from, for the per-client cap: its local user when the kernel
    says (every client of a loopback service is local; an address in 127/8 is free to pick),
    else its address."""
    return _proc_net_key(sock) or f"address {address[0] if address else '?'}"


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_handlers` at once and `max_per_client` of them
    from one client (`client_key`); the rest get 503 and close."""

    daemon_threads = True
    request_queue_size = 64  # listen backlog: bursts wait in the kernel, not in SYN retries
    BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: 34\r\n\r\n"
            b'{"error": "too many connections"}\n')

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_handlers: int = MAX_HANDLERS, max_per_client: int = MAX_PER_CLIENT,
                 key: Callable[[socket.socket, Any], str] = client_key) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_handlers)
        self._per_client: dict[str, int] = {}
        self._per_client_lock = threading.Lock()
        self._max_per_client = max_per_client
        self._key = key
        self._keys: dict[int, str] = {}

    def _refuse(self, request: Any) -> None:
        with contextlib.suppress(OSError):
            request.settimeout(1.0)
            request.sendall(self.BUSY)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        key = self._key(request, client_address)
        with self._per_client_lock:
            if self._per_client.get(key, 0) >= self._max_per_client:
                full = True
            else:
                full = not self._slots.acquire(blocking=False)
                if not full:
                    self._per_client[key] = self._per_client.get(key, 0) + 1
                    self._keys[id(request)] = key
        if full:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def _release(self, request: Any) -> None:
        with self._per_client_lock:
            key = self._keys.pop(id(request), None)
            if key is not None:
                left = self._per_client.get(key, 1) - 1
                if left > 0:
                    self._per_client[key] = left
                else:
                    self._per_client.pop(key, None)
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)


def prepare_decisions_dir(path: str | os.PathLike[str], ranks: int) -> None:
    """Make `path` (new, or a folder without decisions) ready for a service: never a link,
    never appended to; each `decisions-rank<r>.jsonl` created here, exclusively and without
    following a link (O_EXCL | O_NOFOLLOW).

    Raises:
        ValueError: `path` is a link, not a folder, or already holds decisions (named).
    """
    d = Path(path)
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        d.mkdir(parents=True)
    else:
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"--decisions-dir {d}: is a symbolic link; give a real folder")
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"--decisions-dir {d}: exists and is not a folder")
        stale = sorted(p.name for p in d.iterdir() if p.name.startswith("decisions-rank"))
        if stale:
            raise ValueError(f"--decisions-dir {d}: already holds {stale[0]}"
                             f"{f' and {len(stale) - 1} more' if len(stale) > 1 else ''}; "
                             "decisions are never appended to: use a new or empty folder")
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    for rank in range(ranks):
        target = d / decisions_file(rank)
        try:
            os.close(os.open(target, flags, 0o644))
        except FileExistsError:
            raise ValueError(f"--decisions-dir {d}: {target.name} appeared while the "
                             "service started; use a new or empty folder") from None


def serve(cfg: ServeConfig, *, port: int = 0, failure_grace_s: float = 3.0) -> int:
    """Run the service until SIGTERM/SIGINT (exit 0), a rank failure (exit 3) or the exit of
    the process named by `RESIDENCY_PARENT_PID` (exit 3, the running request cancelled)."""
    prepare_decisions_dir(cfg.decisions_dir, cfg.ranks)
    if cfg.profile_dir:
        Path(cfg.profile_dir).mkdir(parents=True, exist_ok=True)
    rendezvous_dir = None
    if not cfg.rendezvous:  # a file store: no TCP listener for the rendezvous at all
        rendezvous_dir = tempfile.mkdtemp(prefix="residency-rdzv-")
        cfg = ServeConfig(**{**asdict(cfg), "rendezvous": f"file://{rendezvous_dir}/store"})
    try:
        return _serve(cfg, port=port, failure_grace_s=failure_grace_s)
    finally:
        if rendezvous_dir is not None:
            shutil.rmtree(rendezvous_dir, ignore_errors=True)


def _serve(cfg: ServeConfig, *, port: int, failure_grace_s: float) -> int:
    parent = watched_parent()
    if parent is not None:
        die_with_parent(signal.SIGTERM)
        if parent_gone(parent):
            print("error: the starting process is already gone", file=sys.stderr)
            return 3
    service = Service(cfg)
    try:
        httpd = _BoundedHTTPServer(("127.0.0.1", port), _handler(service))
    except OSError as exc:
        print(f"residency serve: error: cannot listen on 127.0.0.1:{port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    stop_event = threading.Event()
    exit_code = [0]

    def orphaned() -> bool:
        return parent is not None and parent_gone(parent)

    def on_signal(signum: int, frame: Any) -> None:
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    service.start()
    try:
        service.wait_ready(abort=lambda: stop_event.is_set() or orphaned())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        service.stop(grace_s=2.0)
        httpd.shutdown()
        return 3
    if stop_event.is_set() or orphaned():  # a signal during warm-up
        gone = orphaned()
        service.stop(grace_s=ORPHAN_GRACE_S if gone else 20.0)
        httpd.shutdown()
        if gone:
            remove_scratch()
        return 3 if gone else 0
    port = httpd.server_address[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    while not stop_event.wait(0.2):
        if orphaned():
            break
        if service.check_ranks():
            print(f"error: {service.failure}; stopping", file=sys.stderr, flush=True)
            exit_code[0] = 3
            time.sleep(failure_grace_s)  # /health answers 503 naming the rank meanwhile
            break
    if orphaned():
        # the process that started us is gone (killed): nobody waits for the answer
        print("error: the starting process is gone; stopping", file=sys.stderr, flush=True)
        service.cancel_current("starting process gone")
        service.stop(grace_s=ORPHAN_GRACE_S)
        httpd.shutdown()
        httpd.server_close()
        remove_scratch()  # its TMPDIR and raw profiles: the starting process cannot any more
        return 3
    # finish the current request (or give up after the grace), then stop the ranks
    if service.busy.acquire(timeout=60.0):
        service.busy.release()
    service.stop()
    httpd.shutdown()
    httpd.server_close()
    if orphaned():  # the SIGTERM was the parent's death signal: its threads die one by one,
        remove_scratch()  # so only now is it surely gone (a normal stop waits for us)
    print("stopped", flush=True)
    return exit_code[0]
