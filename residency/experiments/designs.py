"""Paired designs: isolated baseline/candidate arms, warmed, measured and stopped one at a time,
for the built-in service or an external one described by a TOML service file.

Data flow: service -> run directory (`docs/contracts.md`): manifest.json, and per measured run
`client.json`, `service.log`, decisions JSONL per rank and traces per rank when profiled.
`plan` orders a design's arms, `run_design` runs them into a new run directory (each arm by
`residency.experiments.arms.run_arm`), `run_pair` is `residency pair` as a function.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from residency.experiments import arms
from residency.experiments.errors import ExperimentError, ExperimentInputError
from residency.experiments.servicefile import ServiceSpec, builtin_service, load_service_file
from residency.policy.cache import BASELINE, CANDIDATE, PAIRED_ARMS
from residency.processes import interruption
from residency.records.client import CLIENT, read_client
from residency.records.manifest import Manifest
from residency.rundir import hostload, neighbours
from residency.rundir.layout import DESIGNS
from residency.rundir.run import versions


def plan(design: str, pairs: int = 1, *, aa_arm: str = CANDIDATE
         ) -> list[tuple[str, bool]]:
    """(arm, profiled) in run order.

    `profiled-pair`: one profiled baseline/candidate pair. `alternating`: `pairs` unprofiled
    pairs in ABBA order. `paired-profile`: the profiled pair, then `pairs` alternating pairs
    (0 allowed). `consecutive`: one candidate service (its requests are `requests`). `aa`:
    `pairs` unprofiled pairs of `aa_arm` in both slots, slots in ABBA order (`aa_slots`).
    """
    if design == "consecutive":
        return [(CANDIDATE, False)]
    if design == "aa":
        if aa_arm not in PAIRED_ARMS:
            raise ValueError(f"The value for `aa_arm` must be one of {list(PAIRED_ARMS)}, but "
                             f"{aa_arm!r} was passed.")
        return [(aa_arm, False) for _ in aa_slots(pairs)]
    if design not in DESIGNS:
        raise ValueError(f"The value for `design` must be one of {list(DESIGNS)}, but "
                         f"{design!r} was passed.")
    minimum = 0 if design == "paired-profile" else 1
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < minimum:
        raise ValueError(f"The value for `pairs` must be an integer >= {minimum}, but "
                         f"{pairs!r} was passed.")
    order: list[tuple[str, bool]] = []
    if design in ("profiled-pair", "paired-profile"):
        order += [(BASELINE, True), (CANDIDATE, True)]
    if design in ("alternating", "paired-profile"):
        for i in range(pairs):
            arms = PAIRED_ARMS if i % 2 == 0 else PAIRED_ARMS[::-1]
            order += [(arm, False) for arm in arms]
    return order


def aa_slots(pairs: int) -> list[str]:
    """Slot labels of an A/A design in run order: A B, B A, A B, ... (ABBA)."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"The value for `pairs` must be an integer >= 1, but {pairs!r} was "
                         "passed.")
    return [s for i in range(pairs) for s in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def _builtin_versions() -> dict[str, Any]:
    """What the built-in service runs on: this interpreter's residency, torch and python."""
    v = versions()
    return {k: v[k] for k in ("residency", "torch", "torch_npu", "python")}


def run_design(design: str, out: str | os.PathLike[str], *, spec: ServiceSpec, steps: int = 50,
               seed: int = 2101, pairs: int = 1, requests: int = 1,
               params: dict[str, Any] | None = None, aa_arm: str = CANDIDATE,
               progress: bool | Callable[[Iterator[Any]], Iterator[Any]] = True,
               sequential: Any = None, on_start: Callable[[], None] | None = None,
               require_exclusive: bool = False,
               lister: neighbours.Lister | None = None) -> Path:
    """Run a design into a new run directory; returns it. On any failure the directory stays
    with `status: incomplete` and the error, every service is stopped, and
    `ExperimentError` is raised.

    Each unprofiled service run measures `requests` requests after its warm-up (every one
    recorded in client.json; the run's `e2e_s` is their median); profiled runs measure one.
    Every run's cost (service start, warm-up, measured, the rest) is recorded in its
    `runs[].cost` and summed in the manifest's `cost`.

    `sequential` (paired-profile only; `residency.analysis.sequential.SequentialRule`, or
    any object with `to_dict()`, `look(baseline, candidate)` and `result(baseline,
    candidate, looks)`) stops adding unprofiled pairs once a look decides; `pairs` is then
    the maximum. The manifest's `sequential` records the rule (before the first pair), every
    look, where and why it stopped, and the adjusted figures. `on_start` is called once the
    run directory is usable, before the first service starts.

    Every service run records the devices' processes at its start and end (`lister`, default
    the device kind's, `residency.rundir.neighbours`). `require_exclusive`: a foreign process
    on the devices before anything runs is an `ExperimentInputError` (nothing is written);
    one seen at the start or end of a service run stops the run, `incomplete`
    (`ExperimentError`).
    """
    if sequential is not None and design != "paired-profile":
        raise ValueError(f"stopping when decided applies to design paired-profile only, not "
                         f"{design!r}")
    for name, value in (("steps", steps), ("requests", requests)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"The value for `{name}` must be an integer >= 1, but {value!r} "
                             "was passed.")
    order = plan(design, pairs, aa_arm=aa_arm)
    slots = aa_slots(pairs) if design == "aa" else None
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExperimentInputError(f"{out}: run directory exists and is not empty; choose a "
                                   "new one")
    lister = lister or neighbours.lister_for(spec.device_kind)
    if require_exclusive:  # before anything runs or is written
        try:
            neighbours.exclusive(lister, {os.getpid()})
        except neighbours.NotExclusive as exc:
            raise ExperimentInputError(f"device {spec.device_kind}: {exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ExperimentInputError(f"{out}: cannot write the run directory: "
                              f"{exc.strerror or exc}") from None
    manifest = Manifest(
        design=design, device_kind=spec.device_kind,
        service="builtin" if spec.builtin else "external", service_name=spec.name,
        params={"ranks": spec.ranks, "steps": steps, "seed": seed,
                "pairs": pairs if design in ("alternating", "paired-profile", "aa") else 1,
                "requests": requests, **({"aa_arm": aa_arm} if design == "aa" else {}),
                "require_exclusive": require_exclusive, **(params or {})},
        versions=versions(), order=[arm for arm, _ in order],
        extra={"service_info": {"name": spec.name, "file": spec.source,
                                "command": list(spec.command),
                                "versions": _builtin_versions() if spec.builtin else None,
                                "expect": spec.expect}})
    info = manifest.extra["service_info"]
    if sequential is not None:  # the rule is fixed (and recorded) before the first pair
        manifest.params["max_pairs"] = pairs
        manifest.extra["sequential"] = {"rule": sequential.to_dict(), "looks": []}
    try:
        manifest.write(out)
    except OSError as exc:
        raise ExperimentError(f"{out}: cannot write manifest.json: {exc.strerror or exc}"
                              ) from None
    if on_start is not None:
        on_start()
    bar = _progress(progress, len(order), f"{design} ({spec.device_kind})")
    try:
        for index, (arm, profiled) in enumerate(order):
            bar.set_postfix_str(f"{arm} #{index}")
            before = hostload.sample()
            entry = arms.run_arm(spec, arm, index, out, steps=steps, seed=seed,
                                 profiled=profiled, requests=1 if profiled else requests,
                                 lister=lister, require_exclusive=require_exclusive)
            entry["host_load"] = hostload.record(before, hostload.sample())
            if slots is not None:
                entry["slot"] = slots[index]
            manifest.runs.append(entry)
            manifest.extra["host_load"] = hostload.summarize(
                [r.get("host_load") for r in manifest.runs])
            manifest.extra["cost"] = arms.cost_summary(manifest.runs)
            manifest.extra["neighbours"] = neighbours.summarize(
                [(r.get("dir"), r.get("neighbours")) for r in manifest.runs])
            if info["versions"] is None:  # what the first external service reported
                client = read_client(out / manifest.runs[-1]["dir"] / CLIENT, check=False)
                info["versions"] = client.get("service_versions")
            stop = sequential is not None and _sequential_look(sequential, manifest)
            manifest.write(out)
            bar.update(1)
            if stop:
                with contextlib.suppress(AttributeError, TypeError):
                    bar.total = index + 1
                break
    except BaseException as exc:
        unsaved = ""
        try:  # best effort: the directory may be what failed
            manifest.fail(out, interruption(exc))
        except OSError as werr:
            unsaved = f" (manifest.json could not be updated either: {werr.strerror or werr})"
        if isinstance(exc, ExperimentError):
            if not unsaved:
                raise
            raise type(exc)(f"{exc}{unsaved}") from exc
        if isinstance(exc, OSError):
            raise ExperimentError(f"{out}: run incomplete: {exc.strerror or exc}: "
                                  f"{exc.filename or ''}{unsaved}") from exc
        if isinstance(exc, Exception):
            raise ExperimentError(f"{out}: run incomplete: {exc}{unsaved}") from exc
        raise
    finally:
        bar.close()
    manifest.complete(out)
    return out


def _sequential_look(rule: Any, manifest: Manifest) -> bool:
    """After a run: when it completes an unprofiled pair, the rule's look (recorded in the
    manifest's `sequential`); True when the rule stops there (its figures recorded, `order`
    and `params.pairs` cut to the pairs run)."""
    e2e = {arm: [float(r["e2e_s"]) for r in manifest.runs
                 if r["arm"] == arm and not r["profiled"]] for arm in PAIRED_ARMS}
    base, cand = e2e[PAIRED_ARMS[0]], e2e[PAIRED_ARMS[1]]
    if not base or len(base) != len(cand):
        return False
    record = manifest.extra["sequential"]
    look = rule.look(base, cand)
    if look is None:
        return False
    record["looks"].append(look.to_dict())
    if look.decision == "continue":
        return False
    result = rule.result(base, cand, record["looks"]).to_dict()
    record.update({k: v for k, v in result.items() if k not in ("rule", "looks")})
    manifest.params["pairs"] = len(base)
    manifest.order = manifest.order[:len(manifest.runs)]
    return True


def _progress(progress: Any, total: int, desc: str) -> Any:
    if callable(progress):
        return progress(total=total, desc=desc)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="arm", disable=not progress, file=sys.stderr)


def run_pair(design: str = "profiled-pair", *, out: str | os.PathLike[str], device: str = "auto",
             ranks: int = 2, steps: int = 50, seed: int = 2101, pairs: int = 1,
             requests: int = 1,
             scale: float | str = 1.0, capacity_bytes: int | None = None,
             resident_mib: float = 1024,
             service_file: str | os.PathLike[str] | None = None, progress: bool = True,
             emulator: Any = None, aa_arm: str = CANDIDATE, fill: float | None = None,
             inject_failure: str = "none", sequential: Any = None,
             on_start: Callable[[], None] | None = None,
             require_exclusive: bool = False) -> Path:
    """`residency pair` as a function: the built-in service unless `service_file` is given.

    `emulator` is the emulated NPU's `DeviceModel` (default `DeviceModel()`: modelled device
    time); it is recorded in the manifest's params as `emulated_npu`. `scale="auto"` sizes
    the workload from the device's capacity (`residency.sizing.auto_size`, `fill` of it held;
    recorded as `params.sizing`). `inject_failure="generic-telemetry"` (cuda only) makes the
    baseline's generic telemetry raise as torch-npu <= 2.12 does, with the emulator's
    `accelerator_patch` on top (recorded as `params.inject_failure`). `sequential`: see
    `run_design` (`pairs` is then the maximum). `require_exclusive`: see `run_design`.
    """
    if service_file is not None:
        if scale == "auto" or inject_failure != "none":
            raise ValueError("--scale auto and --inject-failure apply to the built-in service "
                             "only, not with --service")
        spec = load_service_file(service_file)
        params: dict[str, Any] = {"service_file": str(service_file)}
    else:
        from residency import devices
        from residency.protocol import MAX_SEED, MAX_STEPS

        if ranks < 1:
            raise ValueError(f"The value for `ranks` must be >= 1, but {ranks!r} was passed.")
        # the built-in service's documented bounds, checked before any service starts
        for name, value, low, high in (("steps", steps, 1, MAX_STEPS),
                                       ("seed", seed, 0, MAX_SEED)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"The value for `{name}` must be an integer in [{low}, {high}],"
                                 f" but {value!r} was passed.")
        for name, number in (("scale", 1.0 if scale == "auto" else scale),
                             ("resident_mib", resident_mib)):
            if (isinstance(number, bool) or not isinstance(number, (int, float))
                    or not math.isfinite(number) or number <= 0):
                raise ValueError(f"The value for `{name}` must be a positive finite number"
                                 f"{' or auto' if name == 'scale' else ''}, but {number!r} "
                                 "was passed.")
        if fill is not None and scale != "auto":
            raise ValueError("--fill applies with --scale auto only")
        import dataclasses

        from residency import protocol as sizing
        from residency.devicemodel import DeviceModel

        kind = devices.resolve(device)
        devices.check_injection(kind, inject_failure)  # ValueError saying why not
        patch = "none"
        if emulator is not None and inject_failure != "none":  # the patch goes with it
            patch = emulator.accelerator_patch
            emulator = dataclasses.replace(emulator, accelerator_patch="none")
        model = None
        if devices.emulated(kind):
            model = (emulator or DeviceModel()).to_params()
        elif emulator is not None and emulator != DeviceModel():
            raise ValueError(f"the emulated NPU's model options apply to device emulated-npu "
                             f"only, not {kind} (--accelerator-patch also with "
                             "--inject-failure on cuda)")
        sized = None
        if scale == "auto":
            sized = sizing.auto_size(
                sizing.device_total_bytes(kind, capacity_bytes=capacity_bytes),
                fill=sizing.AUTO_FILL if fill is None else fill)
            scale, resident_mib = sized.scale, sized.resident_mib
        spec = builtin_service(device_kind=kind, ranks=ranks, scale=scale,
                               capacity_bytes=capacity_bytes, resident_mib=resident_mib,
                               emulator=model, inject_failure=inject_failure,
                               accelerator_patch=patch, resident_on_device=sized is not None)
        params = {"scale": scale, "capacity_bytes": capacity_bytes,
                  "resident_mib": resident_mib}
        if sized is not None:
            params["sizing"] = sized.to_params()
        injected = devices.injection_record(kind, inject_failure, patch)
        if injected is not None:
            params["inject_failure"] = injected
        if model is not None:  # the device model and the capacity it emulates
            from residency.devicemodel import DEFAULT_CAPACITY_BYTES

            params["emulated_npu"] = {**model,
                                      "capacity_bytes": capacity_bytes or DEFAULT_CAPACITY_BYTES}
    return run_design(design, out, spec=spec, steps=steps, seed=seed, pairs=pairs,
                      requests=requests, params=params, aa_arm=aa_arm, progress=progress,
                      sequential=sequential, on_start=on_start,
                      require_exclusive=require_exclusive)
