"""Slurm's compressed host lists ('n[1-3,5],gpu07'), shared by the Slurm back end and the topology readers
(no Parsl here: the planner side uses it too)."""
from __future__ import annotations

import re

MAX_HOSTS = 1_000_000       # more names than any machine has: a typo or a hostile file, refused before expanding


def expand_hostlist(text: str) -> tuple[str, ...]:
    """'n[1-3,5],gpu07' -> ('n1', 'n2', 'n3', 'n5', 'gpu07'); text after a bracket and several brackets are kept
    ('n[1-2]-ib' -> ('n1-ib', 'n2-ib'); 'r[1-2]n[01-02]' -> 4 names); zero padding follows the lower bound;
    '(null)' and 'N/A' (what Slurm prints for none) are dropped. A malformed range, or more than ``MAX_HOSTS``
    names, is a ValueError (counted before anything is expanded)."""
    items = _split_outside_brackets(text.strip())
    total = sum(_count(item) for item in items)
    if total > MAX_HOSTS:
        raise ValueError(f"host list {text[:40]!r}... names {total:,} hosts: beyond any machine (cap {MAX_HOSTS:,})")
    out: list[str] = []
    for item in items:
        out += _expand_one(item)
    return tuple(n for n in out if n and n not in ("(null)", "N/A"))


def count_hosts(text: str) -> int:
    """How many names ``text`` expands to, without expanding it (a malformed range is a ValueError): for caps on
    the total of several host lists."""
    return sum(_count(item) for item in _split_outside_brackets(text.strip()))


def _split_outside_brackets(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def _count(item: str) -> int:
    """How many names ``item`` expands to (the product of its brackets' range sizes), without expanding it."""
    n = 1
    for group in re.findall(r"\[([^\]]*)\]", item):
        n *= sum(max(hi - lo + 1, 0) for lo, hi, _ in (_range(part, item) for part in group.split(",")))
    return n


def _range(part: str, item: str) -> tuple[int, int, int]:
    """One range of a bracket ('3', '01-12'): its bounds and the zero-padded width (the lower bound's)."""
    lo, _, hi = part.partition("-")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        raise ValueError(f"bad host range {part!r} in {item[:80]!r}")
    return int(lo), int(hi or lo), len(lo)


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail, out = item[:m.start()], item[m.end():], []
    for part in m.group(1).split(","):
        lo, hi, width = _range(part, item)
        out += [n for i in range(lo, hi + 1) for n in _expand_one(f"{head}{i:0{width}d}{tail}")]
    return out
