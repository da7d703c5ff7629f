"""Which resource template a URI belongs to: RFC 6570 templates, matched in linear time.

A client picks the URI (up to the body limit), so matching must never backtrack whatever the
upstream's template looks like.
"""

from __future__ import annotations

from functools import lru_cache

#: Bytes each kind of variable does not match: ``{x}`` is one path segment (never the query or
#: fragment); ``{+x}``/``{#x}`` is anything on one line (what the regex ``.*`` used to match).
_SEGMENT, _ANYTHING = 0, 1
_STOPS = {_SEGMENT: b"/?#", _ANYTHING: b"\n"}
#: translate tables: 0xFF where a variable of that kind may consume the byte, 0x00 where it stops.
_FREE_TABLES = {kind: bytes(0 if i in stops else 0xFF for i in range(256)) for kind, stops in _STOPS.items()}
TemplatePart = bytes | int


@lru_cache(maxsize=1024)
def compile_template(template: str) -> tuple[TemplatePart, ...]:
    """Literals (UTF-8 bytes, adjacent ones joined) and variable kinds; one left-to-right scan.

    ``{+x}``/``{#x}`` match anything, any other ``{x}`` one segment; an unclosed ``{`` is literal.
    """
    parts: list[TemplatePart] = []

    def add(part: TemplatePart) -> None:
        if part == b"":
            return
        if isinstance(part, bytes) and parts and isinstance(parts[-1], bytes):
            parts[-1] += part
        elif not (parts and part == _SEGMENT and parts[-1] == _SEGMENT):  # {a}{b} is the same as {a}
            parts.append(part)

    pos = 0
    while (start := template.find("{", pos)) != -1 and (end := template.find("}", start)) != -1:
        add(template[pos:start].encode("utf-8", "surrogatepass"))
        add(_ANYTHING if template[start + 1 : start + 2] in ("+", "#") else _SEGMENT)
        pos = end + 1
    add(template[pos:].encode("utf-8", "surrogatepass"))
    return tuple(parts)


@lru_cache(maxsize=256)
def _byte_table(value: int) -> bytes:
    """A translate table marking one byte value with 0x01 and every other with 0x00."""
    return bytes(1 if i == value else 0 for i in range(256))


def template_matches(template: str, uri: str) -> bool:
    """RFC 6570 templates, loosely: ``{x}`` matches one path segment, ``{+x}``/``{#x}`` anything.

    Linear in the URI whatever the template (a client picks the URI, up to the body limit): the
    set of positions reachable after each part is a bitset over the URI's bytes (one byte per
    position, 0x01 = reachable), advanced by a few whole-integer operations per template part, so
    nothing ever backtracks. UTF-8 keeps the meaning of the old character-wise regex: a literal
    starts on a character boundary, and bytes of multi-byte characters are never ``/?#``.
    """
    parts = compile_template(template)
    data = uri.encode("utf-8", "surrogatepass")
    n = len(data)
    if sum(len(p) for p in parts if isinstance(p, bytes)) > n:
        return False
    ones = int.from_bytes(b"\x01" * (n + 1), "little")  # positions 0..n
    free: dict[int, int] = {}  # variable kind -> 0xFF where it may consume the byte
    reach = 1  # only position 0
    for part in parts:
        if isinstance(part, bytes):
            for offset, value in enumerate(part):
                reach &= int.from_bytes(data.translate(_byte_table(value)), "little") >> (8 * offset)
                if not reach:
                    return False
            reach <<= 8 * len(part)
        else:
            if part not in free:
                free[part] = int.from_bytes(data.translate(_FREE_TABLES[part]), "little")
            run = free[part]
            # From each reachable position inside a run of free bytes, the carry of the addition
            # runs to the end of that run: every position up to and including the run's end.
            reach |= ((run + (reach & run)) ^ run) & ones
    return bool((reach >> (8 * n)) & 1)
