"""Optional dependencies: the extra of parsl-bft that installs each, and the one-line error when one is missing.

The library (the planner, the runtime, the Python API) needs none of them; the command line's tables and bars need
rich, plots need matplotlib, Globus Compute sites and ``parsl-bft remote`` need the Globus Compute SDK, an export
to TensorBoard needs tensorboard. Each is imported where it is used (never at import of parsl_bft), inside
``optional_imports()``.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .errors import ParslBftError

EXTRAS = {"rich": "cli", "matplotlib": "plots", "globus_compute_sdk": "remote", "globus_sdk": "remote",
          "tensorboard": "tensorboard"}


class MissingExtra(ParslBftError, ModuleNotFoundError):
    """An optional dependency that is not installed; the message names the extra that installs it. Still a
    ModuleNotFoundError, so code that tries an import and falls back keeps working."""


@contextmanager
def optional_imports() -> Iterator[None]:
    """Imports inside: a missing optional package (one of ``EXTRAS``) raises MissingExtra, naming its extra;
    any other missing module is left as it was (a broken install, a bug)."""
    try:
        yield
    except MissingExtra:
        raise
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in EXTRAS:
            raise
        raise MissingExtra(f"{top} is not installed: pip install 'parsl-bft[{EXTRAS[top]}]'", name=e.name) from e
