"""The workload's device operations: one DeviceOps class per registered device kind."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from residency import devices
from residency.workload.pipeline import DEVICE_OPS, EmulatedOps, TorchOps, open_device

WORKLOAD = Path(__file__).resolve().parent.parent.parent / "residency" / "workload" / "pipeline.py"


def test_every_kind_a_run_records_has_device_ops() -> None:
    assert set(DEVICE_OPS) == set(devices.KINDS)
    assert DEVICE_OPS["emulated-npu"] is EmulatedOps
    assert DEVICE_OPS["npu"] is DEVICE_OPS["cuda"] is TorchOps
    assert devices.info("npu").device_package == "torch_npu"  # what TorchOps.open imports


def test_open_device_refuses_a_kind_a_run_cannot_use() -> None:
    with pytest.raises(ValueError, match="`device_kind` must be one of"):
        open_device("cpu", 0)


def test_workload_never_switches_on_a_device_kind_string() -> None:
    """Registries over string switches: no `kind == "npu"`-style comparison in the
    workload; the kind reaches its DeviceOps class through `DEVICE_OPS`."""
    names = set(devices.REGISTRY)
    found = []
    for node in ast.walk(ast.parse(WORKLOAD.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in names:
                    found.append(f"line {node.lineno}: compares with {side.value!r}")
    assert found == []


def test_open_device_installs_the_emulated_npu(subprocess_python: Callable[..., dict]) -> None:
    result = subprocess_python("""
        import json
        from residency.workload.pipeline import open_device

        ops = open_device("emulated-npu", 1, devices=2, capacity_bytes=1 << 30)
        print(json.dumps({"type": type(ops).__name__, "device": str(ops.device),
                          "current": ops.module.current_device(),
                          "capacity": ops.module.mem_get_info(ops.device)[1]}))
    """)
    assert result == {"type": "EmulatedOps", "device": "npu:1", "current": 1,
                      "capacity": 1 << 30}
