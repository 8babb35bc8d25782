"""Trace times to int64 nanoseconds, exactly: microseconds given as int, float64 or decimal text.

Every reader of a trace file converts through here (`residency.traces.kineto`,
`residency.traces.ascend_text`, `residency.traces.ascend`, `residency.traces.memory`): nearest
nanosecond, ties away from zero, as the number's decimal text gives it. A float64 is used
directly only where it resolves the nanosecond (`exact_floats`).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

import numpy as np

__all__ = ["EXACT_FLOAT_US", "LIMIT_NS", "decimal_text_to_ns", "decimal_us_to_ns",
           "exact_floats", "floats_to_ns", "us_to_ns"]

EXACT_FLOAT_US = 2.0**49 / 1000  # float64 us below this: ns within 0.1 of the decimal's
LIMIT_NS = 2**62  # |times|, durations and bases must stay below: sums of two never overflow


def exact_floats(us: np.ndarray) -> bool:
    """Whether float64 microseconds give, rounded, the ns their decimal text gives: small
    enough (the parse is within 0.1 ns) and not near a half-nanosecond tie. NaN (missing) is
    fine: it is rejected on both paths."""
    if not len(us):
        return True
    if not np.nanmax(np.abs(us), initial=0.0) < EXACT_FLOAT_US:
        return False
    ns = us * 1000
    return not bool((np.abs(ns - np.floor(ns) - 0.5) < 0.125).any())


def floats_to_ns(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.abs(us) < LIMIT_NS / 1000  # NaN, inf or out of range: no int64 to cast to
    return np.rint(np.where(ok, us, 0.0) * 1000).astype(np.int64), ok


def us_to_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond values (int, float or decimal text) to int64 ns, and which were numbers."""
    convert = {int: _ints_to_ns, float: _float_list_to_ns, str: decimal_text_to_ns}
    n = len(values)
    ns, ok = np.zeros(n, np.int64), np.zeros(n, bool)
    types = set(map(type, values))
    if len(types) == 1 and (only := types.pop()) in convert:
        return convert[only](values)
    code = {t: i for i, t in enumerate(convert, 1)}
    codes = np.fromiter((code.get(t, 0) for t in map(type, values)), np.int8, n)
    for i, fn in enumerate(convert.values(), 1):
        idx = np.flatnonzero(codes == i)
        if len(idx):
            ns[idx], ok[idx] = fn([values[k] for k in idx.tolist()])
    return ns, ok


def _ints_to_ns(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ok = np.array([abs(v) < 2**63 // 1000 for v in values], dtype=bool)
    return np.array([v if k else 0 for v, k in zip(values, ok, strict=True)], np.int64) * 1000, ok


def _float_list_to_ns(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return floats_to_ns(np.array(values, np.float64))


def decimal_text_to_ns(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Decimal microsecond text to int64 ns, exactly: nearest ns, ties away from zero.

    Text of one fixed layout (as torch-npu writes epoch microseconds, ``%.3f``) is parsed from
    its digits on a code matrix, with no float; anything else (other layouts, exponents,
    spaces, junk) goes through `Decimal` one value at a time."""
    n = len(values)
    ns, ok = np.zeros(n, np.int64), np.zeros(n, bool)
    widths, text = set(map(len, values)), "".join(values)
    if len(widths) == 1 and (width := widths.pop()) and text.isascii():
        c = np.frombuffer(text.encode(), np.uint8).reshape(n, width)
        point = values[0].find(".")
        point = width if point < 0 else point
        if point == width or bool((c[:, point] == 46).all()):
            ns, ok = _plain_decimal(c, point)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        ns[bad], ok[bad] = _decimal_one_by_one([values[i] for i in bad.tolist()])
    return ns, ok


def _plain_decimal(c: np.ndarray, point: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ASCII codes ``-?d+(.d+)?``, all with the decimal point (or end) at `point`;
    rows of another form are marked not ok. Works column by column (rows are short)."""
    n, width = c.shape
    u = c - np.uint8(48)  # a digit is 0..9; every other byte wraps above 9
    neg = c[:, 0] == 45  # '-'
    u[neg, 0] = 0
    cols = [u[:, j] for j in range(width) if j != point]
    top = np.maximum.reduce(cols) if cols else np.full(n, 255, np.uint8)
    ok = (top <= 9) & (point - neg >= 1) & (point <= 18) & (width != point + 1)
    us = np.zeros(n, np.int64)
    for j in range(point):
        us = us * 10 + u[:, j]
    ns = us * 1000
    for k, j in enumerate(range(point + 1, min(point + 4, width))):
        ns += u[:, j].astype(np.int64) * 10 ** (2 - k)
    if width > point + 4:
        ns += u[:, point + 4] >= 5  # the 4th fraction digit decides: ties away from zero
    ok &= us < 2**63 // 1000 - 1
    return np.where(neg, -ns, ns), ok


def _decimal_one_by_one(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    parsed = [decimal_us_to_ns(v) for v in values]
    return (np.array([0 if v is None else v for v in parsed], np.int64),
            np.array([v is not None for v in parsed], bool))


def decimal_us_to_ns(text: str) -> int | None:
    """Decimal microsecond text to int64 ns exactly; None when it is not a finite number or
    lies outside int64 ns."""
    try:
        us = Decimal(text)
    except InvalidOperation:
        return None
    if not us.is_finite() or (us and us.adjusted() > 18):  # |us| >= 1e19: out of range
        return None  # (a zero with any exponent, "0E20", is 0)
    # us * 1000 must not round before the rounding to ns: 28 digits (the default context)
    # hold 24 characters' worth; longer text gets a context with room for every digit
    scaled = us * 1000 if len(text) <= 24 else Context(prec=len(text) + 4).multiply(us, 1000)
    ns = int(scaled.to_integral_value(rounding=ROUND_HALF_UP))
    return ns if abs(ns) < 2**63 else None
