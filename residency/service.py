"""The workload service: `ranks` processes with torch.distributed behind an HTTP front end.

The front process serves HTTP on loopback and watches the ranks; rank 0 takes each request
from it and broadcasts it; every rank runs the pipeline on its own device; rank 0 gathers the
per-rank summaries and hands them back.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STOP = {"op": "stop"}
RANK_READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ServeConfig:
    """Everything a rank needs; picklable for spawned processes."""

    arm: str
    device_kind: str
    ranks: int
    markers_dir: str
    profile_dir: str | None = None
    scale: float = 1.0
    capacity_bytes: int | None = None
    resident_mib: float = 1024
    master_port: int = 0
    warmup_steps: int = 1


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- rank processes ---------------------------------------------------------------------------

def _rank_main(rank: int, cfg: ServeConfig, commands: Any, results: Any, status: Any) -> None:
    """Body of one rank process; reports `ready`/`error` on `status`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the front process coordinates shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _rank_loop(rank, cfg, commands, results, status)
    except Exception as exc:  # report, then die: the front process turns it into a 503
        status.put({"rank": rank, "event": "error", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})
        raise SystemExit(1) from exc


def _rank_loop(rank: int, cfg: ServeConfig, commands: Any, results: Any, status: Any) -> None:
    import torch
    import torch.distributed as dist

    from residency.policy import JsonlRecorder, policy_for
    from residency.profiling import RequestProfiler
    from residency.workload import Pipeline, WorkloadConfig, open_device

    torch.set_num_threads(1)
    ops = open_device(cfg.device_kind, rank, devices=cfg.ranks,
                      capacity_bytes=cfg.capacity_bytes)
    backend = {"npu": "hccl", "cuda": "nccl"}.get(cfg.device_kind, "gloo")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{cfg.master_port}",
                            rank=rank, world_size=cfg.ranks,
                            timeout=__import__("datetime").timedelta(seconds=REQUEST_TIMEOUT_S))
    jsonl = JsonlRecorder(Path(cfg.markers_dir) / f"decisions-rank{rank}.jsonl",
                          device_kind=cfg.device_kind)
    recorder = _Tee(jsonl)
    release = getattr(ops, "module", None)
    policy = policy_for(cfg.arm, ops.device, recorder=recorder, rank=rank,
                        release=None if release is None else release.empty_cache)
    pipeline = Pipeline(ops, policy, WorkloadConfig(scale=cfg.scale, resident_mib=cfg.resident_mib),
                        rank=rank, world_size=cfg.ranks)
    profiler = RequestProfiler(cfg.device_kind, rank=rank, world_size=cfg.ranks,
                               module=getattr(ops, "module", None))
    exchange_device = ops.device if backend != "gloo" else None

    def barrier() -> None:
        if backend == "gloo":  # dist.barrier() asks the (emulated) accelerator for a device
            dist.all_reduce(torch.zeros(1))
        else:
            dist.barrier()

    def exchange(t: torch.Tensor) -> torch.Tensor:
        t = t.clone() if exchange_device is None else t.to(exchange_device)
        dist.all_reduce(t)
        return t.cpu()

    def serve_one(cmd: dict[str, Any]) -> dict[str, Any]:
        jsonl.set_context(request_id=cmd["request_id"])
        profile = cfg.profile_dir is not None and cmd.get("profile", True)
        if profile:
            profiler.start(Path(cfg.profile_dir) / cmd["request_id"])
        try:
            result = pipeline.run(cmd["request_id"], steps=cmd["steps"], seed=cmd["seed"],
                                  exchange=exchange if cfg.ranks > 1 else None)
        finally:
            if profile:
                profiler.stop()
        summary = result.summary()
        summary["profiled"] = bool(profile)
        return summary

    # service warm-up: every rank runs a short request before the service reports ready
    serve_one({"request_id": "warmup-service", "steps": cfg.warmup_steps, "seed": 0,
               "profile": False})
    barrier()
    status.put({"rank": rank, "event": "ready", "pid": os.getpid()})
    while True:
        box = [None]
        if rank == 0:
            box[0] = _next_command(commands)
        dist.broadcast_object_list(box, src=0)
        cmd = box[0]
        if cmd is None or cmd.get("op") == "stop":
            break
        try:
            summary: dict[str, Any] = serve_one(cmd)
        except Exception as exc:  # the request fails on this rank; report it, keep serving
            summary = {"rank": rank, "error": f"{type(exc).__name__}: {exc}"}
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
        from residency.policy import ListRecorder

        self.jsonl, self._list = jsonl, ListRecorder()

    @property
    def decisions(self) -> list[Any]:
        return self._list.decisions

    def record(self, decision: Any) -> None:
        self._list.record(decision)
        self.jsonl.record(decision)


def _next_command(commands: Any) -> dict[str, Any]:
    parent = os.getppid()
    while True:
        try:
            return commands.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent or parent == 1:
                return dict(STOP)


# --- front process ----------------------------------------------------------------------------

class Service:
    """The front process: starts the ranks, serves HTTP, watches for dead ranks."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        ctx = mp.get_context("spawn")
        self.commands, self.results, self.status = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_rank_main, name=f"residency-rank{r}",
                                  args=(r, cfg, self.commands, self.results, self.status))
                      for r in range(cfg.ranks)]
        self.ready = False
        self.ready_ranks: set[int] = set()
        self.rank_errors: dict[int, str] = {}
        self.failure: str | None = None
        self.stopping = False
        self.busy = threading.Lock()
        self.counter = 0
        self.pids: list[int] = []

    # lifecycle
    def start(self) -> None:
        for p in self.procs:
            p.start()
        self.pids = [p.pid or 0 for p in self.procs]

    def wait_ready(self, timeout_s: float = RANK_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.ready_ranks) < self.cfg.ranks:
            if self.check_ranks():
                raise RuntimeError(self.failure)
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.cfg.ranks)) - self.ready_ranks)
                raise RuntimeError(f"ranks not ready after {timeout_s:.0f} s: {missing}")
            time.sleep(0.1)
        self.ready = True

    def check_ranks(self) -> str | None:
        """Set and return `failure` when a rank died or failed while it should be serving.

        A rank that exited without reporting an error (killed) is named first: the errors
        that other ranks then report (a broken collective) are consequences.
        """
        if self.failure or self.stopping:
            return self.failure
        while True:  # events from ranks: ready, or an error before exiting
            try:
                event = self.status.get_nowait()
            except queue.Empty:
                break
            if event["event"] == "ready":
                self.ready_ranks.add(event["rank"])
            elif event["event"] == "error":
                self.rank_errors[event["rank"]] = event["error"]
                sys.stderr.write(event.get("traceback", ""))
        exited = [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode is not None]
        silent = [(r, code) for r, code in exited if r not in self.rank_errors]
        causes = [f"rank {r} exited with code {code}" for r, code in silent]
        causes += [f"rank {r} failed: {err}" for r, err in sorted(self.rank_errors.items())]
        if causes:
            self.failure = "; ".join(causes)
            self.ready = False
        return self.failure

    def stop(self, grace_s: float = 20.0) -> None:
        self.stopping = True
        if all(p.exitcode is None for p in self.procs) and self.procs[0].is_alive():
            self.commands.put(dict(STOP))
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    # requests
    def generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        steps, seed = body.get("steps"), body.get("seed", 0)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            return 400, {"error": f"`steps` must be a positive integer, got {steps!r}"}
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            return 400, {"error": f"`seed` must be a non-negative integer, got {seed!r}"}
        if self.check_ranks():
            return 503, {"error": self.failure}
        if not self.ready or self.stopping:
            return 503, {"error": "service not ready" if not self.stopping else "stopping"}
        if not self.busy.acquire(blocking=False):
            return 429, {"error": "a request is running; one at a time"}
        try:
            self.counter += 1
            prefix = "warmup-" if body.get("warmup") else "r"
            request_id = f"{prefix}{self.counter:04d}"
            self.commands.put({"op": "generate", "request_id": request_id, "steps": steps,
                               "seed": seed, "profile": not body.get("warmup", False)})
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while True:
                if self.check_ranks():
                    return 503, {"error": self.failure, "request_id": request_id}
                if time.monotonic() > deadline:
                    return 504, {"error": "request timed out", "request_id": request_id}
                try:
                    result = self.results.get(timeout=0.2)
                    break
                except queue.Empty:
                    continue
            errors = [r for r in result["per_rank"] if "error" in r]
            payload = {"request_id": request_id, "arm": self.cfg.arm,
                       "device_kind": self.cfg.device_kind, "ranks": self.cfg.ranks,
                       "steps": steps, "seed": seed, "per_rank": result["per_rank"]}
            if errors:
                payload["error"] = "; ".join(f"rank {r['rank']}: {r['error']}" for r in errors)
                return 500, payload
            return 200, payload
        finally:
            self.busy.release()

    def health(self) -> tuple[int, dict[str, Any]]:
        failure = self.check_ranks()
        body = {"status": "ok" if self.ready and not failure else
                ("failed" if failure else "starting"),
                "ranks": self.cfg.ranks, "arm": self.cfg.arm,
                "device_kind": self.cfg.device_kind, "rank_pids": self.pids}
        if failure:
            body["error"] = failure
        return (200 if body["status"] == "ok" else 503), body


def _handler(service: Service) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write(f"[http] {self.address_string()} {fmt % args}\n")

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(*service.health())
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as exc:
                self._send(400, {"error": f"invalid JSON body: {exc}"})
                return
            self._send(*service.generate(body))

    return Handler


def serve(cfg: ServeConfig, *, port: int = 0, failure_grace_s: float = 3.0) -> int:
    """Run the service until SIGTERM/SIGINT (exit 0) or a rank failure (exit 3)."""
    Path(cfg.markers_dir).mkdir(parents=True, exist_ok=True)
    if cfg.profile_dir:
        Path(cfg.profile_dir).mkdir(parents=True, exist_ok=True)
    if not cfg.master_port:
        cfg = ServeConfig(**{**asdict(cfg), "master_port": free_port()})
    service = Service(cfg)
    try:
        httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(service))
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    httpd.daemon_threads = True
    stop_event = threading.Event()
    exit_code = [0]

    def on_signal(signum: int, frame: Any) -> None:
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    service.start()
    try:
        service.wait_ready()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        service.stop(grace_s=2.0)
        httpd.shutdown()
        return 3
    if stop_event.is_set():  # a signal during warm-up
        service.stop()
        httpd.shutdown()
        return 0
    port = httpd.server_address[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    while not stop_event.wait(0.2):
        if service.check_ranks():
            print(f"error: {service.failure}; stopping", file=sys.stderr, flush=True)
            exit_code[0] = 3
            time.sleep(failure_grace_s)  # /health answers 503 naming the rank meanwhile
            break
    # finish the current request (or give up after the grace), then stop the ranks
    if service.busy.acquire(timeout=60.0):
        service.busy.release()
    service.stop()
    httpd.shutdown()
    httpd.server_close()
    print("stopped", flush=True)
    return exit_code[0]


# --- CLI --------------------------------------------------------------------------------------

def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `serve`."""
    p = subparsers.add_parser("serve", help="run the multi-rank workload service on loopback")
    p.add_argument("--arm", required=True, choices=["candidate", "baseline", "always-release"])
    p.add_argument("--device", default="auto", help="auto|npu|cuda|emulated-npu")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--markers", required=True, metavar="DIR", help="decisions JSONL directory")
    p.add_argument("--profile", metavar="DIR", help="write one trace per rank per request")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--capacity", type=int, metavar="BYTES",
                   help="emulated NPU capacity per device (default 4 GiB)")
    p.add_argument("--resident-mib", type=float, default=1024,
                   help="resident DiT footprint in MiB at scale 1 (default 1024)")


def run_cli(args: argparse.Namespace) -> int:
    """Run `serve`."""
    from residency.emulated import resolve_device

    if args.ranks <= 0:
        print(f"error: --ranks must be positive, got {args.ranks}", file=sys.stderr)
        return 2
    if args.scale <= 0:
        print(f"error: --scale must be positive, got {args.scale}", file=sys.stderr)
        return 2
    try:
        kind = resolve_device(args.device)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.capacity is not None and kind != "emulated-npu":
        print("error: --capacity applies to the emulated NPU only", file=sys.stderr)
        return 2
    cfg = ServeConfig(arm=args.arm, device_kind=kind, ranks=args.ranks,
                      markers_dir=args.markers, profile_dir=args.profile, scale=args.scale,
                      capacity_bytes=args.capacity, resident_mib=args.resident_mib)
    return serve(cfg, port=args.port)
