"""What HTML of a notebook a rendered report keeps.

A report shows an executed notebook's Markdown and HTML outputs; a notebook received from
someone else (or one whose outputs were edited) can hold any HTML. `REPORT_CSP` already stops
every script, frame, form and remote load, but not what needs none: a ``<meta http-equiv=
"refresh">`` that moves the reviewer to another page, a ``<style>`` or a positioned block
that draws a fake device banner over the real one, a ``<base>``. So every Markdown cell (after
its conversion to HTML), HTML or Markdown output and raw cell is cleaned here (nbconvert's
``sanitize_html`` hook, with this module's `clean_html` in place of nbconvert's own, which
would strip the tables' alignment and the banner's colour): the tags and attributes this
package's views write and Markdown renders are kept, any other tag is shown as text (not
acted on: a reviewer sees what was there), classes keep only the names in `ALLOWED_CLASSES`
(the page carries JupyterLab's stylesheet, whose classes would position a block over the
banner, ``jp-ModalCommandPalette``, or grey the page, ``jp-Dialog``), styles keep the layout
properties listed in `ALLOWED_CSS` (no position, transform, display, z-index or negative
margin: nothing can leave its place in the page) with no ``url()`` or other function but
colours and arithmetic (nothing loaded, not even an inline image), links go to ``http``,
``https``, ``mailto`` or a ``#`` fragment of the page, images are inline PNG, JPEG, GIF or
WebP. SVG outputs are drawn as images (``<img src="data:image/svg+xml...">``, nbconvert's
default), where no script, link or remote load of theirs acts.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["ALLOWED_CLASSES", "ALLOWED_CSS", "ALLOWED_TAGS", "clean_html"]

ALLOWED_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd",
    "li", "ol", "p", "pre", "s", "samp", "small", "span", "strong", "sub", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var",
})
ALLOWED_CSS = frozenset({
    "background", "background-color", "border", "border-bottom", "border-collapse",
    "border-color", "border-left", "border-right", "border-style", "border-top",
    "border-width", "color", "font-family", "font-size", "font-style", "font-variant",
    "font-weight", "line-height", "margin", "margin-bottom", "margin-left", "margin-right",
    "margin-top", "max-width", "min-width", "overflow-wrap", "padding", "padding-bottom",
    "padding-left", "padding-right", "padding-top", "text-align", "text-decoration",
    "vertical-align", "white-space", "width", "word-break",
})
# The classes the rendered HTML of the package's views and Markdown holds: this package's own
# (``residency-`` prefixed; no rule of the page's stylesheet names them), the headings' anchor
# links and Pygments' highlighting of a fenced code block (`_pygments_classes`: colours only).
# Any other name is dropped from the element, which stays.
ALLOWED_CLASSES = frozenset({"anchor-link", "highlight"})
_OWN_CLASS = re.compile(r"residency-[a-z0-9-]{1,64}\Z")
# functions a kept style may call: colours and arithmetic (no url(), image-set(), element())
_CSS_FUNCTIONS = frozenset({"rgb", "rgba", "hsl", "hsla", "hwb", "lab", "lch", "oklab",
                            "oklch", "color", "calc", "min", "max", "clamp", "var"})
_COMMON_ATTRIBUTES = frozenset({"class", "id", "title", "style", "lang", "dir"})
_TAG_ATTRIBUTES = {
    "a": frozenset({"href"}),
    "img": frozenset({"src", "alt", "width", "height"}),
    "td": frozenset({"colspan", "rowspan", "align"}),
    "th": frozenset({"colspan", "rowspan", "align", "scope"}),
    "ol": frozenset({"start", "type"}),
    "col": frozenset({"span"}),
    "colgroup": frozenset({"span"}),
}
_DATA_ATTRIBUTE = re.compile(r"data-[a-z0-9-]{1,64}\Z")
_HREF = re.compile(r"(?:https?://|mailto:|#)", re.IGNORECASE)
_IMAGE = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,", re.IGNORECASE)
_NEGATIVE = re.compile(r"(?:^|[\s(,])-")  # a value with a negative number in it


def _attribute_allowed(tag: str, name: str, value: str) -> bool:
    if name in _COMMON_ATTRIBUTES or _DATA_ATTRIBUTE.match(name):
        return True
    if name not in _TAG_ATTRIBUTES.get(tag, ()):
        return False
    if name == "href":
        return bool(_HREF.match(value.strip()))
    if name == "src":
        return bool(_IMAGE.match(value.strip()))
    return True


@functools.cache
def _pygments_classes() -> frozenset[str]:
    from pygments.token import STANDARD_TYPES

    return frozenset(name for name in STANDARD_TYPES.values() if name)


def _class_allowed(name: str) -> bool:
    return (name in ALLOWED_CLASSES or bool(_OWN_CLASS.match(name))
            or name in _pygments_classes())


def _loads(tokens: Any) -> bool:
    """Whether a CSS value calls ``url()`` or any function but `_CSS_FUNCTIONS`, at any
    depth."""
    for token in tokens or ():
        if token.type == "url" or (token.type == "function"
                                   and token.lower_name not in _CSS_FUNCTIONS):
            return True
        if _loads(getattr(token, "arguments", None) or getattr(token, "content", None)):
            return True
    return False


@functools.cache
def _class_filter() -> type:
    """An html5lib filter keeping, of every element's ``class``, the allowed names."""
    from bleach.html5lib_shim import Filter

    class _Classes(Filter):  # type: ignore[misc]
        def __iter__(self) -> Any:
            for token in super().__iter__():
                attrs = token.get("data") if token["type"] in ("StartTag", "EmptyTag") else None
                if attrs and (None, "class") in attrs:
                    kept = [c for c in attrs[(None, "class")].split() if _class_allowed(c)]
                    if kept:
                        attrs[(None, "class")] = " ".join(kept)
                    else:
                        del attrs[(None, "class")]
                yield token

    return _Classes


@functools.cache
def _css_sanitizer() -> Any:
    """bleach's CSS sanitizer of `ALLOWED_CSS`, which also drops a margin (or any allowed
    property) given a negative length (a block pulled up over the banner), and any declaration
    that calls ``url()`` or another function that loads (`_loads`)."""
    import tinycss2
    from bleach.css_sanitizer import CSSSanitizer

    class _Layout(CSSSanitizer):
        def sanitize_css(self, style: str) -> str:
            declarations = tinycss2.parse_declaration_list(super().sanitize_css(style))
            return tinycss2.serialize(
                [d for d in declarations if d.type != "declaration"
                 or not (_NEGATIVE.search(tinycss2.serialize(d.value))
                         or _loads(d.value))]).strip()

    return _Layout(allowed_css_properties=ALLOWED_CSS, allowed_svg_properties=())


def clean_html(fragment: str | bytes) -> str:
    """`fragment` with only `ALLOWED_TAGS` acting as markup (every other tag written out as
    text), their attributes, styles and links reduced to what the module docstring lists, and
    comments removed."""
    text = fragment.decode("utf-8", "replace") if isinstance(fragment, bytes) else str(fragment)
    from bleach.sanitizer import Cleaner

    return Cleaner(tags=ALLOWED_TAGS, attributes=_attribute_allowed,
                   protocols={"http", "https", "mailto", "data"}, strip=False,
                   strip_comments=True, css_sanitizer=_css_sanitizer(),
                   filters=[_class_filter()]).clean(text)
