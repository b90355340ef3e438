"""Small shared helpers to read user CSV files with errors that name file, line and field."""
from __future__ import annotations

import csv
import gzip
import io
import math
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import BadRows, InputError

MAX_TEXT_BYTES = 64 << 20       # a YAML job set or site file larger than this is not one
MAX_LINE = 1 << 20              # characters: no line of a log or CSV this reads is near it (a damaged or binary file)
_DECODE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError, OSError)


def check_input_file(path: str | Path) -> Path:
    """An input must be an existing regular file: a directory, /dev/zero or a FIFO would fail late or hang."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(str(p), 0, None, "no such file") from None
    except OSError as e:
        raise InputError(str(p), 0, None, f"cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(str(p), 0, None, "is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(str(p), 0, None, "not a regular file")
    return p


class _Guarded:
    """Lines of a text file; a decompression or decoding error becomes an InputError naming the file and line."""

    def __init__(self, path: Path, fh: IO[str]) -> None:
        self.path, self.fh, self.line = path, fh, 0

    def _fail(self, e: BaseException) -> InputError:
        what = "damaged gzip data" if isinstance(e, (EOFError, gzip.BadGzipFile, zlib.error)) else \
            "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "cannot read"
        return InputError(str(self.path), self.line + 1, None, f"{what} ({type(e).__name__}: {e})")

    def __iter__(self) -> _Guarded:
        return self

    def __next__(self) -> str:
        try:
            line = self.fh.readline(MAX_LINE + 1)      # bounded: one line of a GB file was read whole
        except _DECODE_ERRORS as e:
            raise self._fail(e) from None
        if not line:
            raise StopIteration
        self.line += 1
        if len(line) > MAX_LINE:
            raise InputError(str(self.path), self.line, None, f"a line longer than {MAX_LINE:,} characters: not a "
                             "line of this format (a damaged or binary file?)")
        return line

    def read(self, n: int = -1) -> str:
        try:
            return self.fh.read(n)
        except _DECODE_ERRORS as e:
            raise self._fail(e) from None

    def close(self) -> None:
        self.fh.close()

    def __enter__(self) -> _Guarded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_text(path: str | Path) -> _Guarded:
    """Open a text file, transparently gunzipping ``*.gz``; errors name the file (and line)."""
    p = check_input_file(path)
    try:
        if p.suffix == ".gz":
            return _Guarded(p, io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", newline=""))
        return _Guarded(p, open(p, encoding="utf-8", newline=""))
    except OSError as e:
        raise InputError(str(p), 0, None, f"cannot read: {e.strerror or e}") from None


class csv_reader:
    """csv.reader whose own errors (a field over the size limit, a bad quote) name the file and line."""

    def __init__(self, fh: Iterable[str], path: str | Path) -> None:
        self._r, self.path = csv.reader(fh), str(path)

    @property
    def line_num(self) -> int:
        """The line the last row read ended on (csv.reader's count: a quoted field may span lines)."""
        return self._r.line_num

    def __iter__(self) -> csv_reader:
        return self

    def __next__(self) -> list[str]:
        try:
            return next(self._r)
        except csv.Error as e:
            raise InputError(self.path, self._r.line_num, None, f"not valid CSV: {e}") from None


def read_small_text(path: str | Path, limit: int = MAX_TEXT_BYTES) -> str:
    """The whole text of a small input file (YAML): a regular file, at most ``limit`` bytes, UTF-8."""
    p = check_input_file(path)
    if p.stat().st_size > limit:
        raise InputError(str(p), 0, None, f"{p.stat().st_size:,} bytes: too large for this kind of file "
                                          f"(limit {limit:,})")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(str(p), 0, None, f"not UTF-8 text ({e})") from None
    except OSError as e:
        raise InputError(str(p), 0, None, f"cannot read: {e.strerror or e}") from None


def check_output_path(path: str | Path | None, option: str) -> None:
    """Before the long work: the folder an output file goes into must exist and be writable."""
    if not path:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(str(p), 0, None, f"{option}: is a directory; give a file name")
    if not parent.is_dir():
        raise InputError(str(p), 0, None, f"{option}: no such directory {parent}")
    if not os.access(parent, os.W_OK):
        raise InputError(str(p), 0, None, f"{option}: directory {parent} is not writable")


def read_rows(path: str | Path, required: list[str], bad: BadRows) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for a CSV with a header that must hold ``required`` columns.

    Rows with the wrong number of fields go to ``bad`` (raise, or count in lenient mode)."""
    with open_text(path) as fh:
        reader = csv_reader(fh, path)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError(str(path), 1, None, "empty file: expected a header line") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(str(path), 1, missing[0],
                             f"missing column(s) {', '.join(missing)}; {_header_shown(header)}")
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
    except (ValueError, OverflowError):
        raise InputError(path, line, field, f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(path, line, field, f"not a finite number: {text!r}")
    if strictly_positive and value <= 0:
        raise InputError(path, line, field, f"must be > 0, got {text}")
    if minimum is not None and value < minimum:
        raise InputError(path, line, field, f"must be >= {minimum:g}, got {text}")
    return value


def parse_yaml(text: str, source: str) -> Any:
    """A YAML document (safe types only) with aliases refused: nine levels of ``*alias`` in a few hundred bytes
    expand to gigabytes, and a site file or job set has no need of them. Syntax errors, aliases and nesting deep
    enough to exhaust the stack are InputErrors naming ``source`` (and the line)."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                line = self.peek_event().start_mark.line + 1
                raise InputError(source, line, None, "YAML aliases (*name) are not allowed: write the value out")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)  # a SafeLoader
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", -1) + 1
        raise InputError(source, line, None, f"not valid YAML: {' '.join(str(e).split())[:200]}") from None
    except RecursionError:
        raise InputError(source, 0, None, "not valid YAML: nested too deeply") from None


def _header_shown(header: list[str]) -> str:
    """The header's column names, when they look like names (a file that is not CSV is not echoed: it may be
    anything the path pointed at), at most 12 of them."""
    if len(header) < 2 or not all(re.fullmatch(r"[\w .()/%-]{1,40}", h) for h in header):
        return "its first line is not a CSV header"
    more = f", ... ({len(header)} columns)" if len(header) > 12 else ""
    return f"header is {','.join(header[:12])}{more}"
