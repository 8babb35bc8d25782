"""The house types of the run-record schemas and their one check: `validate` reads a parsed JSON
value as a format's msgspec schema, every failure one `RunDirError` naming the file, line and
field.

The types say what a number is (`Int64`, `Count`: an int64 >= 0, `Finite`, `FiniteCount`: a
finite float >= 0); each format module declares its records with them (`msgspec.Struct`),
reads through `validate` and writes what validates.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from residency.records.files import RunDirError, printable

__all__ = ["Count", "Finite", "FiniteCount", "Int64", "schema_error", "validate"]

_MAX_FLOAT = sys.float_info.max
_INT64_MAX = 2**63 - 1
Int64 = Annotated[int, msgspec.Meta(ge=-_INT64_MAX - 1, le=_INT64_MAX)]
"""An integer in [-2**63, 2**63)."""
Count = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
"""An integer in [0, 2**63): nanoseconds, bytes, counts, indexes."""
Finite = Annotated[float, msgspec.Meta(ge=-_MAX_FLOAT, le=_MAX_FLOAT)]
"""A finite number (NaN and the infinities fail both bounds)."""
FiniteCount = Annotated[float, msgspec.Meta(ge=0, le=_MAX_FLOAT)]
"""A finite number >= 0 (seconds)."""

T = TypeVar("T")

# msgspec's words for the bounds above, in the house's
_WORDS = (
    (f"`int` <= {_INT64_MAX}", "`int` < 2**63"),
    (f"`int` >= {-_INT64_MAX - 1}", "`int` >= -2**63"),
    (f"`float` >= {-_MAX_FLOAT!r}", "a finite `float`"),
    (f"`float` <= {_MAX_FLOAT!r}", "a finite `float`"),
    ("`float` >= 0.0", "a finite `float` >= 0"),  # (FiniteCount: NaN fails this bound)
)
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_NAMED = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<name>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[([^\]]*)\]")


def _at(value: Any, path: str) -> tuple[bool, Any]:
    """(found, the value) at a msgspec path (`.a[0].b`) inside `value`."""
    for m in _STEP.finditer(path):
        key, index, other = m.groups()
        try:
            if index is not None and isinstance(value, list):
                value = value[int(index)]
            else:
                value = value[key if key is not None else (index or other)]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, value


def _literal_values(schema: Any, path: str) -> list[Any] | None:
    """The values the `Literal` at a msgspec path (`.a[0].b`) of `schema` allows (None when
    the path leads to none)."""
    import msgspec.inspect as mi

    types = [mi.type_info(schema)]
    for m in _STEP.finditer(path):
        key = m.group(1)
        nxt: list[Any] = []
        for t in types:
            for u in (t.types if isinstance(t, mi.UnionType) else (t,)):
                if key is not None and isinstance(u, mi.StructType):
                    nxt += [f.type for f in u.fields if f.encode_name == key]
                elif key is None and isinstance(u, (mi.ListType, mi.TupleType)):
                    nxt.append(u.item_type)
                elif isinstance(u, mi.DictType):
                    nxt.append(u.value_type)
        types = nxt
    for t in types:
        for u in (t.types if isinstance(t, mi.UnionType) else (t,)):
            if isinstance(u, mi.LiteralType):
                return list(u.values)
    return None


def schema_error(path: Path, exc: msgspec.ValidationError, value: Any, *, where: str = "",
                 prefix: str = "", schema: Any = None) -> RunDirError:
    """The `RunDirError` for `exc`, raised validating `value` (read from `path`): the field
    as a dotted path (`prefix` first), msgspec's sentence in the house's words, with the value
    found (`where`, e.g. "line 3: ", leads the message)."""
    m = _AT.match(str(exc))
    msg, at = (m.group("msg"), m.group("path") or "") if m else (str(exc), "")
    named = _NAMED.match(msg)
    if named:  # a missing or unknown field: the field is the one named
        at = f"{at}.{named.group('name')}"
        msg = "missing" if "missing" in msg else "is not a field of this format"
    else:
        for theirs, ours in _WORDS:
            msg = msg.replace(theirs, ours)
        msg = msg[:1].lower() + msg[1:]
        allowed = (_literal_values(schema, at) if schema is not None
                   and msg.startswith("invalid enum value") else None)
        if allowed is not None:  # a Literal's value
            msg = f"must be one of {allowed}"
        found, got = _at(value, at)
        if found and ", got " not in msg:
            msg += f", got {printable(repr(got))}"[:200]
    field = (prefix + at.lstrip(".")) or None
    return RunDirError(path, f"{where}{msg}"[:400], field=field)


def validate(path: Path, value: Any, schema: type[T], *, where: str = "",
             prefix: str = "") -> T:
    """`value` (a parsed JSON value read from `path`) as `schema`; `RunDirError` naming the
    file, `where` (e.g. the line) and the field otherwise (`schema_error`)."""
    try:
        return msgspec.convert(value, schema, strict=True)
    except msgspec.ValidationError as exc:
        raise schema_error(path, exc, value, where=where, prefix=prefix,
                           schema=schema) from None
