"""Errors a user sees: each names the file, the line and the field that is wrong."""
from __future__ import annotations

from dataclasses import dataclass


class ParslBftError(Exception):
    """Base class of every error parsl-bft raises on purpose."""


@dataclass
class InputError(ParslBftError):
    """Bad input in a user's file. ``line`` is 1-based; 0 means the file as a whole."""

    path: str
    line: int
    field: str | None
    problem: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        what = f" field '{self.field}'" if self.field else ""
        return f"{where}:{what} {self.problem}"


class UsageError(ParslBftError):
    """A bad command-line value or combination (the CLI's own checks)."""


class BadValue(ParslBftError, ValueError):
    """A value a user gave that cannot work (an option, an argument, a field of a job, site or workload). A
    ValueError too, so a caller that checks arguments the usual way (``except ValueError``) still catches it;
    a plain ValueError is a bug and reaches the user with its traceback."""


class BadRows:
    """Collects bad rows in --lenient mode so the caller can say how many were skipped.

    Strict mode (the default) raises the first error; lenient mode keeps reading but never drops a row
    without counting it, and keeps the first few errors to show.
    """

    def __init__(self, lenient: bool, keep: int = 5) -> None:
        self.lenient = lenient
        self.count = 0
        self.examples: list[InputError] = []
        self._keep = keep

    def add(self, err: InputError) -> None:
        """A damaged row: raised at once, or (lenient) counted and kept as an example."""
        if not self.lenient:
            raise err
        self.count += 1
        if len(self.examples) < self._keep:
            self.examples.append(err)

    def warn(self) -> None:
        """Tell the user (on stderr, via warnings) how many rows lenient mode skipped."""
        if self.count:
            import warnings
            warnings.warn(self.summary(), stacklevel=3)

    def summary(self) -> str:
        """One line: how many rows were skipped and the first few reasons ("" when none)."""
        if not self.count:
            return ""
        first = "; ".join(str(e) for e in self.examples)
        return f"skipped {self.count} bad row(s) (--lenient); first: {first}"
