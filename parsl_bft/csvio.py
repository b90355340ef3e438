"""Small shared helpers to read user CSV files with errors that name file, line and field."""
from __future__ import annotations

import csv
import gzip
import io
import math
from pathlib import Path
from typing import Iterator

from .errors import BadRows, InputError


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a text file, transparently gunzipping ``*.gz``."""
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), 0, None, "no such file")
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", newline="")
    return open(p, encoding="utf-8", newline="")


def read_rows(path: str | Path, required: list[str], bad: BadRows) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for a CSV with a header that must hold ``required`` columns.

    Rows with the wrong number of fields go to ``bad`` (raise, or count in lenient mode)."""
    with open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError(str(path), 1, None, "empty file: expected a header line") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(str(path), 1, missing[0],
                             f"missing column(s) {', '.join(missing)}; header is {','.join(header)}")
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()) or row[0].startswith("#"):
                continue
            if len(row) != len(header):
                bad.add(InputError(str(path), line, None,
                                   f"expected {len(header)} fields ({','.join(header)}), found {len(row)}"))
                continue
            yield line, {h: v.strip() for h, v in zip(header, row)}


def parse_number(path: str, line: int, field: str, text: str, *, kind: type = float,
                 minimum: float | None = None, strictly_positive: bool = False) -> float:
    """Parse one numeric field; raise InputError naming where and why it is wrong."""
    try:
        value = kind(float(text)) if kind is int else float(text)
        if kind is int and float(text) != int(float(text)):
            raise ValueError
    except ValueError:
        raise InputError(path, line, field, f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(path, line, field, f"not a finite number: {text!r}")
    if strictly_positive and value <= 0:
        raise InputError(path, line, field, f"must be > 0, got {text}")
    if minimum is not None and value < minimum:
        raise InputError(path, line, field, f"must be >= {minimum:g}, got {text}")
    return value
