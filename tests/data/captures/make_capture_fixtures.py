"""Write the capture-folder fixtures (deterministic; rerun after editing): tiny traces written
by this project that reproduce the layout of serving frameworks' capture folders, as AMD
TraceLens' test data holds them (``tests/traces/inference/*/capture_traces/``, real MI300X
captures). None of the real files is copied; the text is laid out as Kineto's JSON writer
(libkineto ``output_json.cpp``) lays it out, with its metadata (``distributedInfo`` with
``pg_config``, ``baseTimeNanoseconds``, ``ts``/``dur`` as ``<us>.<3 digits>``).

* vllm/: vLLM's CUDA-graph capture traces, ``graph_capture_rank_<r>.<ns>.pt.trace.json.gz``
  (torch's tensorboard handler with worker ``graph_capture_rank_<r>``), beside the
  ``execution_details.json`` sidecar, ``[{"file", "batch_size", "mode"}]`` (``indent=2``).
  Two ranks (TP2).
* sglang/: SGLang's ``bs_<bs>_rank<r>.json.gz`` (``SGLANG_GRAPH_BATCH_CAPTURE``) and the same
  sidecar; one rank, as TraceLens' ``sglang_decode``.
* xdit/: xDiT's ``capture_trace_rank_<r>.json.gz`` (Flux.1 diffusion), two ranks, and the
  sidecar.
* tensorboard/: torch's ``tensorboard_trace_handler`` default names,
  ``<host>_<pid>.<time_ns>.pt.trace.json[.gz]`` (one plain, one gzip), ranks only in
  ``distributedInfo``; beside them TraceLens' trace-split metadata ``execution_details.json``
  (``[{"idx", "output_path", "event_count", ...}]``).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("vllm", "sglang", "xdit", "tensorboard")


def us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def x(cat: str, name: str, pid: object, tid: object, start_ns: int, dur_ns: int,
      args: str = "") -> str:
    tail = f',\n    "args": {{\n      {args}\n    }}' if args else ""
    return (f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {json.dumps(pid)}, '
            f'"tid": {json.dumps(tid)},\n    "ts": {us(start_ns)}, "dur": {us(dur_ns)}{tail}\n  }}')


def meta(name: str, pid: object, tid: object, key: str, value: object, ts_ns: int) -> str:
    return (f'\n  {{\n    "name": "{name}", "ph": "M", "ts": {us(ts_ns)}, '
            f'"pid": {json.dumps(pid)}, "tid": {json.dumps(tid)},\n    "args": {{\n'
            f'      "{key}": {json.dumps(value)}\n    }}\n  }}')


def kineto_text(rank: int, world: int, base_ns: int, t0_ns: int, annotation: str,
                kernels: list[tuple[int, int]], extra: list[str]) -> str:
    """One rank's trace; `kernels`: (start, duration) in ns after `t0_ns`."""
    pid, dev = 851 + rank, rank
    pg = ", ".join(f'{{"pg_name": "{i}", "pg_desc": "{"default_pg" if i == 0 else "undefined"}", '
                   f'"backend_config": "cuda:nccl", "pg_size": {world}, '
                   f'"ranks": {list(range(world))}}}' for i in range(2))
    head = ('\n  {\n    "schemaVersion": 1,\n    "deviceProperties": [\n    {\n      "id": '
            f'{dev}, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992,\n      '
            '"computeMajor": 9, "computeMinor": 4,\n      "warpSize": 64, "numSms": 304\n    }\n'
            '    ],\n      "roctracer_version": 4.1,\n      "distributedInfo": {"backend": '
            f'"nccl", "rank": {rank}, "world_size": {world}, "pg_count": 2, "pg_config": [{pg}], '
            '"nccl_version": "2.26.6"},\n      "record_shapes": 1,\n      "with_stack": 1,\n'
            '      "trace_id": "C7EC2C10297F4C46BD17118E8CE3F184",\n  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {base_ns},\n  "traceEvents": [')
    t = t0_ns
    span = max(s + d for s, d in kernels) + 40_000
    events = [x("user_annotation", annotation, pid, pid, t, span, '"External id": 45057,'
                '"Record function id": 0, "Ev Idx": 0'),
              x("cpu_op", "aten::mm", pid, pid, t + 1_201, 9_999, '"External id": 45058,'
                '"Record function id": 0, "Input Dims": [[32, 4096], [4096, 4096]], "Ev Idx": 1'),
              x("gpu_user_annotation", annotation, dev, 7, t + kernels[0][0] - 1,
                kernels[-1][0] + kernels[-1][1] - kernels[0][0] + 2)]
    for k, (s, d) in enumerate(kernels):
        events.append(x("cuda_runtime", "hipLaunchKernel", pid, pid, t + s - 3_517, 2_004,
                        f'"External id": {45060 + k}, "cbid": 51, "correlation": {9000 + k}'))
        events.append(x("kernel", f"Cijk_Ailk_Bljk_BBS_BH_MT{k}", dev, 7, t + s, d,
                        f'"External id": {45060 + k}, "device": {dev}, "stream": 7, '
                        f'"correlation": {9000 + k}, "kind": "Dispatch Kernel"'))
        events.append(f'\n  {{\n    "ph": "s", "id": {9000 + k}, "pid": {pid}, "tid": {pid}, '
                      f'"ts": {us(t + s - 3_517)},\n    "cat": "ac2g", "name": "ac2g"\n  }}')
    events += extra
    events += [meta("process_name", pid, 0, "name", "python3", t),
               meta("process_labels", dev, 0, "labels", f"GPU {dev}", t),
               meta("thread_name", dev, 7, "name", "stream 7 ", t),
               x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", t - 5_000,
                 span + 9_000, '"Op count": 0'),
               '\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", '
               f'"tid": "", "ts": {us(t + span + 9_999)}\n  }}']
    return (head + ",".join(events) + '\n  ],\n  "traceName": "/tmp/tmpe1sn9faf.json"\n}')


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def sidecar(folder: Path, entries: list[dict]) -> None:
    (folder / "execution_details.json").write_text(json.dumps(entries, indent=2))


def main() -> None:
    for name in FRAMEWORKS:
        shutil.rmtree(HERE / name, ignore_errors=True)
    base = 1767189312000000000
    t0 = 6520430064204_583  # ns after the base (as vLLM's capture: ts 6520430064204.583)
    memcpy = [x("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 0, 7, t0 + 2_000, 1_337,
                '"device": 0, "stream": 7, "bytes": 262144')]

    out = HERE / "vllm"
    files = []
    for rank, kernels, stamp in ((0, [(5_000, 3_250), (9_001, 2_123), (30_500, 7_777)],
                                  "1773709742341309550"),
                                 (1, [(6_100, 4_000), (20_000, 5_555), (31_000, 1_001)],
                                  "1773709742341311017")):
        f = out / f"graph_capture_rank_{rank}.{stamp}.pt.trace.json.gz"
        write(f, kineto_text(rank, 2, base, t0 + 131 * rank, "capture_32_FULL", kernels,
                             memcpy if rank == 0 else []))
        files.append({"file": f.name, "batch_size": 32, "mode": "FULL"})
    sidecar(out, files)

    out = HERE / "sglang"
    write(out / "bs_32_rank0.json.gz",
          kineto_text(0, 1, 1775078550000000000, 3_118_402_771_005, "capture_32",
                      [(1_000, 2_000), (2_500, 1_500), (9_000, 333)], []))
    sidecar(out, [{"file": "bs_32_rank0.json.gz", "batch_size": 32, "mode": "FULL"}])

    out = HERE / "xdit"
    for rank, kernels in ((0, [(10_000, 50_001), (70_000, 20_000)]),
                          (1, [(12_345, 40_000), (95_000, 1_999)])):
        write(out / f"capture_trace_rank_{rank}.json.gz",
              kineto_text(rank, 2, 1782967788000000000, 911_222_333_444 + 7 * rank,
                          "flux_denoise_step", kernels, []))
    sidecar(out, [{"file": "capture_trace_rank_0.json.gz", "batch_size": 1, "mode": "FULL"}])

    out = HERE / "tensorboard"
    for rank, suffix, kernels in ((0, ".pt.trace.json", [(100, 900), (4_000, 2_000)]),
                                  (1, ".pt.trace.json.gz", [(1_500, 1_000), (5_500, 3_000)])):
        write(out / f"gpu-host-a_{4021 + rank}.{1735632360123456789 + rank * 999}{suffix}",
              kineto_text(rank, 2, 1735632360000000000, 123_456_789_012 + 55 * rank,
                          "ProfilerStep#3", kernels, []))
    sidecar(out, [{"idx": 0, "output_path": "./output/trace_annotation_iteration_0.json.gz",
                   "event_count": 45230, "num_gpu_events": 1250, "gpu_duration": 2300000,
                   "gpu_busy_duration": 1000000,
                   "phase": {"num_prefill": 5, "num_decode": 3, "avg_bs": 32}}])


if __name__ == "__main__":
    main()
