"""A results page (`Page`) and the matching of a page against its quotes (`check_page`): what the results check
(`python -m results_check`, described in `results_check/__init__.py`) does for each page."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNCHECKED_NOTE = "no committed file holds them, so the results check does not cover them"
_MASK = "§"
# A number of the prose: digits with thousands commas or decimals, an exponent; not part of a word (Qwen2, bf16).
# A model size ("2.44M") or a count in thousands ("3.2k") is a number too; a dotted version ("0.2.0") is one number.
_NUMBER = re.compile(r"(?<![\w.§])\d+(?:[.,]\d+)*(?:e[-+]?\d+)?[kM]?(?![\w§]|[.,]\d)")
_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`]+`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_INFO_BOX = re.compile(r'^!!! info "How this (?:was|is) measured"\n(?:(?: {4}.*)?\n)+', re.M)
_HEADING = re.compile(r"^(#{1,6}) (.*)$", re.M)
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


@dataclasses.dataclass(frozen=True)
class Page:
    """One results page and what checks it.

    ``quotes(root)`` reads the committed files under ``root`` and returns the text the page must contain.
    ``settings``: phrases of the page whose numbers describe the setup (not checked against data, but every number
    outside a quote must be in one). ``unchecked``: heading → why its figures have no committed file (the section
    must contain `UNCHECKED_NOTE`). ``sections``: only these headings' sections are checked for coverage (a page that
    is mostly not results, the README); None: the whole page. ``info_box``: the page has a "How this was measured" box.
    """

    path: str
    quotes: Callable[[str], Iterable[str]]
    settings: Sequence[str] = ()
    unchecked: Mapping[str, str] = dataclasses.field(default_factory=dict)
    sections: Optional[Sequence[str]] = None
    info_box: bool = True


def normalize(text: str) -> str:
    """Whitespace runs as one space: a quote matches however the page wraps it."""
    return re.sub(r"\s+", " ", text).strip()


def _mask(text: str, pattern: re.Pattern, keep_whitespace: bool = True) -> str:
    def repl(match: re.Match) -> str:
        return "".join(c if c.isspace() and keep_whitespace else _MASK for c in match.group(0))

    return pattern.sub(repl, text)


def _sections(text: str) -> List[Tuple[str, int, int]]:
    """(heading, start, end) of each heading's section (up to the next heading of any level); the part before the
    first heading is ``""``."""
    marks = [(m.group(2).strip(), m.start()) for m in _HEADING.finditer(text)]
    starts = [("", 0)] + marks
    return [(h, s, starts[i + 1][1] if i + 1 < len(starts) else len(text)) for i, (h, s) in enumerate(starts)]


def prose_mask(page: Page, text: str) -> str:
    """``text`` with everything that is not checked prose replaced by `_MASK` (whitespace kept, so it normalizes to
    the same offsets as ``text``)."""
    masked = text
    for pattern in (_FENCE, _COMMENT, _INFO_BOX, _IMAGE, _INLINE_CODE, _LINK_TARGET):
        masked = _mask(masked, pattern)
    chars = list(masked)
    for heading, start, end in _sections(text):
        excluded = heading in page.unchecked or (page.sections is not None and heading not in page.sections)
        if excluded:
            for i in range(start, end):
                if not chars[i].isspace():
                    chars[i] = _MASK
    return "".join(chars)


def _find_all(haystack: str, needle: str) -> List[int]:
    found, start = [], haystack.find(needle)
    while start >= 0:
        found.append(start)
        start = haystack.find(needle, start + 1)
    return found


def check_page(page: Page, root: str = ROOT) -> List[str]:
    """The page's problems (empty: it agrees with its files): quotes not on the page (with the text they should
    have), numbers of the prose no quote or setting covers, an unchecked section without `UNCHECKED_NOTE`, an info
    box without command, version or machine, or with a commit hash."""
    with open(os.path.join(root, page.path)) as f:
        text = f.read()
    problems: List[str] = []
    if page.info_box:
        box = _INFO_BOX.search(text)
        if not box:
            problems.append('no "How this was measured" box')
        else:
            for field in ("**Command", "**Version:**", "**Machine:**"):
                if field not in box.group(0):
                    problems.append(f"the info box names no {field.strip('*:')}")
    hashes = COMMIT_HASH.findall(_mask(_mask(text, _LINK_TARGET), _COMMENT))
    if hashes:
        problems.append(f"commit hashes on the page: {sorted(set(hashes))}")
    for heading, why in page.unchecked.items():
        body = [normalize(text[s:e]) for h, s, e in _sections(text) if h == heading]
        if not body:
            problems.append(f"unchecked section {heading!r} not on the page")
        elif UNCHECKED_NOTE not in body[0]:
            problems.append(f"unchecked section {heading!r} ({why}) does not say {UNCHECKED_NOTE!r}")

    flat = normalize(text)
    masked = normalize(prose_mask(page, text))
    assert len(flat) == len(masked)
    covered = [False] * len(flat)
    try:
        quotes = list(page.quotes(root))
    except (OSError, KeyError, ValueError) as e:
        return problems + [f"reading its result files failed: {type(e).__name__}: {e}"]
    for quote in [*quotes, *page.settings]:
        needle = normalize(quote)
        hits = _find_all(flat, needle)
        if not hits:
            kind = "setting" if quote in page.settings and quote not in quotes else "derived text"
            problems.append(f"{kind} not on the page: {needle}")
        for start in hits:
            covered[start : start + len(needle)] = [True] * len(needle)
    for match in _NUMBER.finditer(masked):
        if not all(covered[match.start() : match.end()]):
            context = flat[max(0, match.start() - 50) : match.end() + 30]
            problems.append(f"number {match.group(0)!r} is derived by nothing: …{context}…")
    return problems
