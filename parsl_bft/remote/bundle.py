"""What ``parsl-bft submit`` ships: the workflow file and the user's own files it names, and the run id."""
from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

MAX_BYTES = 6 << 20          # one Globus Compute task carries at most 10 MB, base64-encoded (x4/3)


@dataclass(frozen=True)
class Bundle:
    """What a submission ships: the workflow's name, the files it needs (by path relative to its folder) and
    its arguments."""

    workflow: str                 # relative to the workflow's folder, like every name in files
    files: dict[str, bytes]
    args: tuple[str, ...]

    def digest(self, site: str | None) -> str:
        """A hash of everything shipped and the remote site: the same submission has the same digest."""
        h = hashlib.sha256(json.dumps([self.workflow, list(self.args), site]).encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()

    def run_id(self, site: str | None) -> str:
        """Named for the workflow and its content: submitting the same thing again is the same run."""
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(self.workflow).stem)[:60] or "run"
        return f"{stem}-{self.digest(site)[:10]}"


def _named_files(source: str, folder: Path) -> set[Path]:
    """Local modules the workflow imports and files it names in string literals ('my_model.py:Net', 'data.csv'),
    when they exist in its folder or below."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for mod in names:
            base = folder / Path(*mod.split("."))
            found.update(p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file())
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 300:
            text = node.value.split(":")[0] if re.match(r"^[^:]+\.py:\w+$", node.value) else node.value
            if "\n" not in text and "\0" not in text and not text.startswith(("/", "~")):
                p = folder / text
                try:
                    if p.is_file() and p.resolve().is_relative_to(folder):   # a path elsewhere is not ours
                        found.add(p.resolve())
                except OSError:         # a string that is no possible path
                    pass
    return found


def make_bundle(workflow: str | Path, args=(), extra=()) -> Bundle:
    """The workflow, the files it names (recursively: a model file's own local imports too) and ``extra``;
    every file must sit in the workflow's folder or below - that folder is rebuilt at the facility."""
    wf = Path(workflow)
    if not wf.is_file():
        raise UsageError(f"no such workflow file: {wf}")
    folder = wf.resolve().parent
    todo = [wf.resolve(), *(Path(e).resolve() for e in extra)]
    files: dict[str, bytes] = {}
    size = 0
    while todo:
        p = todo.pop()
        try:
            name = p.relative_to(folder).as_posix()
        except ValueError:
            raise UsageError(f"{p}: files shipped with a workflow must be in its folder ({folder}) or below") from None
        if name in files:
            continue
        if not p.is_file():
            raise UsageError(f"no such file to ship: {p}")
        size += p.stat().st_size        # before reading: a data set the workflow names may be gigabytes
        if size > MAX_BYTES:
            raise UsageError(f"the workflow and its files are more than one Globus Compute task carries "
                             f"({MAX_BYTES >> 20} MiB) with {name} ({p.stat().st_size / 2**20:.1f} MiB): put data "
                             "at the facility and name its path there")
        files[name] = p.read_bytes()
        if p.suffix == ".py":
            try:
                todo.extend(_named_files(files[name].decode(), folder) - {folder / n for n in files})
            except (SyntaxError, UnicodeDecodeError, ValueError) as e:
                raise UsageError(f"{p}: not a Python file parsl-bft can read: {e}") from None
    # sys.argv of the workflow there: strings (an int reached argparse at the facility; a Path, json here)
    return Bundle(wf.resolve().relative_to(folder).as_posix(), files, tuple(map(str, args)))
