"""Numbers and headers for people: what reports, tables and figures show.

The suite's one owner of numbers people read: prose, notes, rendered tables, figure labels,
the first screen and the pull-request block all format through these functions, so a figure
has one text in every view. They show 4 significant digits (`sig`), never the float
artefacts of a sum (``1.734383532999999``) nor nanosecond digits printed as milliseconds; a
change carries its sign (`signed`, `change_percent`: "+4.979 %"); a range one dash
(`span_text`, `percent_span`: "63.06–100 %"); a ratio pyperf's words (`ratio_text`); a
p-value `p_text`. CSV and JSON keep full precision and are not formatted here. Headers read as words
(`header`), a table has no index column and no raw dict or list in a cell (`for_people`).
Run-supplied text stays inert wherever it lands: Markdown (`md_text`, `write_markdown_table`:
no tag, link or autolink) and CSV (`csv_text`, the suite's one CSV writer: no cell a
spreadsheet would run as a formula). No torch, no plotting.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DIGITS = 4  # significant digits shown to people
MISSING = "—"  # a value one side lacks
_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_UNIT_SUFFIXES = {  # name suffix -> unit shown in a header
    "_ns": "ns", "_us": "µs", "_ms": "ms", "_s": "s", "_bytes": "bytes", "_mib": "MiB",
    "_pct": "%", "_fraction": "fraction of total",
}
_WORDS = {  # whole-word replacements in headers
    "e2e": "E2E", "oom": "OOM", "npu": "NPU", "cuda": "CUDA", "id": "ID", "mib": "MiB",
    "max": "max", "min": "min",
}

__all__ = ["DASH", "DIGITS", "MISSING", "bytes_text", "cell", "change_percent", "count_text",
           "csv_cell", "csv_comment", "csv_text", "duration_text", "for_people",
           "header", "html_table", "markdown_table", "markdown_table_in_full", "md_code",
           "md_line", "md_text",
           "full_number", "ms_from_ns", "p_text", "pair_names", "published_percent", "percent",
           "percent_span", "quantity",
           "ratio_text", "round_numbers", "sig", "signed", "span_text", "speed_text",
           "write_csv",
           "write_markdown_table"]


# Markdown punctuation, "@" and the ":" of "://": escaped, so that no URL or e-mail address is
# left for an autolinker (mistune's url plugin in nbconvert, GitHub's extension); a link of any
# other scheme ("javascript:") needs the brackets escaped here.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]{}()!|~@]|:(?=//))")
_WWW = re.compile(r"(?i)\b(www)\.")  # GitHub autolinks "www." without a scheme


def md_text(value: Any) -> str:
    """`value` (run-supplied: a host name, a command, a version answer) as inert Markdown
    text: one line, HTML metacharacters as entities, Markdown punctuation, "@" and the ":" of
    "://" backslash-escaped (and "www." as "www\\."), so that no tag, link, autolink, image or
    emphasis of the value reaches a rendered report."""
    text = " ".join(str(value).split())  # newlines, \r, tabs and U+2028 become one space
    text = html.escape(text, quote=False)
    return _WWW.sub(r"\1\\.", _MD_SPECIAL.sub(r"\\\1", text))


_BACKTICKS = re.compile(r"`+")


def md_code(value: Any) -> str:
    """`value` (run-supplied) as inline code in Markdown, the suite's one code style: a
    backtick code span (as GitHub and nbconvert render it), on one line, fenced by one
    backtick more than the longest run of backticks in the value (so none closes it early)
    and padded with a space where the value starts or ends with a backtick. Inside a code
    span no Markdown, tag or link is interpreted."""
    text = " ".join(str(value).split()) or " "
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def duration_text(seconds: float) -> str:
    """The suite's one duration for people: "45 s", "3 min 05 s", "1 h 02 min"."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _is_missing(x: Any) -> bool:
    if x is None or x is pd.NA or x is pd.NaT:
        return True
    return isinstance(x, (float, np.floating)) and math.isnan(float(x))


def sig(x: float | int, digits: int = DIGITS) -> str:
    """`x` with `digits` significant digits: 1.734383532999999 -> "1.734", 2248.795837 ->
    "2249", 221.29668 -> "221.3", 0.000123456 -> "0.0001235", 50.8999 -> "50.90" (a
    trailing zero is a digit shown, so one column never mixes "2.1" and "3.05"); a value
    that is exactly a shorter number prints as that: 0.25 -> "0.25", 100.0 -> "100".
    Integers up to 10^digits print whole; larger magnitudes round to whole numbers below
    10^6 and use an exponent from there ("1.235e+07"). None and NaN print as "—"."""
    if _is_missing(x):
        return MISSING
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    v = float(x)
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == 0:
        return "0"
    mag = abs(v)
    if mag >= 10 ** digits:
        return f"{v:.{digits - 1}e}" if mag >= 1e6 else str(int(round(v)))
    if mag < 1e-4:
        return f"{v:.{digits - 1}e}"
    exp = math.floor(math.log10(mag))
    decimals = max(0, digits - 1 - exp)
    text = f"{round(v, decimals):.{decimals}f}"
    if "." in text:  # trailing zeros are digits of a measured value: "50.90", never "50.9"
        short = text.rstrip("0").rstrip(".")
        exact = type(x)(short) if isinstance(x, np.floating) else float(short)
        if exact == x:  # ... unless the value is that shorter number exactly (in its own
            text = short  # type: np.float32(0.1) is 0.1): 0.25 -> "0.25"
    return "0" if text in ("-0", "") else text


_DECIMAL = re.compile(r"(?<![\w.#^])(-?\d+\.\d+)(?![\w.]*\d)")


def round_numbers(text: str, digits: int = DIGITS) -> str:
    """`text` with every decimal number of more than `digits` significant digits shown with
    `digits` ("2248.795837 s" -> "2249 s", "216.822-251.161 ms" -> "216.8-251.2 ms");
    integers and numbers inside identifiers ("00-baseline", "2r50s", "#8129", a hash) are
    left alone. For text built elsewhere at full precision (notes, published cells)."""
    def one(m: re.Match[str]) -> str:
        token = m.group(1)
        sig_digits = len(token.lstrip("-").replace(".", "").lstrip("0"))
        return token if sig_digits <= digits else sig(float(token), digits)

    return _DECIMAL.sub(one, str(text))


def quantity(x: float | int | None, unit: str = "", digits: int = DIGITS, *,
             sign: bool = False) -> str:
    """`x` with its unit: quantity(221.29668, "ms") -> "221.3 ms"; "—" when missing; `sign`
    puts "+" before a positive value (a change: `signed`)."""
    if _is_missing(x):
        return MISSING
    text = sig(x, digits)
    if sign and float(x) > 0:
        text = "+" + text
    return f"{text} {unit}".rstrip()


def count_text(n: int, word: str, plural: str | None = None) -> str:
    """A count with its noun in the right number: count_text(1, "rank") -> "1 rank",
    count_text(2, "rank") -> "2 ranks"."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def pair_names(profiled: int, unprofiled: int) -> tuple[list[str], list[str]]:
    """How every view names the pairs of a run: the unprofiled pairs "1".."K" (pair i = the
    i-th unprofiled run of each arm, as the statistical notes number them) and the profiled
    pair "profiled pair" ("profiled pair 1", ... when there are several)."""
    prof = (["profiled pair"] if profiled == 1 else
            [f"profiled pair {i}" for i in range(1, profiled + 1)])
    return prof, [str(i) for i in range(1, unprofiled + 1)]


def signed(x: float | int | None, unit: str = "", digits: int = DIGITS) -> str:
    """A change for people: "+" before a positive value, "-" before a negative one:
    signed(4.2, "ms") -> "+4.2 ms", signed(-0.19152, "s") -> "-0.1915 s", signed(0) -> "0"."""
    return quantity(x, unit, digits, sign=True)


def change_percent(fraction: float | None, digits: int = DIGITS) -> str:
    """A relative change as a signed percentage: 0.049791 -> "+4.979 %", -0.2165 ->
    "-21.65 %"; "—" when missing or not finite."""
    if _is_missing(fraction) or not math.isfinite(float(fraction)):  # type: ignore[arg-type]
        return MISSING
    return signed(100 * float(fraction), "%", digits)  # type: ignore[arg-type]


def ratio_text(baseline: float, candidate: float, digits: int = DIGITS) -> str:
    """How the candidate compares with the baseline as a duration ratio (pyperf's words):
    "860.7x faster" (candidate below baseline), "1.05x slower", "no change", or "ratio
    undefined" when either is not positive."""
    b, c = float(baseline), float(candidate)
    if b == c:
        return "no change"
    if b <= 0 or c <= 0 or not (math.isfinite(b) and math.isfinite(c)):
        return "ratio undefined"
    return f"{sig(b / c, digits)}x faster" if c < b else f"{sig(c / b, digits)}x slower"


def speed_text(ratio: float | None, digits: int = DIGITS) -> str:
    """pyperf's wording for a duration ratio candidate/baseline (`ratio_text` of 1 against
    `ratio`): 1/599.9 -> "599.9x faster"; "ratio undefined (baseline is 0)" for None or a
    ratio that is not finite, "candidate is 0" for 0."""
    if ratio is None or not math.isfinite(ratio):
        return "ratio undefined (baseline is 0)"
    if ratio == 0.0:
        return "candidate is 0"
    return ratio_text(1.0, ratio, digits)


def full_number(x: float) -> str:
    """A number at full precision for machines and logs, not for people: at most 6 decimals
    and no trailing zeros (ns resolution in ms): 12.5 -> "12.5", 3.0 -> "3"."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6f}".rstrip("0").rstrip(".")


def published_percent(x: float) -> str:
    """A published change in %, at the precision the publication uses: 2 decimals (-0.19 %,
    -54.17 %), 2 significant digits below 0.1 % (-0.0097 %); "+" before a positive one."""
    text = f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.2g}"
    return f"{'+' if x > 0 else ''}{text} %"


def p_text(p: float | None, digits: int = DIGITS) -> str:
    """A p-value for people: 0.001953125 -> "0.001953", 0.25 -> "0.25"; "—" when missing."""
    return sig(p, digits)


DASH = "–"  # the one dash between the ends of a range people read


def percent_span(lo: float | None, hi: float | None, digits: int = DIGITS) -> str:
    """A range of fractions as percentages, e.g. a Clopper-Pearson interval: (0.6306, 1.0)
    -> "63.06–100 %"."""
    if _is_missing(lo) or _is_missing(hi):
        return MISSING
    return span_text(100 * float(lo), 100 * float(hi), "%", digits)  # type: ignore[arg-type]


def ms_from_ns(ns: int | float | None, digits: int = DIGITS) -> str:
    """Nanoseconds shown as milliseconds: 61428477 -> "61.43 ms"."""
    return MISSING if _is_missing(ns) else quantity(float(ns) / 1e6, "ms", digits)


def span_text(lo: float | None, hi: float | None, unit: str, digits: int = DIGITS) -> str:
    """A range of values: span_text(216.822, 251.161, "ms") -> "216.8–251.2 ms" (one value
    when both ends print alike)."""
    if _is_missing(lo) or _is_missing(hi):
        return MISSING
    a, b = sig(lo, digits), sig(hi, digits)
    return f"{a} {unit}".rstrip() if a == b else f"{a}{DASH}{b} {unit}".rstrip()


def bytes_text(n: int | float | None, digits: int = DIGITS) -> str:
    """A byte count in binary units: 805306368 -> "768 MiB", 1887440896 -> "1.758 GiB",
    0 -> "0 B"."""
    if _is_missing(n):
        return MISSING
    v = float(n)
    for unit, size in _BINARY:
        if abs(v) >= size:
            return f"{sig(v / size, digits)} {unit}"
    return f"{int(v)} B"


def percent(fraction: float | None, digits: int = DIGITS) -> str:
    """A fraction as a percentage: 0.25 -> "25 %", 1/3 -> "33.33 %"."""
    return MISSING if _is_missing(fraction) else f"{sig(float(fraction) * 100, digits)} %"


def header(name: Any) -> str:
    """A column name as words with its unit: "normal_checks" -> "normal checks",
    "e2e_s" -> "E2E (s)", "max_cached_fraction" -> "max cached (fraction of total)".
    Names that already hold spaces are kept."""
    text = str(name)
    if " " in text or not text:
        return text
    unit = ""
    for suffix, shown in _UNIT_SUFFIXES.items():
        if text.lower().endswith(suffix) and len(text) > len(suffix):
            text, unit = text[: -len(suffix)], shown
            break
    words = [_WORDS.get(w.lower(), w) for w in re.split(r"[_\s]+", text) if w]
    out = " ".join(words)
    return f"{out} ({unit})" if unit else out


def cell(x: Any, digits: int = DIGITS) -> str:
    """One table cell as text: numbers with `digits` significant digits (integers whole, and
    decimals inside text too: `round_numbers`), missing values as "—", a mapping as "key
    value, ..." and a sequence as "a, b"."""
    if isinstance(x, Mapping):
        return ", ".join(f"{header(k)} {cell(v, digits)}" for k, v in x.items()) or MISSING
    if isinstance(x, (list, tuple, np.ndarray)):
        return ", ".join(cell(v, digits) for v in x) or MISSING
    if _is_missing(x):
        return MISSING
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return sig(float(x), digits)
    return round_numbers(str(x), digits)


_CHANGE_COLUMN = re.compile(r"(?i)(?<![a-z])(?:delta|change)(?![a-z])|−|(?<![a-z])vs own")


def _signed_cell(digits: int) -> Any:
    def one(v: Any) -> str:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
            return cell(v, digits)
        return signed(v, "", digits)
    return one


def for_people(df: pd.DataFrame, *, digits: int = DIGITS,
               headers: Mapping[str, str] | None = None,
               formats: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """`df` as a table of text for people: a named index becomes columns (an unnamed
    range index is dropped), headers read as words (`headers` overrides), every cell through
    `cell` or the column's own formatter in `formats` (column -> callable); a numeric column
    of changes (its name says "delta", "change", "vs own" or "−") shows its sign: "+9.512".
    Attributes (`attrs`) are kept."""
    frame = df
    if any(n is not None for n in frame.index.names):
        frame = frame.reset_index()
    else:
        frame = frame.reset_index(drop=True)
    formats = dict(formats or {})
    for col in frame.columns:  # a change carries its sign in every table
        if col not in formats and _CHANGE_COLUMN.search(str(col)):
            formats[col] = _signed_cell(digits)
    out = pd.DataFrame({
        col: [formats[col](v) if col in formats and not _is_missing(v) else cell(v, digits)
              for v in frame[col].tolist()] for col in frame.columns})
    names = dict(headers or {})
    out.columns = [names.get(str(c), header(c)) for c in frame.columns]
    out.attrs.update(df.attrs)
    return out


_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
# In a cell: backslashes and pipes; a "]" that would close a link's text ("](", "]["); the ":"
# of "://" and every "@", for autolinkers. Other brackets render as themselves already.
_MD_CELL_SPECIAL = re.compile(r"([\\|@]|\](?=[(\[])|:(?=//))")


def _md_cell(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    text = _LINE_BREAKS.sub(" ", str(x))  # \r, \n, U+2028 ... would end the row
    text = text.replace("<", "&lt;").replace(">", "&gt;")  # no tag: both angle brackets alike
    text = _MD_CELL_SPECIAL.sub(r"\\\1", text)  # no link
    return _WWW.sub(r"\1\\.", text)


def md_line(value: Any) -> str:
    """`value` (run-supplied) inert in a Markdown line that is not a table's (a heading): as
    a table cell has it, so that brackets and parentheses read as themselves and no tag,
    link or autolink opens."""
    return _md_cell(value)


def write_markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """The one Markdown-table writer of the suite: header row, separator, one line per row
    (line breaks flattened, None/NaN empty, a cell's text inert: `<` and `>` as entities so
    no tag opens; backslashes, pipes, a "]" before "(" or "[", the ":" of "://", "@" and "www."
    backslash-escaped so that it neither splits its row nor renders as a link, image or
    autolink)."""
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def markdown_table(df: pd.DataFrame, **kwargs: Any) -> str:
    """`df` for people (`for_people`) as a Markdown table."""
    t = for_people(df, **kwargs)
    return write_markdown_table(list(t.columns), list(t.itertuples(index=False)))


def markdown_table_in_full(df: pd.DataFrame) -> str:
    """`df` as a Markdown table with every cell in full, as `str` gives it (no rounding, no
    header words; a named index becomes columns)."""
    if any(n is not None for n in df.index.names):
        df = df.reset_index()
    return write_markdown_table([str(c) for c in df.columns], list(df.itertuples(index=False)))


_NUMBER_CELL = re.compile(r"[-+−]?[\d.,]+(?:e[+-]\d+)?(?:\s?[%\w/µ]{0,5})?")


def _wrap(text: str) -> str:
    """A cell's wrapping: a number (with a short unit) never breaks ("6.300e-05" stays on
    one line beside a long kernel name); other text wraps anywhere, so a long path or
    exception message never runs past the page."""
    return "white-space:nowrap" if _NUMBER_CELL.fullmatch(text) else "overflow-wrap:anywhere"


def html_table(df: pd.DataFrame, *, caption: str | None = None,
               align: Sequence[str] | None = None, **kwargs: Any) -> str:
    """`df` for people (`for_people`) as an HTML table without an index column; `align`:
    one of left/right/center per column (default: left for the first, right for the rest).
    Text cells wrap anywhere, so a long path or exception message never runs past the page;
    number cells never break."""
    t = for_people(df, **kwargs)
    cols = list(t.columns)
    align = list(align or ["left", *(["right"] * (len(cols) - 1))])
    parts = ['<table class="residency-table">']
    if caption:
        parts.append(f"<caption>{html.escape(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(
        f'<th style="text-align:{a}">{html.escape(str(c))}</th>'
        for c, a in zip(cols, align, strict=False)) + "</tr></thead><tbody>")
    for row in t.itertuples(index=False):
        parts.append("<tr>" + "".join(
            f'<td style="text-align:{a};{_wrap(str(v))}">{html.escape(str(v))}</td>'
            for v, a in zip(row, align, strict=False)) + "</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


# ----------------------------------------------------------------------------- CSV
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # OWASP: what a spreadsheet runs as a formula
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_CSV_ROW_END = re.compile(r'("(?:[^"]|"")*")|\r\n')  # a quoted field, or a row's end


# a signed number and words after it ("-50.8 ms delta (599.90x faster)"): no call, reference
# to another application or string a formula needs
_SIGNED_FIGURE = re.compile(r"[+-][\d.][^=|!@\"]*")
_CALL = re.compile(r"[A-Za-z_]\(")


def csv_cell(value: Any) -> Any:
    """`value` safe as a spreadsheet cell: text starting with `=`, `+`, `-`, `@`, a tab or a
    carriage return gets a leading single quote (OWASP's CSV-injection neutralisation), so
    that no run-supplied name opens as a live formula; a plain number ("-0.18"), a signed
    figure with its words ("-50.8 ms delta (-12.3 %)": no `=`, `|`, `!`, `@`, quote or call)
    and every non-text value are returned unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not (
            _PLAIN_NUMBER.fullmatch(value)
            or (_SIGNED_FIGURE.fullmatch(value) and not _CALL.search(value))):
        return "'" + value
    return value


def _is_text_column(col: pd.Series) -> bool:
    dtype = col.dtype
    return (pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype)
            or isinstance(dtype, pd.CategoricalDtype))


def csv_text(frame: pd.DataFrame) -> str:
    """`frame` as CSV text, the suite's one CSV writer: header row, no index, numbers at full
    precision, "\\n" line ends, every text cell and header through `csv_cell`, and any cell
    holding a line break (CR included) quoted. `frame` is not changed."""
    safe = frame.copy(deep=False)
    for i in range(safe.shape[1]):
        col = safe.iloc[:, i]
        if _is_text_column(col):
            safe.isetitem(i, col.astype(object).map(csv_cell))
    if not isinstance(safe.columns, pd.MultiIndex):
        safe.columns = [csv_cell(c) for c in safe.columns]
    # Written with "\r\n" so that a bare CR inside a cell is quoted too (it would start a row
    # in a spreadsheet), then each row's end outside a quoted field made "\n".
    text = safe.to_csv(index=False, lineterminator="\r\n")
    return _CSV_ROW_END.sub(lambda m: m.group(1) or "\n", text)


def write_csv(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write `frame` as `csv_text` (UTF-8) to `path`; returns the path."""
    out = Path(path)
    out.write_text(csv_text(frame), encoding="utf-8")
    return out


def csv_comment(text: Any) -> str:
    """`text` as one `# ` comment line of a CSV text: its line breaks flattened, so that no
    part of it starts a row of its own."""
    return "# " + _LINE_BREAKS.sub(" ", str(text))
