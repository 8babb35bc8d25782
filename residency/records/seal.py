"""The seal of a run: its format, written once when a run completes and checked on reading.

A run is *sealed* when it completes: `seal(manifest)` records, inside `manifest.json` (field
`SEAL_FIELD`), one sha256 per manifest field (each `runs[i]` entry on its own) and one digest
over the canonical manifest, which includes the sha256 of every artifact. So the digest
covers every byte of evidence and every field analysis reads. A digest kept inside the run
only catches careless edits; authors quote it (`sha256:...`) in the pull request, and
`residency verify RUN --digest sha256:...` checks a run against the quoted value.

Schema: `SealRecord` (msgspec; strict: an unknown field makes the seal malformed).
Format history: `{"algorithm": "sha256", "digest": "sha256:<hex>", "fields": {name: hex}}`
since sealing began; runs recorded before carry no seal (`seal_findings` says so).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import msgspec

__all__ = ["SEAL_ALGORITHM", "SEAL_FIELD", "SealRecord", "canonical_json", "parse_digest",
           "run_digest", "seal", "seal_findings"]

SEAL_FIELD = "seal"
SEAL_ALGORITHM = "sha256"


class SealRecord(msgspec.Struct, forbid_unknown_fields=True):
    """`manifest["seal"]`: the digest over the canonical manifest without its seal, and one
    sha256 per manifest field (`runs[i]` each on its own)."""

    algorithm: Literal["sha256"]  # (SEAL_ALGORITHM)
    digest: str  # "sha256:<hex>"
    fields: dict[str, str]


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON value (sorted keys, no spaces, ASCII, no NaN)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _sha(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def run_digest(manifest: dict[str, Any]) -> str:
    """`sha256:<hex>` over the canonical manifest without its seal (artifact digests
    included, so it covers every file of the run)."""
    body = {k: v for k, v in manifest.items() if k != SEAL_FIELD}
    return f"{SEAL_ALGORITHM}:{_sha(body)}"


def _field_digests(manifest: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in manifest.items():
        if key == SEAL_FIELD:
            continue
        if key == "runs" and isinstance(value, list):
            out["runs"] = _sha(len(value))
            out.update({f"runs[{i}]": _sha(entry) for i, entry in enumerate(value)})
        else:
            out[key] = _sha(value)
    return out


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """The seal to store under `manifest["seal"]` once the run is complete."""
    return msgspec.to_builtins(SealRecord(algorithm=SEAL_ALGORITHM,
                                          digest=run_digest(manifest),
                                          fields=_field_digests(manifest)))


def parse_digest(text: str) -> str:
    """A quoted digest normalised to `sha256:<hex>`; `ValueError` naming it otherwise."""
    value = text.strip().lower()
    if value.startswith(f"{SEAL_ALGORITHM}:"):
        value = value[len(SEAL_ALGORITHM) + 1:]
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"The value for `--digest` must be 'sha256:' and 64 hex digits, but "
                         f"{text!r} was passed.")
    return f"{SEAL_ALGORITHM}:{value}"


def seal_findings(manifest: dict[str, Any]) -> list[str]:
    """What changed in the manifest since it was sealed, one line per field (empty when the
    seal holds). A run without a seal yields one finding saying so."""
    recorded = manifest.get(SEAL_FIELD)
    if recorded is None:
        return ["manifest.json carries no seal (the run never completed, or predates sealing)"]
    try:
        record = msgspec.convert(recorded, SealRecord, strict=True)
    except msgspec.ValidationError as exc:
        return [f"manifest.json field `seal` is malformed ({exc})"]
    try:
        actual = _field_digests(manifest)
    except ValueError as exc:  # a non-finite number cannot have been sealed
        return [f"manifest.json holds a value that was never sealed ({exc})"]
    sealed = record.fields
    out = [f"manifest.json field `{k}` changed since the run was sealed"
           for k in sealed if k in actual and actual[k] != sealed[k]]
    out += [f"manifest.json field `{k}` removed since the run was sealed"
            for k in sealed if k not in actual]
    out += [f"manifest.json field `{k}` added since the run was sealed"
            for k in actual if k not in sealed]
    if not out and run_digest(manifest) != record.digest:
        out.append("manifest.json field `seal.digest` does not match the manifest")
    return out
