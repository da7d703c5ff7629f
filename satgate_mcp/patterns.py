"""Name patterns, one grammar for every user of them: token caveats, delegation, rate limits and costs.

A pattern is a name (it matches that name), ``prefix*`` (every name starting with ``prefix``) or
``*`` (every name); ``*`` appears nowhere but at the end. The characters allowed depend on the kind:

- ``tool``: ASCII letters, digits and ``_ . : / @ -``, at most 256 characters (MCP tool names are a
  subset of these);
- ``resource`` (URIs and URI templates) and ``prompt``: any printable character except whitespace and
  ``,`` (the separator of pattern lists in caveats), at most 1024 characters.

Any two patterns either nest or share no name, which is what makes covering and intersecting exact:
``covers(a, b)`` holds when every name ``b`` matches is matched by ``a`` as well.
"""

from __future__ import annotations

import string
from collections.abc import Collection, Iterable, Sequence
from enum import StrEnum

ANY = "*"
TOOL_CHARS = string.ascii_letters + string.digits + "_.:/@-"
MAX_TOOL_PATTERN_CHARS = 256
MAX_NAME_PATTERN_CHARS = 1024


class PatternKind(StrEnum):
    TOOL = "tool"
    RESOURCE = "resource"
    PROMPT = "prompt"


def is_pattern(text: str, kind: PatternKind = PatternKind.TOOL) -> bool:
    """``text`` is a valid pattern of ``kind``; plain string methods only, linear in the length."""
    body = text[:-1] if text.endswith(ANY) else text
    if kind is PatternKind.TOOL:
        # strip() leaves nothing exactly when every character is one of TOOL_CHARS.
        return 0 < len(text) <= MAX_TOOL_PATTERN_CHARS and not body.strip(TOOL_CHARS)
    return (
        0 < len(text) <= MAX_NAME_PATTERN_CHARS
        and text.isprintable()
        and "," not in text
        and ANY not in body
        and not any(c.isspace() for c in text)
    )


def pattern_error(text: str, kind: PatternKind = PatternKind.TOOL) -> str:
    """Why ``text`` is refused, for the person who wrote it."""
    if kind is PatternKind.TOOL:
        rule = f"letters, digits and '_.:/@-', at most {MAX_TOOL_PATTERN_CHARS} characters"
    else:
        rule = f"no commas, whitespace or control characters, at most {MAX_NAME_PATTERN_CHARS} characters"
    return f"invalid {kind} pattern {text[:100]!r}: it is not a name, 'prefix*' or '*' ({rule})"


def check_pattern(text: str, kind: PatternKind = PatternKind.TOOL) -> str:
    """``text`` itself when valid; ValueError with ``pattern_error`` otherwise."""
    if not is_pattern(text, kind):
        raise ValueError(pattern_error(text, kind))
    return text


def matches(pattern: str, name: str) -> bool:
    if pattern.endswith(ANY):
        return name.startswith(pattern[:-1])
    return pattern == name


def covers(outer: str, inner: str) -> bool:
    """Every name ``inner`` matches is matched by ``outer``.

    The same test as matching: the names of ``prefix*`` are exactly the strings that start with
    ``prefix``, and ``inner`` (a name or ``prefix*``) starts with it exactly when all of its names do.
    """
    return matches(outer, inner)


def allowed_by(filters: Iterable[Sequence[str]], name: str) -> bool:
    """``name`` (or every name of a pattern) passes each filter; no filter allows everything.

    Each filter is one caveat's list of patterns; several filters intersect, so a caveat only narrows.
    """
    return all(any(covers(p, name) for p in patterns) for patterns in filters)


def intersection(a: str, b: str) -> str | None:
    """The pattern matching exactly the names both match (one of them: patterns nest), or None."""
    if covers(a, b):
        return b
    if covers(b, a):
        return a
    return None


def merge_filters(filters: Sequence[Sequence[str]]) -> tuple[str, ...] | None:
    """One pattern list equal to several intersecting filters; None when unrestricted, ``()`` when
    they share no name."""
    if not filters:
        return None
    result: tuple[str, ...] = tuple(dict.fromkeys(filters[0]))
    for patterns in filters[1:]:
        merged = (intersection(a, b) for a in result for b in patterns)
        result = tuple(dict.fromkeys(p for p in merged if p is not None))
    return result


def most_specific(patterns: Collection[str], name: str) -> str | None:
    """The exact name, else the longest matching ``prefix*`` (``*`` is the shortest), else None."""
    if name in patterns:
        return name
    best: str | None = None
    for p in patterns:
        if p.endswith(ANY) and name.startswith(p[:-1]) and (best is None or len(p) > len(best)):
            best = p
    return best
