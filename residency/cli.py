"""`residency` command line: one subcommand per concern, each imported lazily."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

# subcommand -> module providing `add_cli(subparsers)` and `run_cli(args) -> int`
SUBCOMMANDS = {
    "probe": "residency.cli",
    "serve": "residency.service",
    "pair": "residency.experiments",
    "idle": "residency.idle",
    "tables": "residency.tables",
    "report": "residency.reports",
    "verify": "residency.rundir",
    "whatif": "residency.whatif",
}


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `probe`."""
    p = subparsers.add_parser(
        "probe", help="outcome of every allocator-telemetry query path on a device",
        description="Query allocated/reserved bytes through torch.accelerator and through the "
        "registered device module, and mem_get_info; report value or exception per path.")
    p.add_argument("--device", default="auto",
                   help="auto|cpu|cuda|npu|emulated-npu (default: auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _probe_device(spec: str) -> tuple[str, str]:
    if spec == "cpu":
        return "cpu", "cpu"
    from residency.devices import resolve
    from residency.emulated import install_emulated_npu

    kind = resolve(spec)
    if kind == "emulated-npu":
        install_emulated_npu()
        return kind, "npu:0"
    if kind == "npu":
        import torch_npu  # noqa: F401  - registers torch.npu
        return kind, "npu:0"
    return kind, "cuda:0"


def run_cli(args: argparse.Namespace) -> int:
    """Run `probe`."""
    import platform

    import torch

    from residency.telemetry import probe_queries

    kind, device = _probe_device(args.device)
    result = {"device_kind": kind, "python": platform.python_version(),
              "torch": torch.__version__, **probe_queries(device)}
    try:
        import torch_npu  # type: ignore[import-not-found]

        result["torch_npu"] = torch_npu.__version__
    except ImportError:
        result["torch_npu"] = None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"device {result['device']} ({kind}); torch {result['torch']}, "
          f"torch-npu {result['torch_npu']}")
    for source in ("generic", "registered"):
        for query, out in result[source].items():
            print(f"  {source:<10} {query:<10} {_fmt(out)}")
    print(f"  {'registered':<10} {'mem_get_info':<10} {_fmt(result['mem_get_info'])}")
    for arm, info in result["arms"].items():
        src = info["telemetry"] or "none (releases on every call)"
        state = "n/a" if info["telemetry"] is None else (
            "ok" if info["error"] is None else f"unavailable -> releases ({info['error']})")
        print(f"  arm {arm:<15} telemetry {src}: {state}")
    print(f"verdict: {result['verdict']}")
    return 0


def _fmt(outcome: dict) -> str:
    if outcome["ok"]:
        return f"ok  {outcome['value']}"
    return f"ERR {outcome['error_type']}: {outcome['error']}"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every available subcommand registered (or only `only`, so
    that one subcommand does not import the others' dependencies)."""
    parser = argparse.ArgumentParser(
        prog="residency",
        description="Produce, regenerate and judge evidence for allocator cache retention.")
    from residency import __version__

    parser.add_argument("--version", action="version", version=f"residency {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        module = sys.modules[__name__] if module_name == __name__ else _import(module_name)
        if module is not None:
            module.add_cli(sub)
    return parser


def _import(module_name: str):  # noqa: ANN202 - a module or None
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name == module_name:  # the concern is not installed in this build
            return None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `residency` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    module_name = SUBCOMMANDS[args.command]
    module = sys.modules[__name__] if module_name == __name__ else _import(module_name)
    try:
        return int(module.run_cli(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
