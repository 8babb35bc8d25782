"""The service's rank processes: each opens its device, joins torch.distributed, runs the
pipeline for every request the front process queues and reports `ready`/`error` on `status`;
rank 0 gathers the per-rank summaries and hands them back."""

from __future__ import annotations

import datetime
import os
import queue
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from residency.processes import die_with_parent, parent_gone
from residency.records.decisions import decisions_file
from residency.workload import profiling
from residency.workload.config import ServeConfig, log

STOP = {"op": "stop"}
COLLECTIVE_TIMEOUT_S = 1800.0   # torch.distributed timeout; collectives run only in a request


def _loopback_ifname() -> str:
    return "lo0" if sys.platform == "darwin" else "lo"


class RequestCancelled(Exception):
    """Raised on every rank at the step boundary where a cancelled request stops."""


def rank_main(rank: int, cfg: ServeConfig, commands: Any, results: Any, status: Any,
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
        log(f"arm {cfg.arm}: generic torch.accelerator telemetry failure injected "
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
