"""A seeded random-weight diffusion pipeline shaped like the H3 Ref2VA path, with component
residency: a text encoder, a reference (video/audio) encoder, a resident DiT denoiser and a
video VAE decoder, staged on and off one device per rank.

Per request and rank the policy sees exactly one normal call (text-encoder offload) and two
forced calls (the VAE release points before and after decode), the shape of the original
evidence. Weights are seeded random (no downloads); sizes follow `scale`.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from residency import devices as device_kinds
from residency import markers
from residency import protocol as sizing
from residency.policy.cache import BoundedAllocatorCache, Decision

MiB = 1 << 20
BLOCK_BYTES = 128 * MiB


@dataclass(frozen=True)
class WorkloadConfig:
    """Sizes of the pipeline. Component sizes are MiB at `scale` 1.0.

    At scale 1.0 on the emulated NPU's default 4 GiB, the text encoder's 768 MiB stays cached
    within the 25 % (1 GiB) bound, so the candidate retains. Both bounds are reachable:
    cached bound with `scale >= 1.4` (text encoder > 1 GiB), free bound with e.g.
    `resident_mib=3200` (resident DiT leaves < 5 % free after the text encoder is cached).
    """

    scale: float = 1.0
    hidden: int = 512
    tokens: int = 512
    dit_layers: int = 8
    text_encoder_mib: float = sizing.TEXT_ENCODER_MIB
    reference_encoder_mib: float = sizing.REFERENCE_ENCODER_MIB
    vae_mib: float = sizing.VAE_MIB
    resident_mib: float = sizing.RESIDENT_MIB
    frames_mib: float = sizing.FRAMES_MIB
    resident_on_device: bool = False
    """Make the resident footprint on the device (filled there, as a loaded DiT is) instead of
    uploading host weights: `--scale auto` sizes it to most of a large device, where host
    copies would cost host memory and minutes per service start."""

    def __post_init__(self) -> None:
        for name in ("scale", "text_encoder_mib", "reference_encoder_mib", "vae_mib",
                     "resident_mib", "frames_mib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"The value for `{name}` must be > 0, but "
                                 f"{getattr(self, name)!r} was passed.")
        for name in ("hidden", "tokens", "dit_layers"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
                raise ValueError(f"The value for `{name}` must be a positive integer, but "
                                 f"{getattr(self, name)!r} was passed.")

    def nbytes(self, mib: float) -> int:
        """`mib` at this scale, in bytes, rounded to whole hidden x hidden fp32 tiles."""
        tile = self.hidden * self.hidden * 4
        return max(tile, int(mib * self.scale * MiB) // tile * tile)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeviceOps(Protocol):
    """The few device operations the pipeline needs; emulated and real devices implement it."""

    kind: str
    device: torch.device

    def upload(self, host: torch.Tensor, name: str) -> Any: ...
    def empty(self, shape: tuple[int, ...]) -> Any: ...
    def view(self, tensor: Any) -> torch.Tensor: ...
    def launch(self, name: str, fn: Callable[[], object]) -> None: ...
    def free(self, tensor: Any) -> None: ...
    def to_host(self, tensor: Any) -> torch.Tensor: ...
    def synchronize(self) -> None: ...


def seeded_weights(nbytes: int, hidden: int, seed: int) -> list[torch.Tensor]:
    """Host fp32 weight blocks of `hidden` rows totalling `nbytes`, from one seeded tile."""
    gen = torch.Generator().manual_seed(seed)
    tile = torch.randn(hidden, 1024, generator=gen) * hidden ** -0.5
    blocks = []
    remaining = nbytes
    while remaining > 0:
        size = min(BLOCK_BYTES, remaining)
        cols = max(hidden, size // (hidden * 4) // hidden * hidden)
        block = torch.empty(hidden, cols)
        full = cols // 1024 * 1024
        if full:
            block[:, :full].view(hidden, -1, 1024).copy_(tile.unsqueeze(1))
        if cols > full:
            block[:, full:].copy_(tile[:, : cols - full])
        blocks.append(block)
        remaining -= cols * hidden * 4
    return blocks


@dataclass
class Component:
    """A stageable model component: host weights, and device copies while loaded."""

    name: str
    host: list[torch.Tensor]
    device: list[Any] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)


class ComponentStager:
    """Loads a component's weights before its stage and offloads them after.

    `offload(component, policy_call=True)` is the normal policy call; load failures and OOM
    trigger a forced release and one retry, as upstream.
    """

    def __init__(self, ops: DeviceOps, policy: BoundedAllocatorCache) -> None:
        self.ops = ops
        self.policy = policy
        self.oom = 0

    def load(self, component: Component) -> list[Any]:
        if component.device:
            return component.device
        with markers.span(markers.load(component.name)):
            try:
                component.device = [self.ops.upload(t, f"{component.name}.load")
                                    for t in component.host]
            except torch.OutOfMemoryError:
                self.oom += 1
                self._drop(component)
                self.policy.release_if_needed(force=True)
                component.device = [self.ops.upload(t, f"{component.name}.load")
                                    for t in component.host]
        return component.device

    def _drop(self, component: Component) -> None:
        for t in component.device:
            self.ops.free(t)
        component.device = []

    def offload(self, component: Component, *, policy_call: bool = False) -> bool | None:
        self._drop(component)
        return self.policy.release_if_needed() if policy_call else None

    def release(self) -> bool:
        return self.policy.release_if_needed(force=True)


@dataclass(frozen=True)
class RequestResult:
    """What one rank did for one request (times in monotonic ns)."""

    rank: int
    request_id: str
    prepare_ns: int
    denoise_ns: int
    decode_ns: int
    total_ns: int
    decisions: tuple[Decision, ...]
    oom: int
    checksum: float

    def summary(self) -> dict[str, Any]:
        """The per-rank summary of the service response (docs/contracts.md)."""
        normal = [d for d in self.decisions if d.kind == "normal"]
        forced = [d for d in self.decisions if d.kind == "forced"]
        return {
            "rank": self.rank, "prepare_ns": self.prepare_ns, "denoise_ns": self.denoise_ns,
            "decode_ns": self.decode_ns, "total_ns": self.total_ns,
            "normal": {"count": len(normal),
                       "retained": sum(not d.released for d in normal),
                       "released": sum(d.released for d in normal),
                       "duration_ns": [d.duration_ns for d in normal]},
            "forced": {"count": len(forced), "released": sum(d.released for d in forced)},
            "telemetry_errors": sum(d.reason == "telemetry-unavailable" for d in self.decisions),
            "oom": self.oom, "checksum": self.checksum,
        }


Exchange = Callable[[torch.Tensor], torch.Tensor]


class Pipeline:
    """The pipeline of one rank. `exchange` combines a small host tensor across ranks."""

    def __init__(self, ops: DeviceOps, policy: BoundedAllocatorCache, config: WorkloadConfig,
                 *, rank: int = 0, world_size: int = 1, seed: int = 0) -> None:
        self.ops, self.config, self.rank, self.world_size = ops, config, rank, world_size
        self.stager = ComponentStager(ops, policy)
        self.policy = policy
        h = config.hidden
        self.text_encoder = Component("text_encoder", seeded_weights(
            config.nbytes(config.text_encoder_mib), h, seed + 1))
        self.reference_encoder = Component("reference_encoder", seeded_weights(
            config.nbytes(config.reference_encoder_mib), h, seed + 2))
        self.vae = Component("vae", seeded_weights(config.nbytes(config.vae_mib), h, seed + 3))
        # the DiT stays resident: its layers plus the rest of its resident footprint
        self.dit_layers = [ops.upload(w, "dit.load") for w in seeded_weights(
            config.dit_layers * h * h * 4, h, seed + 4)[0].split(h, dim=1)]
        if config.resident_on_device:
            self.resident = self._device_resident(config.nbytes(config.resident_mib))
        else:
            self.resident = [ops.upload(w, "resident.load") for w in seeded_weights(
                config.nbytes(config.resident_mib), h, seed + 5)]
        ops.synchronize()

    def _device_resident(self, nbytes: int) -> list[Any]:
        """`nbytes` of resident weights made and filled on the device, in BLOCK_BYTES blocks."""
        h, out = self.config.hidden, []
        remaining = nbytes
        while remaining > 0:
            rows = max(1, min(BLOCK_BYTES, remaining) // (h * 4))
            block = self.ops.empty((rows, h))
            view = self.ops.view(block)
            self.ops.launch("resident.fill", lambda view=view: view.fill_(h ** -0.5))
            out.append(block)
            remaining -= rows * h * 4
        return out

    def _encode(self, weights: list[Any], query: Any, out: Any, name: str) -> None:
        """out[hidden] = mean over blocks of (query @ W) folded to hidden width (reads all W)."""
        ops, h = self.ops, self.config.hidden
        # views are taken at launch, like kernel arguments: a block freed after launch stays
        # valid for this task (stream-ordered reuse, as in PyTorch's caching allocators)
        acc, q, ws = ops.view(out), ops.view(query), [ops.view(w) for w in weights]

        def task() -> None:
            acc.zero_()
            for w in ws:
                acc.add_((q @ w).view(-1, h).mean(0))
        ops.launch(name, task)

    def run(self, request_id: str, *, steps: int, seed: int,
            exchange: Exchange | None = None,
            on_step: Callable[[int], None] | None = None) -> RequestResult:
        """Serve one request on this rank; `exchange` is the per-step cross-rank combine."""
        ops, cfg, h = self.ops, self.config, self.config.hidden
        first_decision = len(getattr(self.policy.recorder, "decisions", []))
        oom_before = self.stager.oom
        gen = torch.Generator().manual_seed(seed * 1000 + self.rank)
        local_tokens = max(1, cfg.tokens // self.world_size)
        t0 = time.perf_counter_ns()
        with markers.span(markers.REQUEST):
            with markers.span(markers.PHASE_PREPARE):
                prompt = ops.upload(torch.randn(1, h, generator=gen), "prompt.load")
                text = ops.empty((h,))
                self._encode(self.stager.load(self.text_encoder), prompt, text, "text_encoder")
                if exchange is not None:  # the tensor-parallel text encoder's all-reduce
                    self._combine(text, exchange)
                self.stager.offload(self.text_encoder, policy_call=True)
                reference = ops.empty((h,))
                self._encode(self.stager.load(self.reference_encoder), prompt, reference,
                             "reference_encoder")
                self.stager.offload(self.reference_encoder)
                latents = ops.upload(torch.randn(local_tokens, h, generator=gen), "latents.load")
                scratch = ops.empty((local_tokens, h))
                ops.synchronize()  # the window ends where the first denoising step can start
            t1 = time.perf_counter_ns()
            with markers.span(markers.PHASE_DENOISE):
                for step in range(steps):
                    self._denoise_step(latents, scratch, text, reference, step)
                    if exchange is not None:  # sequence-parallel exchange after each step
                        self._combine(text, exchange)
                    if on_step is not None:
                        on_step(step)
            t2 = time.perf_counter_ns()
            with markers.span(markers.PHASE_DECODE):
                self.stager.release()                 # VAE release point: before decode
                frames = ops.empty((cfg.nbytes(cfg.frames_mib) // (h * 4), h))
                self._decode(self.stager.load(self.vae), latents, frames)
                checksum = float(ops.to_host(text).sum())
                self.stager.offload(self.vae)
                for t in (prompt, text, reference, latents, scratch, frames):
                    ops.free(t)
                self.stager.release()                 # VAE release point: after decode
            t3 = time.perf_counter_ns()
        decisions = tuple(getattr(self.policy.recorder, "decisions", [])[first_decision:])
        return RequestResult(self.rank, request_id, t1 - t0, t2 - t1, t3 - t2, t3 - t0,
                             decisions, self.stager.oom - oom_before, checksum)

    def _combine(self, target: Any, exchange: Exchange) -> None:
        """Wait for `target`, combine a slice of it across ranks, fold the result back in."""
        summary = self.ops.to_host(target)[:8]
        self.ops.launch("exchange.apply", _add_scaled(self.ops, target, exchange(summary).sum()))

    def _denoise_step(self, latents: Any, scratch: Any, text: Any, reference: Any,
                      step: int) -> None:
        ops = self.ops
        lat, scr, txt, ref = (ops.view(t) for t in (latents, scratch, text, reference))
        layers = [ops.view(w) for w in self.dit_layers]

        def task() -> None:
            x, y = lat, scr
            cond = txt + ref
            for w in layers:
                torch.matmul(x, w, out=y)
                y.add_(cond).tanh_()
                x, y = y, x
            if len(layers) % 2:
                lat.copy_(x)
        ops.launch(f"dit.step{step}", task)

    def _decode(self, weights: list[Any], latents: Any, frames: Any) -> None:
        ops = self.ops
        f, lat, ws = ops.view(frames), ops.view(latents), [ops.view(w) for w in weights]

        def task() -> None:
            z = lat[:1]
            f.copy_(z.expand(f.shape[0], -1))
            for w in ws:
                f[: min(64, f.shape[0])].add_((z @ w).view(-1, f.shape[1])[:1])
        ops.launch("vae.decode", task)


def _add_scaled(ops: DeviceOps, target: Any, value: torch.Tensor) -> Callable[[], None]:
    scalar, view = float(value) * 1e-6, ops.view(target)

    def task() -> None:
        view.add_(scalar)
    return task


class TorchOps:
    """DeviceOps on a real torch device (cuda, npu): tensors live on the device."""

    kinds = ("npu", "cuda")

    def __init__(self, kind: str, device: torch.device) -> None:
        self.kind, self.device = kind, device
        self._module = torch.get_device_module(device)

    @classmethod
    def open(cls, kind: str, index: int, *, devices: int = 1,
             capacity_bytes: int | None = None) -> TorchOps:
        """Device `index` of `kind`, made current (its registered `device_package`, e.g.
        torch_npu, imported first)."""
        package = device_kinds.info(kind).device_package
        if package is not None:
            importlib.import_module(package)  # registers torch's device module
        device = device_kinds.torch_device(kind, index)
        torch.get_device_module(device).set_device(index)
        return cls(kind, device)

    def upload(self, host: torch.Tensor, name: str) -> torch.Tensor:
        return host.to(self.device, non_blocking=False)

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, device=self.device)

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def launch(self, name: str, fn: Callable[[], object]) -> None:
        fn()  # device kernels are asynchronous already

    def free(self, tensor: torch.Tensor) -> None:
        """Nothing to do: dropping the last reference returns the block to the cache."""

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cpu()

    def synchronize(self) -> None:
        self._module.synchronize(self.device)


class EmulatedOps:
    """DeviceOps on the emulated NPU: host-backed blocks, tasks on the device's stream."""

    kind = "emulated-npu"
    kinds = ("emulated-npu",)

    def __init__(self, module: Any, device: torch.device) -> None:
        self.module, self.device = module, device

    @classmethod
    def open(cls, kind: str, index: int, *, devices: int = 1,
             capacity_bytes: int | None = None) -> EmulatedOps:
        """Device `index` of the emulated NPU, installed in this process (`devices` devices
        of `capacity_bytes`, default 4 GiB) and made current."""
        from residency.emulated import DEFAULT_CAPACITY_BYTES, install_emulated_npu

        module = install_emulated_npu(devices=devices,
                                      capacity_bytes=capacity_bytes or DEFAULT_CAPACITY_BYTES)
        module.set_device(index)
        return cls(module, device_kinds.torch_device(kind, index))

    def upload(self, host: torch.Tensor, name: str) -> Any:
        return self.module.to_device(host, self.device)

    def empty(self, shape: tuple[int, ...]) -> Any:
        return self.module.empty(shape, dtype=torch.float32, device=self.device)

    def view(self, tensor: Any) -> torch.Tensor:
        return tensor.host

    def launch(self, name: str, fn: Callable[[], object]) -> None:
        self.module.launch(name, fn, self.device)

    def free(self, tensor: Any) -> None:
        tensor.free()

    def to_host(self, tensor: Any) -> torch.Tensor:
        return tensor.to_host()

    def synchronize(self) -> None:
        self.module.synchronize(self.device)


DEVICE_OPS: dict[str, type[TorchOps] | type[EmulatedOps]] = {
    kind: cls for cls in (TorchOps, EmulatedOps) for kind in cls.kinds}
"""Device kind -> its DeviceOps class (a new kind: one class registered here and one
`DeviceKind` in `residency.devices`)."""


def open_device(kind: str, index: int, *, devices: int = 1,
                capacity_bytes: int | None = None) -> DeviceOps:
    """DeviceOps for device `index` of `kind`, through `DEVICE_OPS` (installs the emulated
    NPU in this process). ValueError naming `device_kind` for a kind a run cannot use."""
    return DEVICE_OPS[device_kinds.check_kind(kind)].open(
        kind, index, devices=devices, capacity_bytes=capacity_bytes)
