"""Figures whose text is drawn as written: run-supplied text in a title, tick label, legend or
annotation (run folder names, rank and phase names) is never parsed as matplotlib mathtext,
where a ``$`` pair is a formula and an unbalanced one an error (a run folder ``00-b$^^$``
stopped the report)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["plain_text"]

F = TypeVar("F", bound=Callable[..., Any])


def plain_text(build: F) -> F:
    """`build` (returning a matplotlib Figure) with every text of its figure drawn as
    written."""
    @functools.wraps(build)
    def built(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            fig = build(*args, **kwargs)
        return fig
    return built  # type: ignore[return-value]
