"""The error policy: a user's mistake is one line (a ParslBftError), a bug shows its traceback - on the command line
(a plain ValueError included), and in the log where a broad catch keeps the run going (the pilot pool)."""
from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap
import traceback
from contextlib import redirect_stderr
from importlib.resources import files

import pytest

from parsl_bft.cli import main
from parsl_bft.errors import BadValue, ParslBftError
from parsl_bft.execution.commands import SchedulerError
from parsl_bft.execution.pilot_pool import PilotPool
from parsl_bft.execution.pilot_records import skipped
from parsl_bft.extras import MissingExtra, optional_imports

DEMO_CSV = str(files("parsl_bft") / "data" / "demo_idle_intervals.csv")


def test_a_users_mistake_is_one_line_and_exit_2():
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["idle", DEMO_CSV, "--window", "yesterday/+1h"]) == 2
    assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    assert err.getvalue().startswith("parsl-bft idle: error: not a time: 'yesterday'")


@pytest.mark.parametrize("argv, line", [
    (["simulate", "--tfwd", "x"], "parsl-bft simulate: error: argument --tfwd: invalid float value: 'x'"),
    (["no-such-command"], "parsl-bft: error: argument cmd: invalid choice: 'no-such-command'"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(argv, line):
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and err.getvalue().count("\n") == 1 and err.getvalue().startswith(line)


def test_a_bad_value_is_still_a_value_error():
    """Callers (and their tests) that expect a ValueError from a bad argument still get one."""
    from parsl_bft.idle.sources import parse_duration
    with pytest.raises(ValueError, match="not a duration") as e:
        parse_duration("soon")
    assert isinstance(e.value, BadValue) and isinstance(e.value, ParslBftError)


def test_a_value_error_from_a_bug_reaches_the_user_with_its_traceback(monkeypatch):
    def buggy(*a, **k):
        raise ValueError("an index went negative")
    monkeypatch.setattr("parsl_bft.jobs.load_jobset", buggy)       # what `parsl-bft jobs` calls
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(ValueError) as e:
        main(["jobs", "any.jobs.csv"])
    assert err.getvalue() == ""                                     # not turned into a one-line "error:"
    tb = "".join(traceback.format_exception(e.value))
    assert "in cmd_jobs" in tb and "in buggy" in tb and tb.endswith("ValueError: an index went negative\n")


def test_the_entry_point_prints_the_traceback_of_a_bug(tmp_path):
    """The installed command as a user runs it (``sys.exit(main())``): the traceback on stderr, exit 1."""
    script = textwrap.dedent("""
        import sys
        import parsl_bft.jobs
        def buggy(*a, **k):
            raise ValueError("an index went negative")
        parsl_bft.jobs.load_jobset = buggy
        from parsl_bft.cli import main
        sys.exit(main(["jobs", "any.jobs.csv"]))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert "in cmd_jobs" in r.stderr and r.stderr.rstrip().endswith("ValueError: an index went negative")
    assert "parsl-bft jobs: error:" not in r.stderr


# --- the pilot pool: scheduler trouble is one line, a bug its traceback in the log ---------------------------
class _Provider:
    can_target, notice_s, refused = False, 60, None

    def topology(self):
        return None


class _Executor:
    label, provider, blocks_to_job_id = "site", _Provider(), {"0": "100"}

    def __init__(self, fails_with: Exception):
        self.fails_with = fails_with

    def connected_managers(self):
        raise self.fails_with


def _poll(fails_with: Exception) -> list:
    pool = PilotPool(_Executor(fails_with), probe_s=1e9, poll_s=0.0, clock=lambda: 0.0)   # type: ignore[arg-type]
    pool._claims = lambda pilots, now: set()            # only the survey is under test here
    return pool.poll()


def test_a_bug_in_a_pool_step_is_logged_with_its_traceback_and_the_run_goes_on(caplog):
    with caplog.at_level(logging.WARNING, logger="parsl_bft.execution.pilot_pool"):
        assert _poll(ValueError("a bug in the survey")) == []           # the poll is skipped, not the run
    [rec] = caplog.records
    assert rec.levelno == logging.ERROR and rec.exc_info is not None
    assert "pilot poll skipped: unexpected ValueError" in rec.getMessage()
    assert "in connected_managers" in caplog.text and "ValueError: a bug in the survey" in caplog.text


def test_scheduler_trouble_in_a_pool_step_is_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="parsl_bft.execution.pilot_pool"):
        assert _poll(SchedulerError(["squeue"], 1, "Socket timed out")) == []
    [rec] = caplog.records
    assert rec.levelno == logging.WARNING and rec.exc_info is None
    assert rec.getMessage() == "pilot poll skipped: squeue failed (exit 1): Socket timed out"


def test_skipped_keeps_the_level_for_trouble_and_logs_a_bug_at_error(caplog):
    with caplog.at_level(logging.DEBUG, logger="parsl_bft.execution.pilot_pool"):
        skipped("claim check skipped", TimeoutError("squeue hung"), logging.INFO)
        try:
            {}["missing"]
        except KeyError as e:
            skipped("claim check skipped", e, logging.INFO)
    assert [(r.levelno, r.exc_info is not None) for r in caplog.records] == [(logging.INFO, False),
                                                                            (logging.ERROR, True)]


# --- optional dependencies: a one-line error naming the extra -------------------------------------------------
@pytest.mark.parametrize("module, extra", [("matplotlib.pyplot", "plots"), ("globus_compute_sdk", "remote"),
                                           ("rich.table", "cli"), ("tensorboard", "tensorboard")])
def test_a_missing_optional_package_names_its_extra(monkeypatch, module, extra):
    for name in [m for m in sys.modules if m == module.split(".")[0] or m.startswith(module.split(".")[0] + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)      # importing it now raises ModuleNotFoundError
    with pytest.raises(MissingExtra, match=rf"^{module.split('.')[0]} is not installed: pip install "
                       rf"'parsl-bft\[{extra}\]'$") as e, optional_imports():
        __import__(module)
    assert isinstance(e.value, ImportError)


def test_a_command_without_its_extra_says_which_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["jobs", "any.jobs.csv"]) == 2
    assert err.getvalue() == "parsl-bft jobs: error: rich is not installed: pip install 'parsl-bft[cli]'\n"


def test_another_missing_module_is_not_blamed_on_an_extra():
    with pytest.raises(ModuleNotFoundError) as e, optional_imports():
        import parsl_bft_no_such_module  # noqa: F401
    assert not isinstance(e.value, MissingExtra)


def test_the_library_imports_without_the_extras():
    """Planner, runtime and API: none of rich, matplotlib or the Globus SDK at import."""
    code = ("import sys\nfor m in ('rich', 'matplotlib', 'globus_compute_sdk', 'globus_sdk'): sys.modules[m] = None\n"
            "import parsl_bft.cli, parsl_bft.execution.session, parsl_bft.execution.run, parsl_bft.planner.planner\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
