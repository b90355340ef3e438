"""Usage errors of the commands the README names: they say what is missing, and nothing else."""
from __future__ import annotations

import io
from contextlib import redirect_stderr

import pytest

from parsl_bft.cli import main
from parsl_bft.execution.jobstore import JobStore


def test_status_without_state_names_the_state_directories_inside(tmp_path):
    for name in ("digits", "image_classifier"):
        (tmp_path / name).mkdir()
        JobStore(tmp_path / name / "state.sqlite").close()
    (tmp_path / "notes").mkdir()                        # a folder without state is not named
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["status", str(tmp_path)])
    assert rc == 2
    line = err.getvalue().strip()
    assert line.startswith("parsl-bft status: error: no orchestrator state at ")
    assert line.endswith(f"state directories in it: {tmp_path / 'digits'}, {tmp_path / 'image_classifier'}")


def test_status_on_a_file_or_a_missing_folder_says_only_that(tmp_path):
    (tmp_path / "f").write_text("x")
    for state in (tmp_path / "f", tmp_path / "missing"):
        err = io.StringIO()
        with redirect_stderr(err):
            assert main(["status", str(state)]) == 2
        assert err.getvalue().strip() == f"parsl-bft status: error: no orchestrator state at {state / 'state.sqlite'}"


@pytest.mark.parametrize("command", ["run", "submit"])
def test_run_and_submit_without_a_workflow_name_only_the_workflow_as_missing(command):
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([command])
    assert exit_.value.code == 2
    assert err.getvalue().splitlines()[-1] == (f"parsl-bft {command}: error: the following arguments are required: "
                                               "workflow")


@pytest.mark.parametrize("argv", [["w.py", "--site"], ["w.py", "--site="], ["--site", "", "w.py"]])
def test_run_with_site_missing_its_file_says_so(tmp_path, monkeypatch, argv):
    """It said '.: is a directory, not a file' (an empty path read as the current folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.py").write_text("print('never run')\n")
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["run", *argv]) == 2
    assert err.getvalue().splitlines()[-1] == ("parsl-bft run: error: --site needs a site file: parsl-bft run W.py "
                                               "--site SITE.yaml")


@pytest.mark.parametrize("source, extra, named", [
    (["--cluster", "4"], ["--window", "+1h/+2h", "--no-mask"], "--window, --no-mask"),
    (["--cluster", "4"], ["--horizon-aware", "--predict", "clairvoyant"], "--horizon-aware, --predict"),
    (["--cluster", "4"], ["--schedule", "easy"], "--schedule"),
    (["--idle-intervals", "x.csv"], ["--units", "cores", "--swf-variant", "walltime6"], "--units, --swf-variant"),
])
def test_simulate_refuses_options_its_source_would_ignore(source, extra, named):
    """They were accepted and did nothing (a --window on a dedicated cluster replayed the whole run)."""
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["simulate", *source, "--jobs", "missing.jobs.csv", *extra]) == 2
    assert err.getvalue().strip().startswith(f"parsl-bft simulate: error: {named}: not used here: ")


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"]])
def test_help_imports_no_solver_torch_or_parsl(argv):
    """``parsl-bft --help`` answers at once: the MILP solvers, torch and Parsl load only in the commands using them."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "parsl_bft.cli", *argv], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "usage: parsl-bft" in r.stdout
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in r.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "parsl_bft" in imported                       # the listing was read
    assert imported.isdisjoint({"pulp", "highspy", "torch", "parsl"}), imported & {"pulp", "highspy", "torch", "parsl"}


def test_every_argument_says_what_it_does():
    """The CLI reference in the docs is generated from the parser: an argument without help is a blank row."""
    import argparse

    from parsl_bft.cli import build_parser

    def silent(p, where):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, q in a.choices.items():
                    yield from silent(q, f"{where} {name}")
            elif not a.help and not isinstance(a, argparse._HelpAction):
                yield f"{where} {a.option_strings or a.dest}"
    assert list(silent(build_parser(), "parsl-bft")) == []
