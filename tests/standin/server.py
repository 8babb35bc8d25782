"""A stand-in external service for CI: vLLM-Omni's routes, its worker layout, our real adapter.

`python -m tests.standin.server --port P --ranks N [--profile-dir DIR]` serves, on
127.0.0.1, the routes `tests/data/services/standin_2r.toml` describes:

* `GET /health` (503 until every worker is ready), `GET /version` (what it runs on);
* `POST /v1/videos/sync` (multipart form: `num_inference_steps`, `seed`, ...): blocks until
  every worker finished the request, answers bytes shaped like an MP4 (no request id, no
  per-rank report: what vLLM-Omni returns);
* `POST /start_profile`, `POST /stop_profile`: each worker traces its emulated device and
  writes `<profile-dir>/rank<r>.trace.json` (Kineto) at stop.

Like vLLM-Omni, each rank is its own worker process (`--worker`, `RANK` set) that loads the
`vllm_omni.general_plugins` entry points (honouring `VLLM_PLUGINS`) before it builds its
pipeline; the stand-in `vllm_omni` package (`tests/standin/upstream/`) has the fixed-bounds
`BoundedAllocatorCache`, so with `RESIDENCY_ARM` set the real
`residency.adapters.vllm_omni` patches it and writes decisions with `request_id: null`. Each
worker runs one request at start-up before it reports ready (vLLM-Omni's dummy run), so
those decisions lie outside every client request. Per request and rank: one text-encoder
offload (a normal call; three on the first request after start-up, as when compiling) and
two forced releases around the VAE decode, on an emulated NPU (`residency.emulated`) whose
generic `torch.accelerator` telemetry raises as on Ascend. `STANDIN_EXTRA_NORMAL=RANK:N`
(for the gate tests) makes rank RANK call the normal release twice in measured request N.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

UPSTREAM = Path(__file__).resolve().parent / "upstream"
ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
CAPACITY_BYTES = 256 * MiB
TEXT_ENCODER_BYTES = 48 * MiB  # cached after its offload: 18.75 % of capacity, within 25 %
RESIDENT_BYTES = 64 * MiB
VAE_BYTES = 32 * MiB
PROFILE_RANGE = "standin.profiler_window"
FAKE_MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00" * 64


# ----------------------------------------------------------------------------- worker
def worker_main(rank: int, ranks: int, profile_dir: str) -> int:
    """One rank: load plugins, build the pipeline, run the start-up request, then serve
    JSON-line commands from stdin (`generate`, `start_profile`, `stop_profile`)."""
    import torch

    from residency import markers
    from residency.emulated import install_emulated_npu

    npu = install_emulated_npu(devices=1, capacity_bytes=CAPACITY_BYTES)
    from vllm_omni.plugins import load_omni_general_plugins

    plugins = load_omni_general_plugins()
    from vllm_omni.diffusion.offloader.module_residency import BoundedAllocatorCache

    device = torch.device("npu:0")
    cache = BoundedAllocatorCache(device)
    resident = npu.empty(RESIDENT_BYTES // 4, torch.float32, device)  # the DiT, kept resident
    host = torch.randn(64, 64)
    served = 0
    profile_start_ns = 0
    extra_rank, _, extra_request = os.environ.get("STANDIN_EXTRA_NORMAL", "").partition(":")

    def generate(steps: int) -> None:
        nonlocal served
        normal_calls = 3 if served == 1 else 1  # request 0 is the start-up dummy run
        if extra_rank == str(rank) and extra_request == str(served - 1):  # measured request N
            normal_calls = 2
        with markers.span(markers.REQUEST):
            with markers.span(markers.PHASE_PREPARE):
                for _ in range(normal_calls):  # text encoder: load, encode, offload
                    encoder = npu.empty(TEXT_ENCODER_BYTES // 4, torch.float32, device)
                    npu.launch("text_encoder", lambda: host @ host, device)
                    npu.synchronize(device)
                    encoder.free()
                    cache.release_if_needed()  # PinnedModuleStager.offload()
            with markers.span(markers.PHASE_DENOISE):
                for _ in range(steps):
                    npu.launch("dit_step", lambda: host @ host, device)
                npu.synchronize(device)
            with markers.span(markers.PHASE_DECODE):
                cache.release_if_needed(force=True)  # _release_stage_cache() before decode
                vae = npu.empty(VAE_BYTES // 4, torch.float32, device)
                npu.launch("vae_decode", lambda: host @ host, device)
                npu.synchronize(device)
                vae.free()
                cache.release_if_needed(force=True)  # and after it
        served += 1

    generate(1)  # start-up dummy run, before the service reports healthy
    _reply({"ready": True, "rank": rank, "plugins": plugins, "torch": torch.__version__})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "generate":
            generate(int(cmd["steps"]))
        elif op == "start_profile":
            npu.start_trace()
            profile_start_ns = time.perf_counter_ns()
        elif op == "stop_profile":
            # the whole profiled window as a host range, as a profiler's trace spans from
            # start to stop: the ranks' traces overlap even when a loaded host runs their
            # (unsynchronised) requests one after the other
            markers.emit(PROFILE_RANGE, profile_start_ns, time.perf_counter_ns())
            npu.stop_trace()
            npu.export_trace(Path(profile_dir) / f"rank{rank}.trace.json", rank=rank,
                             world_size=ranks)
        elif op == "quit":
            break
        _reply({"ok": True, "op": op, "rank": rank})
    del resident
    return 0


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- front end
class Workers:
    """The rank processes and one lock: requests and profiler calls run one at a time."""

    def __init__(self, ranks: int, profile_dir: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(UPSTREAM), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "tests.standin.server", "--worker", "--rank", str(r),
             "--ranks", str(ranks), "--profile-dir", profile_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**env, "RANK": str(r), "WORLD_SIZE": str(ranks)}) for r in range(ranks)]
        self.ready: list[dict[str, Any]] = []
        self.error: str | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        for proc in self.procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                self.error = f"worker pid {proc.pid} exited with code {proc.wait()} at start"
                print(f"stand-in: {self.error}", file=sys.stderr, flush=True)
                return
            self.ready.append(json.loads(line))
        print(f"stand-in: {len(self.ready)} workers ready, plugins "
              f"{[r['plugins'] for r in self.ready]}", file=sys.stderr, flush=True)

    @property
    def healthy(self) -> bool:
        return self.error is None and len(self.ready) == len(self.procs)

    def call(self, cmd: dict[str, Any]) -> None:
        """Send `cmd` to every worker and wait until all answered."""
        with self.lock:
            for proc in self.procs:
                proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            for proc in self.procs:
                if not proc.stdout or not proc.stdout.readline():
                    raise RuntimeError(f"worker pid {proc.pid} died during {cmd['op']}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin:
                try:
                    proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    proc.stdin.flush()
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _form(body: bytes, content_type: str) -> dict[str, str]:
    """Text fields of a multipart/form-data body."""
    if "boundary=" not in content_type:
        return {}
    boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
    fields = {}
    for part in body.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if b'name="' not in head or b"filename=" in head:
            continue
        name = head.split(b'name="', 1)[1].split(b'"', 1)[0].decode()
        fields[name] = value.rstrip(b"\r\n").decode(errors="replace")
    return fields


def make_handler(workers: Workers, versions: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            print(f"[http] {fmt % args}", file=sys.stderr, flush=True)

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: dict[str, Any]) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._json(200 if workers.healthy else 503,
                           {"ready": workers.healthy, "error": workers.error})
            elif self.path == "/version":
                self._json(200, {**versions, "torch": (workers.ready or [{}])[0].get("torch")})
            else:
                self._json(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                if self.path == "/v1/videos/sync":
                    form = _form(body, self.headers.get("Content-Type", ""))
                    steps = int(form.get("num_inference_steps", "2"))
                    if steps < 1:
                        raise ValueError("num_inference_steps must be >= 1")
                    workers.call({"op": "generate", "steps": steps})
                    self._send(200, FAKE_MP4, "video/mp4")
                elif self.path in ("/start_profile", "/stop_profile"):
                    workers.call({"op": self.path.lstrip("/")})
                    self._json(200, {"ok": True})
                else:
                    self._json(404, {"error": f"no route {self.path}"})
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
            except RuntimeError as exc:
                self._json(503, {"error": str(exc)})

    return Handler


def serve(port: int, ranks: int, profile_dir: str) -> int:
    """Run the front end until SIGTERM/SIGINT; stops every worker before returning."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        residency_version = version("residency")
    except PackageNotFoundError:
        residency_version = None
    versions = {"version": "0.0.0+standin", "vllm_omni": "0.0.0+standin",
                "residency": residency_version, "python": sys.version.split()[0]}
    workers = Workers(ranks, profile_dir)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(workers, versions))

    def on_term(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        workers.stop()
    print("stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--profile-dir", default="")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.rank, args.ranks, args.profile_dir)
    return serve(args.port, args.ranks, args.profile_dir)


if __name__ == "__main__":
    sys.exit(main())
