"""The banner at the top of every report: the device kind (for the emulated NPU its label,
before any number) and the run's provenance (commit, versions, host, start/end) in one short
block under it, rendered from a run manifest (`docs/contracts.md`, `manifest.json`).

`banner_html` is what a notebook displays (`IPython.display.HTML`); its output carries the
metadata `BANNER_METADATA` so `residency report` moves it to the top of the rendered page and
lists its first line in `index.html` (`banner_line`). No torch, no pandas.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from residency.humanize import duration_text

BANNER_CLASS = "residency-banner"
BANNER_METADATA = "residency-banner"  # key in a display output's metadata

__all__ = ["BANNER_CLASS", "BANNER_METADATA", "banner_html", "banner_line", "banner_markdown",
           "device_heading", "display_banner", "elapsed_s", "live_manifest",
           "provenance_lines"]


def device_heading(device_kind: str | None, injection: str | None = None) -> str:
    """The banner's first words: the kind and its label (`residency.devices.label`), e.g.
    "emulated-npu: emulated NPU — not an NPU measurement", "npu: Ascend NPU"."""
    from residency import devices

    if not device_kind:
        return "unknown device kind"
    label = devices.label(device_kind, injection)
    return f"{device_kind}: {label}" if label != device_kind else device_kind


def _heading(manifest: Mapping[str, Any]) -> str:
    from residency import devices

    return device_heading(manifest.get("device_kind"),
                          devices.injection_of(manifest.get("params")))


def elapsed_s(manifest: Mapping[str, Any]) -> float | None:
    """Seconds from the manifest's `started_at` to `ended_at` (None when either is missing,
    unreadable, or the end precedes the start)."""
    try:
        s = datetime.fromisoformat(str(manifest.get("started_at")))
        e = datetime.fromisoformat(str(manifest.get("ended_at")))
        seconds = (e - s).total_seconds()
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def _duration(start: str | None, end: str | None) -> str | None:
    total = elapsed_s({"started_at": start, "ended_at": end})
    if total is None:
        return None
    return duration_text(total)


def provenance_lines(manifest: Mapping[str, Any]) -> list[str]:
    """The provenance block as plain lines: what ran (design, status), the code (commit and
    versions), where (host) and when (start to end, duration)."""
    m = manifest
    v = m.get("versions") or {}
    commit = v.get("git_commit")
    code = [f"commit {str(commit)[:12]}" if commit else "commit not recorded"]
    for key, name in (("residency", "residency"), ("python", "python"), ("torch", "torch"),
                      ("torch_npu", "torch-npu")):
        if key in v or key in ("residency", "torch"):
            code.append(f"{name} {v.get(key) or 'none'}")
    lines = []
    what = [f"design {m['design']}" if m.get("design") else None,
            f"status {m['status']}" if m.get("status") else None,
            f"run {m['run_dir']}" if m.get("run_dir") else None]
    if any(what):
        lines.append(", ".join(w for w in what if w))
    lines.append(", ".join(code))
    start, end = m.get("started_at"), m.get("ended_at")
    when = f"{start or 'start not recorded'} to {end or 'end not recorded'}"
    took = _duration(start, end)
    lines.append(f"host {m.get('host') or 'not recorded'}, {when}"
                 + (f" ({took})" if took else ""))
    return lines


def banner_line(manifest: Mapping[str, Any]) -> str:
    """The banner as one line (terminal, `index.html`): device heading, design, commit and
    start time."""
    m = manifest
    parts = [_heading(m)]
    if m.get("design"):
        parts.append(str(m["design"]))
    commit = (m.get("versions") or {}).get("git_commit")
    if commit:
        parts.append(f"commit {str(commit)[:12]}")
    if m.get("started_at"):
        parts.append(f"started {m['started_at']}")
    return " · ".join(parts)


def banner_markdown(manifest: Mapping[str, Any], *, title: str | None = None) -> str:
    """The banner as Markdown (for `.md` outputs): a bold heading line, then the
    provenance lines."""
    head = f"**{_heading(manifest)}**"
    if title:
        head += f" — {title}"
    return "\n".join([head, "", *(f"{line}  " for line in provenance_lines(manifest))]) + "\n"


def banner_html(manifest: Mapping[str, Any], *, title: str | None = None) -> str:
    """The banner as an HTML block: the device heading first (bold, coloured border per
    kind), then the provenance block in small type."""
    from residency import devices

    kind = str(manifest.get("device_kind") or "")
    colour = (devices.REGISTRY[kind].banner_colour if kind in devices.REGISTRY
              else devices.DeviceKind.banner_colour)  # an unknown kind: the default grey
    head = html.escape(_heading(manifest))
    if title:
        head += f" — {html.escape(title)}"
    prov = "<br>".join(html.escape(line) for line in provenance_lines(manifest))
    return (f'<div class="{BANNER_CLASS}" data-device-kind="{html.escape(kind)}" '
            f'style="border-left:6px solid {colour};padding:6px 12px;margin:0 0 12px 0;'
            f'background:#f9fafb">'
            f'<div class="{BANNER_CLASS}-heading" style="font-weight:bold;font-size:1.15em">'
            f"{head}</div>"
            f'<div class="{BANNER_CLASS}-provenance" style="font-size:0.85em;color:#374151">'
            f"{prov}</div></div>")


def live_manifest(device_kind: str, *, versions: Mapping[str, Any],
                  design: str = "live probe", started_at: str | None = None
                  ) -> dict[str, Any]:
    """A manifest-shaped dict for a report of something run now rather than a recorded run
    (the API probe): device kind, `versions` (python, torch, torch_npu, residency,
    git_commit), this host, start (default: now) and end (now)."""
    import platform
    from datetime import timezone

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"device_kind": device_kind, "design": design, "versions": dict(versions),
            "host": platform.node(), "started_at": started_at or now, "ended_at": now}


def display_banner(manifest: Mapping[str, Any], *, title: str | None = None) -> None:
    """Display the banner in a notebook (HTML, Markdown fallback) with `BANNER_METADATA`."""
    from IPython.display import display

    bundle = {"text/html": banner_html(manifest, title=title),
              "text/markdown": banner_markdown(manifest, title=title),
              "text/plain": banner_line(manifest)}
    display(bundle, raw=True, metadata={BANNER_METADATA: True})
