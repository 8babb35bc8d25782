"""Checks over text people read (shared by tests, never a test module itself): one figure
shown with two roundings, a sentence said twice on one page, the text a reader sees in HTML,
numbers shown with too many digits."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from residency import humanize

__all__ = ["LABEL", "NUMBER", "BodyTags", "repeated_sentences", "too_precise", "two_roundings",
           "visible_text"]

NUMBER = re.compile(r"(?<![\w.#^/:-])([+-]?\d+(?:\.\d+)?)(?:e([+-]\d+))?(?![\w.]*\d)")
# the host's load readings (shown once, in the loaded-host sentence): environment, not a figure
# of the evidence; their digits can meet any figure's by chance (1.78 and a run's 1.778 s)
_HOST_LOAD = re.compile(r"load average .*?\.(?=\s|$)", re.S)
_UNIT = re.compile(r"\s?(ms|us|ns|s|%|pp|x|GiB|MiB|KiB|GB|MB|B)(?![\w])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*])")


def _digits(token: str) -> int:
    return len(token.lstrip("+-").replace(".", "").lstrip("0")) or 1


def _exact_fraction(token: str) -> bool:
    """`token` is k / 2^n exactly (n <= 16): the p-values of exact sign-flip and signed-rank
    tests (0.0625, 0.03125), shown in full because they are exact, not a rounding."""
    value = abs(float(token))
    return 0 < value < 1 and (value * 2 ** 16).is_integer()


def two_roundings(texts: list[str], exempt: set[str] = frozenset()) -> list[tuple[str, str]]:
    """Pairs of number texts that are one figure at two roundings: a shorter text (3 or more
    significant digits, not an integer, not an exact k / 2^n) that the longer one rounds to,
    e.g. "4.98" and "4.979", "0.1313" and "0.13125", with the same unit after them (a load
    average of 3.16 is not the published 3.164550 ms). (`humanize.sig` keeps a measured
    value's trailing zeros, so a shorter text is either exact or a second rounding.)"""
    found: set[tuple[str, str]] = set()
    for text in texts:
        text = _HOST_LOAD.sub(" ", text)
        for m in NUMBER.finditer(text):
            token = m.group(1).lstrip("+")
            unit = _UNIT.match(text, m.end())
            if "." in token and token.lstrip("-") not in exempt:
                found.add((token, unit.group(1) if unit else ""))
    out = []
    for short, short_unit in found:
        for long, long_unit in found:
            if short_unit != long_unit:
                continue
            if short == long or _digits(short) < 3 or _digits(long) <= _digits(short):
                continue
            if short.startswith("-") != long.startswith("-"):
                continue
            if _exact_fraction(short):  # an exact-test p-value (k / 2^n) prints exactly
                continue
            if humanize.sig(float(long), _digits(short)) == short:
                out.append((short, long))
    return sorted(out)


def repeated_sentences(text: str, *, min_words: int = 6) -> list[str]:
    """Sentences (of at least `min_words` words) said more than once in `text`, table rows
    (lines starting with "|") aside."""
    seen: dict[str, int] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            continue
        for sentence in _SENTENCE_END.split(line):
            s = " ".join(sentence.strip("* ").split())
            s = re.sub(r"^\*\*[^*]+\*\*:?\s*", "", s)  # a bold label before the sentence
            if len(s.split()) >= min_words:
                seen[s] = seen.get(s, 0) + 1
    return [s for s, n in seen.items() if n > 1]


LABEL = "emulated NPU — not an NPU measurement"  # the emulated NPU's label in every view
_PLAIN_NUMBER = re.compile(r"(?<![\w.])-?(\d+(?:\.\d+)?)(?![\w.]*\d)")


class BodyTags(HTMLParser):
    """Every start tag of a page's body, with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.in_body = False
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.in_body = self.in_body or tag == "body"
        if self.in_body:
            self.tags.append((tag, {k: v or "" for k, v in attrs}))


class VisibleText(HTMLParser):
    """The text a reader sees, in order (no head, script, style or template)."""

    HIDDEN = {"head", "script", "style", "template", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hidden = 0
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.hidden += tag in self.HIDDEN

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in self.HIDDEN and self.hidden > 0

    def handle_data(self, data: str) -> None:
        if not self.hidden and data.strip():
            self.texts.append(data.strip())


def visible_text(html: str) -> list[str]:
    parser = VisibleText()
    parser.feed(html)
    return parser.texts


def significant_digits(token: str) -> int:
    digits = token.lstrip("-").replace(".", "").lstrip("0")
    if "." not in token:
        digits = digits.rstrip("0")
    return len(digits)


def too_precise(text: str, limit: int = 6) -> list[str]:
    """Numbers in `text` with more than `limit` significant digits (identifiers such as
    hashes, timestamps glued to letters, and dates are not numbers here)."""
    return [m.group(1) for m in _PLAIN_NUMBER.finditer(text)
            if significant_digits(m.group(1)) > limit]
