"""The code blocks of the docs' tutorials and how-to guides, as the tests run them (so the docs cannot rot).

A page's fenced blocks are taken in order; a MyST comment line just above a block says what it is:

    % file: NAME          the block is a file the next commands use (a site file, a workflow, a model)
    % docs-test: output   the block shows what the command block above it printed: each of its lines must be
                          in that output (at 120 columns), numbers and ids aside (``shown_lines_missing``);
                          "..." stands for what was left out: lines, or part of a line
    % docs-test: fails    a command that must fail (an error the page shows on purpose)
    % docs-test: needs slurm   run only where the local Slurm runs (tests marked slurm; CI)
    % docs-test: skip REASON   not run here: REASON says why (a GPU, the Globus Compute cloud)

Otherwise ``bash``/``console`` blocks run as one script and ``python`` blocks as a script, in a scratch folder that
links the project's site_configs/, workflows/ and benchmarks/ and sees the shared data as ../shared. Blocks of any
other language must say what they are."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paths import ROOT

DOCS = ROOT / "docs"
RUN_LANGS = {"bash", "console", "shell", "python"}
SHOWN_LANGS = {"text"}                         # output a page shows without a directive
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w{}-]*)\s*$")
_DIRECTIVE = re.compile(r"^%\s*(file|docs-test):\s*(.+?)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text, first line, and what its directive says."""

    page: str
    line: int
    lang: str
    text: str
    kind: str               # run | file | output | fails | slurm | skip
    arg: str = ""           # the file name (file) or the reason (skip)

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def runnable_pages() -> list[Path]:
    """The pages whose blocks must run: every tutorial and how-to guide."""
    return sorted([*DOCS.glob("tutorials/*.md"), *DOCS.glob("how-to/*.md")])


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, each classified by the directive above it (ValueError when it cannot be)."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    name = str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else page.name
    directive: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            d = _DIRECTIVE.match(lines[i])
            if d:
                directive = (d.group(1), d.group(2))
            elif lines[i].strip():
                directive = None
            i += 1
            continue
        fence, lang = m.group(1), m.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence) and not lines[j].strip(fence)),
                   None)
        if end is None:
            raise ValueError(f"{name}:{i + 1}: a code block that never ends")
        if not lang.startswith("{"):             # MyST directives (toctree, eval-rst) are not code
            out.append(_classify(name, i + 1, lang, "\n".join(lines[i + 1:end]) + "\n", directive))
        directive, i = None, end + 1
    return out


def _classify(page: str, line: int, lang: str, text: str, directive: tuple[str, str] | None) -> Block:
    if directive is None:
        if lang in RUN_LANGS:
            return Block(page, line, lang, text, "run")
        if lang in SHOWN_LANGS:
            return Block(page, line, lang, text, "output")
        raise ValueError(f"{page}:{line}: a {lang or 'plain'} block must say what it is (% file: NAME, or "
                         "% docs-test: output|skip REASON)")
    what, arg = directive
    if what == "file":
        return Block(page, line, lang, text, "file", arg)
    word, _, rest = arg.partition(" ")
    if word == "output":
        return Block(page, line, lang, text, "output")
    if word == "fails" and lang in RUN_LANGS:
        return Block(page, line, lang, text, "fails")
    if word == "needs" and rest == "slurm" and lang in RUN_LANGS:
        return Block(page, line, lang, text, "slurm")
    if word == "skip" and rest:
        return Block(page, line, lang, text, "skip", rest)
    raise ValueError(f"{page}:{line}: unknown directive '% docs-test: {arg}'")


def _shape(line: str) -> str:
    """A printed line without what changes from run to run: ids and numbers (times, steps, rates, node names)."""
    line = re.sub(r"\b[0-9a-f]{8,}\b", "H", line)
    line = re.sub(r"\d+(?:[.,]\d+)*(?:e[-+]?\d+)?", "N", line)
    return " ".join(line.split())


def _in(parts: list[str], line: str) -> bool:
    """The parts appear in ``line`` in this order."""
    at = 0
    for part in parts:
        at = line.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def shown_lines_missing(shown: str, printed: str) -> list[str]:
    """The lines of an output block that the command did not print. A shown line may be part of a printed one,
    and "..." in it stands for what was left out there."""
    have = [_shape(line) for line in printed.splitlines()]
    missing = []
    for line in shown.splitlines():
        parts = [p.strip() for p in _shape(line.replace("\u2026", "...")).split("...")]
        parts = [p for p in parts if p]
        if parts and not any(_in(parts, h) for h in have):
            missing.append(line)
    return missing

