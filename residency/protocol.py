"""The HTTP API between the built-in workload service and its clients: the request fields'
limits both sides check (`POST /v1/generate`)."""

from __future__ import annotations

MAX_STEPS = 10_000  # `steps` accepted by POST /v1/generate: 1..MAX_STEPS
MAX_SEED = 2**53 - 1  # `seed`: 0..MAX_SEED (exact in every JSON client)

__all__ = ["MAX_SEED", "MAX_STEPS"]
