"""The documentation: the site builds with no warning, and every tutorial and how-to guide runs as written
(tests/docs_pages.py says how a page's blocks are read)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_pages import DOCS, blocks, runnable_pages, shown_lines_missing

from paths import ROOT, SHARED

pytestmark = pytest.mark.slow          # real Parsl, ranks or a whole benchmark: not in the inner loop

BLOCK_TIMEOUT_S = 900


def test_the_docs_build_with_no_warning(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                        str(tmp_path / "html")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "html" / "reference" / "cli.html").exists()


def _pages():
    return [pytest.param(page, id=str(page.relative_to(DOCS)),
                         marks=[pytest.mark.slurm] if any(b.kind == "slurm" for b in blocks(page)) else [])
            for page in runnable_pages()]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", _pages())
def test_a_page_runs_as_written(page, tmp_path, request):
    todo = blocks(page)
    slurm_env = {}
    if any(b.kind == "slurm" for b in todo):
        request.getfixturevalue("slurm")
        # the page's own `tools/local-slurm.sh start` finds the fixture's cluster running, configured alike
        slurm_env = {"SLURM_LOCAL_AUTH": "none", "SLURM_CONF": os.environ["SLURM_CONF"]}
    work = _scratch(tmp_path)
    (tmp_path / "home").mkdir()         # what a page writes under ~ (remote runs, their registry) stays here
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PARSL_BFT_SHARED": str(SHARED.parent), "HOME": str(tmp_path / "home"),
           "COLUMNS": "120", **slurm_env}      # the width the pages' output was taken at
    env.pop("PARSL_BFT_HOME", None)
    ran, printed, wrong = 0, None, []
    for b in todo:
        if b.kind == "file":
            (work / b.arg).parent.mkdir(parents=True, exist_ok=True)
            (work / b.arg).write_text(b.text)
        elif b.kind in ("run", "fails", "slurm"):
            r = _run(b, work, env)
            ok = (r.returncode != 0) if b.kind == "fails" else (r.returncode == 0)
            assert ok, f"{b.where()}: exit {r.returncode}\n{b.text}\n--- output ---\n{(r.stdout + r.stderr)[-4000:]}"
            ran, printed = ran + 1, r.stdout + r.stderr
        elif b.kind == "output" and printed is not None:
            missing = shown_lines_missing(b.text, printed)
            if missing:
                wrong.append(f"{b.where()}: not printed:\n  " + "\n  ".join(missing)
                             + f"\n--- printed ---\n{printed[-3000:]}")
            printed = None                 # one output block per command block
        elif b.kind == "skip":
            printed = None
    assert ran, f"{page}: no block ran"
    assert not wrong, "the page shows output its commands did not print:\n" + "\n".join(wrong)


def _scratch(tmp_path: Path) -> Path:
    """A folder as a user's checkout would be: the project's example folders beside, the shared data at ../shared."""
    work = tmp_path / "work"
    work.mkdir()
    for d in ("site_configs", "workflows", "benchmarks", "tools"):
        (work / d).symlink_to(ROOT / d)
    (tmp_path / "shared").symlink_to(SHARED.parent)
    return work


def _run(b, work: Path, env: dict) -> subprocess.CompletedProcess:
    if b.lang == "python":
        script = work / f".block-{b.line}.py"
        script.write_text(b.text)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", b.text]
    try:
        return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ran out of time at step {b.where()} ({BLOCK_TIMEOUT_S} s)\n{b.text}\n{str(e.output)[-2000:]}")
