"""Stand-in for vLLM-Omni's general-plugin loading: every worker calls each function of the
`vllm_omni.general_plugins` entry-point group once before it builds the model; when
`VLLM_PLUGINS` is set (comma-separated names), only the plugins it names load."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

GROUP = "vllm_omni.general_plugins"


def load_omni_general_plugins() -> list[str]:
    """Call every allowed plugin of the group; returns the names loaded."""
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
    loaded = []
    for point in entry_points(group=GROUP):
        if names is not None and point.name not in names:
            continue
        point.load()()
        loaded.append(point.name)
    return loaded
