"""`residency` command line: the one wiring point.

`create_parser()` builds every subcommand's parser (argparse only: nothing else is imported
to start), each `cmd_*` handler imports its concern lazily, `COMMANDS` dispatches, and every
error leaves the same way (`main`):

* bad input (a `ValueError` such as `RunDirError`, `TraceError`, `WhatIfError`, or an
  `OSError`): one line `residency <cmd>: error: ...` on stderr, exit 2, no traceback;
* a failed gate or verification, or a run that could not finish: exit 1;
* interrupted (Ctrl-C, SIGTERM to `pair`): exit 130;
* stdout's reader gone (`residency idle ... | head -3`): no message, exit 141 (as a process
  ended by SIGPIPE). An option's error names it as typed (``--window-marker``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from residency.errors import BadInput, RunFailed

__all__ = ["COMMANDS", "CommandFailed", "console_main", "create_parser", "main"]


class CommandFailed(RunFailed):
    """A command that ran but failed (not bad input): exit 1 with its message."""


# ----------------------------------------------------------------------------- parsers
# Upper bounds of the counts the commands take (README: Command line), each with its reason:
MAX_RANKS = 64  # each rank a process of ~230 MB (64: ~15 GB); 8x the published 8-device host
MAX_PAIRS = 1000  # each pair two service runs: ~52 days at the published ~2,250 s a request
MAX_REQUESTS = 1000  # measured requests per service run (every one recorded in the run)
MAX_STEPS = 10_000  # what the built-in service accepts (residency.protocol.MAX_STEPS)
MAX_WORKERS = 256  # worker processes, each holding a rank's parse (~350 MB for 110k tasks)
MAX_CAPACITY_BYTES = 1 << 50  # 1 PiB: ~5,000x the largest device today; exact as a float
MAX_SEED = 2**53 - 1  # exact in every JSON client (residency.protocol.MAX_SEED)


class _Parser(argparse.ArgumentParser):
    """argparse's parser under the house error policy: a bad option or value is one line,
    ``residency <cmd>: error: ...``, exit 2 (no usage block; ``--help`` shows it)."""

    def error(self, message: str) -> Any:  # (NoReturn: exits)
        if "expected one argument" in message:  # `--free -1:1:0.1`: the value read as option
            message += (" (a value that starts with '-' is written with '=': "
                        f"{message.split()[1].rstrip(':')}=VALUE)")
        self.exit(2, _terminal(f"{self.prog}: error: {message}") + "\n")


def _count(name: str, high: int, why: str, *, low: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high` (`why`: the bound's reason)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {low} to {high:,} ({why}), not {text!r}")
        return value

    parse.__name__ = name
    return parse


_RANKS = _count("ranks", MAX_RANKS, "each rank is a process of about 230 MB")
_STEPS = _count("steps", MAX_STEPS, "the most the built-in service accepts")
_SEED = _count("seed", MAX_SEED, "exact in JSON", low=0)
_CAPACITY = _count("capacity", MAX_CAPACITY_BYTES,
                   "1 PiB, about 5,000x the largest device memory today")
_RANKS_HELP = f"at most {MAX_RANKS}: each rank is a process of about 230 MB"

# Copies of two owners' names, kept here because importing the owners loads numpy and pandas
# (the parser is built with argparse only); tests/project/test_architecture.py checks they agree.
BUSY_CHOICES = ("default", "ascend", "msprof", "kineto", "all")  # traces.busy.DEFINITIONS
WHATIF_POLICIES = ("bounded", "learned-budget")  # analysis.whatif.POLICIES, default first


def _device_help(*extra: str) -> str:
    """`--device`'s help: the device specs the registry (`residency.devices`) accepts."""
    from residency.devices import SPECS

    return "|".join((*SPECS, *extra))


def _probe(p: argparse.ArgumentParser) -> None:
    from residency.devicemodel import ACCELERATOR_PATCHES

    p.add_argument("--device", default="auto",
                   help=f"{_device_help('cpu')} (default: auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--accelerator-patch", choices=ACCELERATOR_PATCHES, default="none",
                   help="vllm-ascend: first apply vllm-ascend's torch.accelerator redirection "
                   "(the emulated one on emulated-npu, the installed vllm_ascend's on npu, "
                   "with --inject-failure over the injected failure on cuda)")
    _inject_argument(p)


def _inject_argument(p: argparse.ArgumentParser) -> None:
    from residency.devices import INJECTIONS

    p.add_argument("--inject-failure", choices=INJECTIONS, default="none",
                   help="generic-telemetry: on cuda, make the baseline arm's generic "
                   "torch.accelerator memory queries raise as torch-npu <= 2.12 does "
                   "('Allocator for cuda is not a DeviceAllocator'); the candidate is "
                   "untouched; with --accelerator-patch vllm-ascend, reserved answers and "
                   "allocated raises. Refused on npu and emulated-npu (real or already failing)")


def _scale_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", type=_scale, default=1.0, metavar="S|auto",
                   help="component sizes x S (default 1); auto: sized from the device's "
                   "capacity so that the service holds --fill of it (see README)")
    p.add_argument("--fill", type=float, default=None, metavar="FRACTION",
                   help="with --scale auto: the share of capacity held at the peak "
                   "(default 0.85, at most 0.90)")


def _scale(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'auto', not {text!r}") from None


def _serve(p: argparse.ArgumentParser) -> None:
    from residency.policy.cache import ARMS

    p.add_argument("--arm", required=True, choices=ARMS)
    p.add_argument("--device", default="auto", help=_device_help())
    p.add_argument("--ranks", type=_RANKS, default=2, help=f"(default 2; {_RANKS_HELP})")
    p.add_argument("--port", type=_count("port", 65535, "a TCP port", low=0), default=0,
                   help="0 picks a free port")
    p.add_argument("--decisions-dir", dest="decisions_dir", metavar="DIR",
                   help="directory of the decisions JSONL files (one per rank)")
    p.add_argument("--profile", metavar="DIR", help="write one trace per rank per request")
    _scale_arguments(p)
    p.add_argument("--capacity", type=_CAPACITY, metavar="BYTES",
                   help="emulated NPU capacity per device (default 4 GiB; at most 1 PiB)")
    p.add_argument("--resident-mib", type=float, default=1024,
                   help="resident DiT footprint in MiB at scale 1 (default 1024)")
    p.add_argument("--resident-on-device", action="store_true",
                   help="make the resident footprint on the device instead of uploading it "
                   "(what --scale auto does)")
    _inject_argument(p)
    p.add_argument("--request-timeout", type=float, default=3600.0, metavar="S",
                   help="answer 504 and cancel a request still running after S seconds "
                        "(default 3600)")
    p.add_argument("--require-exclusive", action="store_true",
                   help="refuse to measure while a process other than this run's holds a "
                   "device (nvidia-smi/NVML, npu-smi; $RESIDENCY_DEVICE_PROCESSES: a stand-in "
                   "listing): exit 2, before the ranks start")
    from residency.devicemodel import add_model_arguments

    add_model_arguments(p)


def _pair(p: argparse.ArgumentParser) -> None:
    from residency.policy.cache import CANDIDATE, PAIRED_ARMS
    from residency.rundir.layout import DESIGNS

    p.add_argument("--design", choices=DESIGNS, default="profiled-pair",
                   help="aa: the same arm (--aa-arm) in both slots, ABBA order: E2E noise")
    pairs_bound = f"at most {MAX_PAIRS:,}: each pair is two service runs"
    p.add_argument("--pairs", type=_count("pairs", MAX_PAIRS, "each pair is two service runs"),
                   default=None, help="alternating pairs (ABBA order; default 10 as the "
                   f"paired-profile notebook, 1 for profiled-pair; {pairs_bound})")
    p.add_argument("--requests", type=_count("requests", MAX_REQUESTS, "each one is run and "
                                             "recorded"), default=None,
                   help="measured requests per unprofiled service run after its warm-up "
                   "(the run's E2E is their median; every one is recorded; default 5 as the "
                   f"notebook, 1 for profiled-pair; at most {MAX_REQUESTS:,})")
    p.add_argument("--max-pairs", metavar="N",
                   type=_count("max-pairs", MAX_PAIRS, "each pair is two service runs"),
                   help="with --stop-when-decided: the most unprofiled pairs (default --pairs; "
                   f"{pairs_bound})")
    p.add_argument("--stop-when-decided", action="store_true",
                   help="paired-profile: add pairs until E2E is decided (difference or "
                   "equivalence) under a sequential rule fixed before the first pair "
                   "(README: Stop when decided), or --max-pairs is reached")
    p.add_argument("--aa-arm", choices=PAIRED_ARMS, default=CANDIDATE,
                   help="the arm of both slots of --design aa")
    p.add_argument("--device", default="auto", help=_device_help())
    p.add_argument("--ranks", type=_RANKS, default=2, help=f"(default 2; {_RANKS_HELP})")
    p.add_argument("--steps", type=_STEPS, default=50,
                   help=f"(default 50; at most {MAX_STEPS:,}, what the service accepts)")
    p.add_argument("--seed", type=_SEED, default=2101)
    _scale_arguments(p)
    p.add_argument("--capacity", type=_CAPACITY, metavar="BYTES", help="at most 1 PiB")
    p.add_argument("--resident-mib", type=float, default=1024)
    _inject_argument(p)
    p.add_argument("--service", metavar="FILE", help="external service TOML file")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--require-exclusive", action="store_true",
                   help="refuse to measure while a process other than this run's holds a "
                   "device (nvidia-smi/NVML, npu-smi; $RESIDENCY_DEVICE_PROCESSES: a stand-in "
                   "listing): exit 2 before anything runs, 1 when seen during the run")
    from residency.devicemodel import add_model_arguments

    add_model_arguments(p)


def _idle(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH",
                   help="a trace file, a folder of one format's rank traces (any layout: rank<N>/, "
                   "*_ascend_pt/, ASCEND_PROFILER_OUTPUT/, ...), or a run directory with trace/")
    p.add_argument("--marker", metavar="REGEX", help="host ranges to attribute, e.g. "
                   r"'residency\.release\[normal\]'")
    p.add_argument("--window-marker", metavar="REGEX",
                   help="window = union of matching host ranges (default: busy-task span)")
    p.add_argument("--busy", metavar="DEF", default="default",
                   choices=BUSY_CHOICES,
                   help="which device tasks count as work: default (ascend for torch-npu: "
                   "compute, memory copies, communication; kineto: kernels, memcpy, memset), "
                   "msprof (compute + communication, as msprof-analyze), all")
    p.add_argument("--session", metavar="WHICH",
                   help="torch-npu: the profiling session when a rank has several: latest, N "
                   "(0 = earliest) or an ISO time prefix of its start")
    p.add_argument("--group", metavar="NAME",
                   help="vLLM-Omni: the process group (diffusion, stage0, ...) when several")
    p.add_argument("--by-cause", action="store_true",
                   help="also attribute all-rank idle time to the innermost host range")
    p.add_argument("--allow-no-device-tasks", action="store_true",
                   help="report a trace with no recognised device task (host activity only) "
                   "as 100 %% idle instead of refusing it (window: what the ranks recorded, "
                   "unless --window-marker)")
    p.add_argument("--json", action="store_true", help="print one JSON object (with "
                   "`warnings`, the messages also printed on stderr)")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the user's trace cache (also: "
                   "RESIDENCY_NO_CACHE=1); nothing is ever written beside the traces")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="parse and reduce each rank as a task of a Dask cluster: 'local' (a "
                   "LocalCluster here) or a scheduler address, e.g. tcp://host:8786 (default: "
                   "$DASK_SCHEDULER_ADDRESS, else worker processes here); needs "
                   "pip install 'residency[cluster]' and the traces at the same path on "
                   "every worker")
    p.add_argument("--workers", metavar="N",
                   type=_count("workers", MAX_WORKERS, "each is a process holding a rank's "
                               "parse"),
                   help="worker processes (here, or of --scheduler local); default: one per "
                   f"CPU; at most {MAX_WORKERS}: each is a process holding a rank's parse")
    p.add_argument("--no-verify", action="store_true",
                   help="PATH inside a recorded run (RUN/runs/01-candidate): read it without "
                   "checking the run's seal (a warning says so); by default the enclosing "
                   "run is verified as `residency verify` does and refused on any finding")


def _run_reading(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-incomplete", action="store_true",
                   help="read a run whose manifest status is not 'complete'")
    p.add_argument("--no-verify", action="store_true",
                   help="read a run whose files differ from its recorded sha256")


def _tables(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="*", metavar="RUN_DIR",
                   help="run directory; several: one cross-device table, a column per run "
                   "(with --published, the published NPU column too)")
    p.add_argument("--format", choices=("md", "csv", "json", "pr"), default="md",
                   help="md, csv or json tables; pr: the pull request's \"Test Result\" "
                   "block (one bullet per attribution with both arms, change, n and verdict; "
                   "device kind and run digest), regenerated rather than retyped")
    p.add_argument("--published", action="store_true",
                   help="also print the published NPU figures in the same format")
    p.add_argument("--aa", metavar="AA_RUN_DIR",
                   help="an A/A run (`pair --design aa`, same device kind): adds its E2E "
                   "noise row and reads the unprofiled E2E delta against it")
    _run_reading(p)


def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="NOTEBOOK_OR_DIR")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="folder for the HTML files (default: reports/)")
    p.add_argument("--screenshot", action="store_true",
                   help="also save a full-page PNG of each report (needs Chromium)")


def _verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--digest", metavar="sha256:HEX",
                   help="also check the run against this digest, as quoted in the pull "
                   "request or the evidence table's footer")


def _whatif(p: argparse.ArgumentParser) -> None:
    from residency.policy.cache import CANDIDATE

    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory")
    p.add_argument("--cached", default="0.05:0.5:0.05", metavar="START:STOP:STEP",
                   help="max_cached_fraction grid, inclusive (default: 0.05:0.5:0.05)")
    p.add_argument("--free", default="0.01:0.2:0.01", metavar="START:STOP:STEP",
                   help="min_free_fraction grid, inclusive (default: 0.01:0.2:0.01)")
    p.add_argument("--policy", choices=WHATIF_POLICIES, default=WHATIF_POLICIES[0])
    p.add_argument("--arm", default=CANDIDATE, help="arm whose decisions are replayed")
    p.add_argument("--format", choices=("md", "csv", "json"), default="md")
    _run_reading(p)


def _selftest(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=f"{_device_help()} (default: auto)")
    p.add_argument("--ranks", type=_RANKS, default=None, metavar="N",
                   help=f"service ranks (default: all devices, at most 2; {_RANKS_HELP})")
    p.add_argument("--out", metavar="DIR", help="keep everything the steps write here "
                   "(a new or empty folder; default: a temporary folder, removed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _inject_argument(p)


# ----------------------------------------------------------------------------- handlers
def _resolve(spec: str) -> str:
    from residency import devices

    try:
        return devices.resolve(spec)
    except RuntimeError as exc:  # an explicit device that is not usable here: bad input
        raise ValueError(str(exc)) from None


def cmd_probe(args: argparse.Namespace) -> int:
    """`probe`: each query path's value or exception on the device."""
    import platform

    kind = "cpu" if args.device == "cpu" else _resolve(args.device)
    import torch

    from residency import devices
    from residency.workload.probe import probe_queries, setup_probe

    devices.check_injection(kind, args.inject_failure)  # ValueError saying why not
    injected = None
    if args.inject_failure != "none":  # cuda: the failure, then the patch over it
        from residency.workload.inject import inject_generic_telemetry_failure

        patch_info = setup_probe(kind, "none")
        injected = inject_generic_telemetry_failure(devices.info(kind).torch_type,
                                                    args.accelerator_patch)
        patch_info.update(accelerator_patch=args.accelerator_patch, patch_source=(
            "residency.emulated.patches over the injected failure"
            if args.accelerator_patch != "none" else None))
    else:
        patch_info = setup_probe(kind, args.accelerator_patch)  # ValueError: bad input
    device = {"cpu": "cpu", "cuda": "cuda:0"}.get(kind, "npu:0")
    result = {"device_kind": kind, "device_label": devices.label(kind, args.inject_failure),
              "python": platform.python_version(), "torch": torch.__version__,
              "inject_failure": injected, **patch_info, **probe_queries(device)}
    try:
        import torch_npu  # type: ignore[import-not-found]

        result["torch_npu"] = torch_npu.__version__
    except ImportError:
        result["torch_npu"] = None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    where = f"{kind}: {result['device_label']}" if injected else kind
    print(f"device {result['device']} ({where}); torch {result['torch']}, "
          f"torch-npu {result['torch_npu']}, vllm-ascend {result['vllm_ascend']}")
    if result["patch_source"]:
        print(f"accelerator patch: {result['accelerator_patch']}, applied by "
              f"{result['patch_source']}")
    for source in ("generic", "registered"):
        for query, out in result[source].items():
            path = f"  <- {out['path']}" if out.get("path") else ""
            print(f"  {source:<10} {query:<15} {_fmt_outcome(out)}{path}")
    print(f"  {'registered':<10} {'mem_get_info':<15} {_fmt_outcome(result['mem_get_info'])}")
    for arm, info in result["arms"].items():
        src = info["telemetry"] or "none (releases on every call)"
        state = "n/a" if info["telemetry"] is None else (
            "ok" if info["error"] is None else f"unavailable -> releases ({info['error']})")
        print(f"  arm {arm:<15} telemetry {src}: {state}")
    print(f"verdict: {result['verdict']}")
    return 0


def _fmt_outcome(outcome: dict) -> str:
    if outcome["ok"]:
        return f"ok  {outcome['value']}"
    return f"ERR {outcome['error_type']}: {outcome['error']}"


def cmd_serve(args: argparse.Namespace) -> int:
    """`serve`: the multi-rank workload service until SIGTERM."""
    if args.decisions_dir is None:
        raise ValueError("the following argument is required: --decisions-dir DIR")
    import math

    if args.ranks <= 0:
        raise ValueError(f"--ranks must be positive, got {args.ranks}")
    for option, value in (("--scale", 1.0 if args.scale == "auto" else args.scale),
                          ("--resident-mib", args.resident_mib),
                          ("--request-timeout", args.request_timeout)):
        if not math.isfinite(value) or value <= 0:  # nan passes `<= 0`
            raise ValueError(f"{option} must be a positive finite number, got {value}")
    if args.capacity is not None and args.capacity <= 0:
        raise ValueError(f"--capacity must be positive, got {args.capacity}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    from residency import devices

    kind = _resolve(args.device)
    if args.capacity is not None and not devices.emulated(kind):
        raise ValueError("--capacity applies to the emulated NPU only")
    import os

    from residency.devicemodel import ENV_VAR, DeviceModel, model_changed, model_from_args

    devices.check_injection(kind, args.inject_failure)  # ValueError saying why not
    # with an injected failure, --accelerator-patch is applied over it (not an emulator option)
    patch_only = model_from_args(args) == DeviceModel(accelerator_patch=args.accelerator_patch)
    injected_patch = args.inject_failure != "none" and patch_only
    # the ranks (spawned processes) read the emulated NPU's model from the environment
    if model_changed(args) and not devices.emulated(kind) and not injected_patch:
        raise ValueError("the emulated NPU's model options apply to emulated-npu only "
                         "(--accelerator-patch also with --inject-failure on cuda)")
    if devices.emulated(kind) and (model_changed(args) or ENV_VAR not in os.environ):
        os.environ[ENV_VAR] = model_from_args(args).to_env()
    DeviceModel.from_env()  # a malformed inherited value fails here, not in every rank
    if args.require_exclusive:  # before the ranks start: any device process is foreign
        from residency.rundir import neighbours

        try:
            neighbours.exclusive(neighbours.lister_for(kind), {os.getpid()})
        except neighbours.NotExclusive as exc:
            raise ValueError(f"device {kind}: {exc}") from None
    from residency.workload.config import ServeConfig
    from residency.workload.service import serve

    scale, resident_mib, on_device = args.scale, args.resident_mib, args.resident_on_device
    if args.fill is not None and scale != "auto":
        raise ValueError("--fill applies with --scale auto only")
    if scale == "auto":
        from residency import protocol as sizing

        try:
            sized = sizing.auto_size(
                sizing.device_total_bytes(kind, capacity_bytes=args.capacity),
                fill=sizing.AUTO_FILL if args.fill is None else args.fill)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None
        scale, resident_mib, on_device = sized.scale, sized.resident_mib, True
        print(f"--scale auto: {sized.to_params()}", file=sys.stderr, flush=True)
    cfg = ServeConfig(arm=args.arm, device_kind=kind, ranks=args.ranks,
                      decisions_dir=args.decisions_dir, profile_dir=args.profile,
                      scale=scale, capacity_bytes=args.capacity,
                      resident_mib=resident_mib, request_timeout_s=args.request_timeout,
                      inject_failure=args.inject_failure,
                      accelerator_patch=args.accelerator_patch if injected_patch else "none",
                      resident_on_device=on_device)
    return serve(cfg, port=args.port)


def cmd_pair(args: argparse.Namespace) -> int:
    """`pair`: a paired design into a new run directory."""
    import signal

    from residency.devicemodel import model_from_args
    from residency.experiments.designs import run_pair
    from residency.experiments.errors import ExperimentError
    from residency.processes import raise_terminated

    emulator = model_from_args(args)  # ValueError naming the option: bad input
    from residency.analysis.planning import design_statement

    pairs, requests, rule = pair_design(args)

    def announce() -> None:  # which design runs and what it can decide, before it starts
        if not args.no_progress:
            print(design_statement(args.design, pairs, requests)
                  + ("" if rule is None else " " + rule.describe()), file=sys.stderr)
    signal.signal(signal.SIGTERM, raise_terminated)  # recorded as SIGTERM, exit 130
    try:
        out = run_pair(args.design, out=args.out, device=args.device, ranks=args.ranks,
                       steps=args.steps, seed=args.seed, pairs=pairs,
                       requests=requests, scale=args.scale,
                       capacity_bytes=args.capacity, resident_mib=args.resident_mib,
                       service_file=args.service, progress=not args.no_progress,
                       emulator=emulator, aa_arm=args.aa_arm, fill=args.fill,
                       inject_failure=args.inject_failure, sequential=rule,
                       on_start=announce, require_exclusive=args.require_exclusive)
    except ExperimentError as exc:
        if isinstance(exc, ValueError):  # the output directory or service file: bad input
            raise
        raise CommandFailed(str(exc)) from None
    except RuntimeError as exc:  # an explicit device that is not usable here: bad input
        raise ValueError(str(exc)) from None
    from residency.records.seal import SEAL_FIELD
    from residency.rundir.run import load_run

    run = load_run(out)
    digest = (run.manifest.get(SEAL_FIELD) or {}).get("digest")
    print(f"run complete: {out}")
    if digest:
        print(f"digest: {digest} (quote it in the pull request; check a copy with "
              f"`residency verify RUN_DIR --digest {digest}`)")
    seq = run.manifest.get("sequential") or {}
    if "stopped_after" in seq:
        from residency.analysis.sequential import stop_sentence

        print(stop_sentence(seq))
    if args.design == "aa":
        from residency.evidence import build

        noise = build(run, traces=False, keys=("e2e_aa",)).get("e2e_aa")
        if noise is not None:
            print(f"{noise.note} Use it with `residency tables RUN_DIR --aa {out}`.")
    return 0


def pair_design(args: argparse.Namespace) -> tuple[int, int, Any]:
    """`pair`'s pairs, requests and sequential rule: the notebook's 10 x 5 where the design
    has pairs, 1 x 1 for profiled-pair; --stop-when-decided runs up to --max-pairs."""
    from residency.rundir.layout import PAIRED_DEFAULTS

    single = args.design in ("profiled-pair", "consecutive")
    pairs = args.pairs if args.pairs is not None else 1 if single else PAIRED_DEFAULTS[0]
    requests = (args.requests if args.requests is not None else
                1 if args.design == "profiled-pair" else PAIRED_DEFAULTS[1])
    if args.max_pairs is not None and not args.stop_when_decided:
        raise ValueError("--max-pairs goes with --stop-when-decided")
    if not args.stop_when_decided:
        return pairs, requests, None
    if args.design != "paired-profile":
        raise ValueError(f"--stop-when-decided needs --design paired-profile, not "
                         f"{args.design}")
    from residency.analysis.sequential import SequentialRule

    pairs = args.max_pairs if args.max_pairs is not None else pairs
    if pairs < 6:
        raise ValueError(f"--max-pairs must be at least 6 (the fewest pairs whose exact test "
                         f"can reach p < 0.05), got {pairs}")
    return pairs, requests, SequentialRule.default(pairs)


def _plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pilot", metavar="RUN_DIR", help="read costs (and noise, unless --aa or "
                   "--cv) from a recorded run")
    p.add_argument("--published", action="store_true",
                   help="costs of the published NPU figures (2,248.8 s per request, a warm-up "
                   "request per start, the start 5 min unless --start-s)")
    p.add_argument("--aa", metavar="RUN_DIR", help="read the noise from an A/A run")
    for name, what in (("request-s", "one measured request"), ("start-s", "one service start "
                       "(spawn to healthy)"), ("warmup-s", "the warm-up request per start"),
                       ("other-s", "the rest of a run (stop, profiler control)")):
        p.add_argument(f"--{name}", type=float, metavar="S", help=f"seconds of {what} "
                       "(typed: replaces the pilot's)")
    p.add_argument("--cv", type=float, metavar="FRACTION",
                   help="stated CV of a run's E2E between service runs (e.g. 0.01)")
    p.add_argument("--request-cv", type=float, metavar="FRACTION",
                   help="stated CV between the requests of one run")
    p.add_argument("--effect", type=float, metavar="S", help="effect of interest in seconds "
                   "(default: the published -0.19 %% E2E change of the request time)")
    p.add_argument("--effect-percent", type=float, metavar="P",
                   help="effect of interest as a percentage of the request time")
    p.add_argument("--pairs", type=_int_list(MAX_PAIRS), default="3,4,6,8,10,15,20,30,40",
                   metavar="LIST", help="candidate unprofiled pairs (default 3,4,6,8,10,15,"
                   f"20,30,40; each at most {MAX_PAIRS:,}, as pair --pairs)")
    p.add_argument("--requests", type=_int_list(MAX_REQUESTS), default="1,3,5", metavar="LIST",
                   help="candidate measured requests per run (default 1,3,5; each at most "
                   f"{MAX_REQUESTS:,})")
    p.add_argument("--budget-hours", type=float, metavar="H", help="device-time budget")
    p.add_argument("--power", type=float, default=0.8, help="target power (default 0.8)")
    p.add_argument("--simulations", type=int, default=2000, metavar="N",
                   help="Monte Carlo sequences per design (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _int_list(high: int) -> Callable[[str], list[int]]:
    """An argparse type: integers separated by commas, none above `high`."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be integers separated by commas, not "
                                             f"{text!r}") from None
        if any(v > high for v in values):
            raise argparse.ArgumentTypeError(f"each value must be at most {high:,} (as the "
                                             f"runs the pair command makes), not {text!r}")
        return values

    parse.__name__ = "int_list"
    return parse


def cmd_plan(args: argparse.Namespace) -> int:
    """`plan`: device time, power and smallest detectable effect of candidate designs."""
    from residency.analysis.planning import make_plan

    plan = make_plan(pilot=args.pilot, aa=args.aa, published=args.published,
                     request_s=args.request_s, start_s=args.start_s, warmup_s=args.warmup_s,
                     other_s=args.other_s, cv=args.cv, request_cv=args.request_cv,
                     effect_s=args.effect, effect_percent=args.effect_percent,
                     pairs=args.pairs, requests=args.requests, budget_hours=args.budget_hours,
                     power=args.power, simulations=args.simulations, seed=args.seed)
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print("\n".join(plan.lines()))
    return 0


def cmd_idle(args: argparse.Namespace) -> int:
    """`idle`: all-rank no-device-task time and marker attribution of a trace directory."""
    from residency.analysis.idle import idle_summary, idle_summary_at
    from residency.reports.idletext import format_summary
    from residency.traces.load import TraceNote, load_traces

    causes = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scheduler = args.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
            if args.by_cause and args.scheduler:
                raise ValueError("--by-cause reads every rank's timeline in this process; "
                                 "drop --scheduler")
            seal = _enclosing_seal(args.path, verify=not args.no_verify)
            if seal is not None and args.scheduler:
                raise ValueError(f"{args.path} lies in the sealed run {seal.root}, whose files "
                                 "are checked as this process reads them: drop --scheduler "
                                 "(or pass --no-verify)")
            if not args.by_cause and seal is None:  # rank by rank: only each rank's
                # reduction comes back
                summary = idle_summary_at(
                    args.path, marker=args.marker, window_marker=args.window_marker,
                    busy=args.busy, session=args.session, group=args.group,
                    cache=not args.no_cache, scheduler=scheduler, workers=args.workers,
                    allow_no_device_tasks=args.allow_no_device_tasks)
            else:
                traces = load_traces(args.path, cache=not args.no_cache, session=args.session,
                                     group=args.group, workers=args.workers, seal=seal)
                summary = idle_summary(traces, marker=args.marker,
                                       window_marker=args.window_marker, busy=args.busy,
                                       allow_no_device_tasks=args.allow_no_device_tasks)
            if args.marker is not None and not any(r.markers for r in summary.per_rank):
                warnings.warn(f"--marker {args.marker!r} matches no host range in the window "
                              "of any rank: its time and its intersection with idle time "
                              "are 0", UserWarning, stacklevel=1)
            if args.by_cause:
                from residency.analysis.causes import idle_by_cause

                causes = idle_by_cause(traces, busy=args.busy, window_marker=args.window_marker)
        finally:
            for w in caught:
                kind = "note" if issubclass(w.category, TraceNote) else "warning"
                print(_terminal(f"residency idle: {kind}: {w.message}"), file=sys.stderr)
    if args.json:
        out = summary.to_dict()
        out["warnings"] = [str(w.message) for w in caught]
        if causes is not None:
            out["idle_by_cause"] = causes.to_dict(orient="records")
        print(json.dumps(out))
        return 0
    lines = format_summary(summary)
    if causes is not None:
        from residency.analysis.causes import format_causes

        lines += ["", *format_causes(causes)]
    print("\n".join(map(_terminal, lines)))  # names from the traces: never raw, one line each
    return 0


def _enclosing_seal(path: str, *, verify: bool) -> Any:
    """The seal (`residency.traces.files.Sealed`) of the run `path` lies in, after verifying
    the run as `verify` does; None outside a run, for a run without a seal, or without
    `verify` (both said in a warning).

    Raises:
        RunDirError: the enclosing run fails verification (a file missing, changed or added,
            an edited manifest) or cannot be read.
    """
    from residency.rundir.layout import enclosing_run

    root = enclosing_run(path)
    if root is None:
        return None
    from residency.rundir.run import load_run  # (pandas: only for a run's folder)
    from residency.traces.files import Sealed

    if not verify:
        warnings.warn(f"{path} lies in the run {root}, NOT checked against its seal "
                      "(--no-verify): its figures may come from changed files", UserWarning,
                      stacklevel=2)
        return None
    run = load_run(root, allow_incomplete=True)
    sealed = run.sealed_artifacts
    if sealed is None:
        warnings.warn(f"{path} lies in the run {root}, which has no seal (status "
                      f"{run.manifest.get('status')!r}, or recorded without a sha256 list): "
                      "read unverified", UserWarning, stacklevel=2)
        return None
    return Sealed(run.path, sealed)


def _tables_pr(args: argparse.Namespace) -> int:
    """`tables RUN_DIR --format pr`: the pull request's Test Result block of one run."""
    from residency import evidence
    from residency.reports import summary
    from residency.rundir.run import load_run

    if not args.run_dir:
        raise ValueError("--format pr needs RUN_DIR (the Test Result block of a run)")
    if len(args.run_dir) > 1:
        raise ValueError("--format pr takes one RUN_DIR (the Test Result block of a run); "
                         "several runs make the cross-device table (md, csv or json)")
    run = load_run(args.run_dir[0], allow_incomplete=args.allow_incomplete,
                   verify=not args.no_verify)
    extra = {} if args.aa is None else {"aa": load_run(
        args.aa, allow_incomplete=args.allow_incomplete, verify=not args.no_verify)}
    ev = evidence.build(run, **extra)
    block = summary.pr_markdown(summary.summarize(ev, manifest=run.manifest),
                                run_dir=str(args.run_dir[0]))
    sys.stdout.write(block)
    return 0


def _tables_cross_device(args: argparse.Namespace) -> int:
    """`tables RUN RUN ... [--published]`: runs of different devices in one table."""
    from residency.evidence.crossdevice import cross_device
    from residency.reports import cross_device as view
    from residency.reports import tables
    from residency.rundir.run import load_run

    if args.aa is not None:
        raise ValueError("--aa applies to the evidence table of one RUN_DIR, not to the "
                         "cross-device table of several")
    runs = [load_run(d, allow_incomplete=args.allow_incomplete, verify=not args.no_verify)
            for d in args.run_dir]
    table = view.cross_device_table(cross_device(runs, published=args.published))
    text = view.to_json(table) if args.format == "json" else tables.render([table], args.format)
    sys.stdout.write(text.rstrip("\n") + "\n")
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    """`tables`: the evidence table of a run and/or the published figures."""
    from residency.reports import tables
    from residency.rundir.run import load_run

    if not args.run_dir and not args.published:
        raise ValueError("give RUN_DIR, --published, or both")
    if args.format == "pr":
        return _tables_pr(args)
    if len(args.run_dir) > 1:
        return _tables_cross_device(args)
    out = []
    if args.run_dir:
        run = load_run(args.run_dir[0], allow_incomplete=args.allow_incomplete,
                       verify=not args.no_verify)
        aa = None if args.aa is None else load_run(
            args.aa, allow_incomplete=args.allow_incomplete, verify=not args.no_verify)
        out.append(tables.evidence_table(run, aa=aa))
    if args.published:
        out.append(tables.published_table())
    sys.stdout.write(tables.render(out, args.format).rstrip("\n") + "\n")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """`report`: executed notebooks to HTML (and PNG), each rendered that can be; exit 2 if
    a notebook was unusable (unreadable, never executed), else 1 if a render or screenshot
    failed."""
    from residency.reports import html as reports

    notebooks = reports.find_notebooks(args.paths)  # (paths that hold none: exit 2)
    failed = unusable = 0
    for nb, name in zip(notebooks, reports.output_names(notebooks), strict=True):
        try:
            html = reports.render_html(nb, args.out, name=name)
            print(_terminal(str(html)))  # (named after the notebook: one line, escaped)
            if args.screenshot:
                shot = reports.capture(html, html.with_suffix(".png"))
                for png in shot.paths:
                    print(_terminal(str(png)))
                if shot.truncated:
                    print(_terminal(
                        f"residency report: warning: {html}: the page is "
                        f"{shot.page_height_px:,} px tall; the screenshot shows its top "
                        f"{sum(shot.heights_px):,} px (at most {reports.MAX_PAGE_HEIGHT_PX:,}: "
                        "no report of ours is a sixth as tall)"), file=sys.stderr)
        except reports.ReportError as exc:
            print(_terminal(f"residency report: error: {exc}"), file=sys.stderr)
            failed += 1
            unusable += isinstance(exc, reports.NotebookError)
    if len(notebooks) > failed and (len(notebooks) > 1
                                    or any(os.path.isdir(p) for p in args.paths)):
        print(_terminal(str(reports.write_index(args.out))))
    return 2 if unusable else 1 if failed else 0


def cmd_verify(args: argparse.Namespace) -> int:
    """`verify`: the run against its seal (and a quoted digest); exit 1 on any finding."""
    from residency.records.seal import parse_digest
    from residency.rundir.run import verify_run

    expected = None if args.digest is None else parse_digest(args.digest)
    result = verify_run(args.run_dir, expected_digest=expected)
    print("\n".join(result.lines()))
    return 0 if result.ok else 1


def cmd_whatif(args: argparse.Namespace) -> int:
    """`whatif`: gate, totals, effect; exit 1 when the gate fails."""
    from residency.reports import whatif as whatif_report
    from residency.rundir.run import load_run

    run = load_run(args.run_dir, allow_incomplete=args.allow_incomplete,
                   verify=not args.no_verify)
    text, passed = whatif_report.report(run, cached=args.cached, free=args.free, policy=args.policy,
                                 arm=args.arm, fmt=args.format)
    sys.stdout.write(text.rstrip("\n") + "\n")
    return 0 if passed else 1


def cmd_selftest(args: argparse.Namespace) -> int:
    """`selftest`: every path of the suite on the device at hand (residency.selftest)."""
    import json
    import shutil
    import signal

    from residency.selftest import StepResult, out_dir, resolve, run_selftest
    from residency.selftest.core import write_json

    kind, ranks, count = resolve(args.device, args.ranks)  # BadInput: exit 2
    from residency import devices

    devices.check_injection(kind, args.inject_failure)  # ValueError saying why not: exit 2
    out, keep = out_dir(args.out)

    def progress(result: StepResult) -> None:
        if not args.json:
            print(f"  {result.status.upper():<8} {result.name}", file=sys.stderr, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # the running step stops its services and is reported

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        report = run_selftest(kind, ranks=ranks, out=out, device_count=count, keep=keep,
                              on_step=progress, inject_failure=args.inject_failure)
        if keep:
            write_json(out / "selftest.json", report.to_dict())
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(report.to_dict(), indent=2) if args.json else "\n".join(report.lines()))
    if report.interrupted:
        return 130  # the partial report was printed
    return 0 if report.ok else 1


# ----------------------------------------------------------------------------- wiring
# name -> (help, description, parser builder, handler)
COMMANDS: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "probe": ("outcome of every allocator-telemetry query path on a device",
              "Query allocated/reserved bytes through torch.accelerator and through the "
              "registered device module, and mem_get_info; report value or exception per "
              "path.", _probe, cmd_probe),
    "serve": ("run the multi-rank workload service on loopback",
              "The multi-rank workload service (HTTP on loopback, torch.distributed ranks).",
              _serve, cmd_serve),
    "pair": ("run an isolated baseline/candidate design",
             "Each arm runs in a fresh service process group: started, health-checked, warmed "
             "with the same request, measured, stopped before the other arm starts.",
             _pair, cmd_pair),
    "plan": ("device time, power and smallest detectable E2E effect of candidate designs",
             "Before anything starts: from costs (typed, --published, or a --pilot run), noise "
             "(--cv, an --aa run or the pilot) and the effect of interest, each design's "
             "device time, the power of the exact paired test, the smallest effect it "
             "detects, and the cheapest design reaching the power within --budget-hours (or "
             "what the budget supports instead).", _plan, cmd_plan),
    "idle": ("all-rank no-device-task time and marker attribution from traces",
             "All-rank no-device-task time within a window, and host markers intersected with "
             "it, from Kineto or torch-npu traces (times in ms; --json in ns).",
             _idle, cmd_idle),
    "tables": ("evidence table of a run directory",
               "Print the evidence table of RUN_DIR (one row per attribution, units on every "
               "number) and/or the published NPU figures.", _tables, cmd_tables),
    "report": ("render executed notebooks to HTML with the code hidden",
               "Render each executed notebook (files, or folders searched recursively) to "
               "OUT/<name>.html with inputs hidden, as `jupyter nbconvert --to html "
               "--no-input`, the report's banner (device kind, provenance) on top; with "
               "--screenshot also a full-page OUT/<name>.png from headless Chromium "
               "(<name>-2.png, ... for pages taller than 16384 px; at most the top 65536 px, "
               "six times our tallest report: a taller page is a received notebook's doing, "
               "and a warning says so). Given a folder or several "
               "notebooks, also OUT/index.html linking every report in OUT with its banner "
               "line.",
               _report, cmd_report),
    "verify": ("check a run directory against its seal",
               "Check RUN_DIR against the seal recorded when it completed: the sha256 of every "
               "artifact (missing, extra, changed, not a regular file), every manifest field, "
               "runs[] against each client.json, and with --digest the digest quoted by its "
               "author; prints the run's digest (exit 1 on any finding).", _verify,
               cmd_verify),
    "whatif": ("replay a run's recorded snapshots under other bounds and policies",
               "Replay every recorded normal decision's memory snapshot of RUN_DIR through the "
               "policy with other bounds: a consistency gate (own bounds reproduce every "
               "decision), retained/released totals per setting, and an estimated effect (a "
               "model).", _whatif, cmd_whatif),
    "selftest": ("run this suite's own paths on the device at hand, step by step",
                 "Environment, API reproduction, policy arms, the vLLM-Omni adapter, a profiled "
                 "1-request service, its trace parsed back, and a verified paired run "
                 "directory; each step passed / failed (with a hint) / skipped.",
                 _selftest, cmd_selftest),
}


def create_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand (imports nothing but argparse). With
    `command`, only that subcommand's options are built, the others listed by name and help
    (what `main` parses with when the first argument names a command: ~25 ms less start-up)."""
    from residency import __version__

    parser = _Parser(
        prog="residency",
        description="Produce, regenerate and judge evidence for allocator cache retention.")
    parser.add_argument("--version", action="version", version=f"residency {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_, description, configure, _) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_, description=description)
        if command is None or name == command:
            configure(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `residency` console script (see the module docstring for the exit
    codes)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = create_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    handler = COMMANDS[args.command][3]
    try:
        with warnings.catch_warnings():  # each warning one line, its names escaped
            warnings.showwarning = _warning_printer(args.command)
            code = int(handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # the reader left (`residency idle ... | head -3`): end quietly
        return _stdout_gone()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BadInput as exc:  # before RunFailed: bad input found before a run is input
        print(_terminal(f"residency {args.command}: error: {_message(exc)}"), file=sys.stderr)
        return 2
    except RunFailed as exc:  # (may carry a service's log tail: its lines kept)
        print(_terminal_lines(f"residency {args.command}: error: {exc}"), file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:  # bad input from the standard library
        print(_terminal(f"residency {args.command}: error: {_message(exc)}"), file=sys.stderr)
        return 2


def console_main() -> int:
    """The `residency` console script and ``python -m residency``: `main`, then the process
    ends without the collector tracing every object left (`gc.freeze`). Not for use in a
    process that goes on: call `main` there."""
    code = main()
    # Interpreter exit runs the cyclic collector over everything still alive; with Dask's
    # modules loaded that was ~0.25 s of `residency idle --scheduler local` (~0.03 s without).
    # What the collector would free here is freed by the process ending; the atexit handlers,
    # flushes and module teardown still run.
    import gc

    gc.freeze()
    return code


SIGPIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for a process its pipe ended


def _stdout_gone() -> int:
    """After stdout's reader left: point stdout at /dev/null (so that the interpreter's own
    flush at exit cannot fail again) and exit as a process ended by SIGPIPE reports."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return SIGPIPE_EXIT


def _terminal(text: str) -> str:
    """`text` as one line for a terminal: the names it quotes from traces, runs and notebooks
    (host ranges, file names) with every control character, the newline too, written as an
    escape (``\\n``, ``\\x1b``), never acted on: a file named ``x\\nresidency verify: OK``
    cannot print a line of its own."""
    from residency.records.files import printable

    return printable(text)


def _terminal_lines(text: str) -> str:
    """`text` for a terminal line by line (`_terminal` of each): for a failure that quotes a
    service's log tail after its one-line message."""
    return "\n".join(map(_terminal, text.split("\n")))


def _warning_printer(command: str) -> Callable[..., None]:
    """A `warnings.showwarning` printing ``residency <command>: warning: <message>`` on one
    line (``note`` for the trace loader's notes), names escaped (`_terminal`)."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        kind = "note" if category.__name__ == "TraceNote" else "warning"
        with_name = f"residency {command}: {kind}: {message}"
        print(_terminal(with_name), file=file if file is not None else sys.stderr)

    return show


def _message(exc: BaseException) -> str:
    option = getattr(exc, "option", None)  # residency.traces.busy.OptionError (not imported)
    if isinstance(option, str) and callable(render := getattr(exc, "render", None)):
        return render("--" + option.replace("_", "-"))
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror}"
    return str(exc)


