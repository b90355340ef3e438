"""`parsl-bft run`'s progress without a terminal: plain lines at a steady interval, and each job's last state
as it is (a failed job is not shown as done)."""
import io
from concurrent.futures import Future
from types import SimpleNamespace

from rich.console import Console

from parsl_bft.execution.errors import JobFailed, RunStopped
from parsl_bft.execution.live import LiveBars


def _orch():
    futures = {n: Future() for n in ("ok", "bad", "cut", "busy")}
    futures["ok"].set_result("ckpt.h5")
    futures["bad"].set_exception(JobFailed("bad failed"))
    futures["cut"].set_exception(RunStopped("not done when the run stopped"))
    return SimpleNamespace(
        futures=futures, jobs={n: SimpleNamespace(samples=1000) for n in futures},
        running={"busy": SimpleNamespace(nodes=2)},
        last_report=lambda n: SimpleNamespace(loss=0.5) if n == "busy" else None,
        live_progress=lambda: {"ok": 1000, "bad": 300, "cut": 500, "busy": 250})


def test_without_a_terminal_progress_is_plain_lines_at_an_interval_and_a_last_word():
    out = io.StringIO()
    orch = _orch()
    with LiveBars(Console(file=io.StringIO(), force_terminal=False), every_s=3600, plain_to=out) as bars:
        bars(orch)
        bars(orch)                      # within the interval: nothing new
        assert len(out.getvalue().splitlines()) == 4
    lines = out.getvalue().splitlines()
    assert len(lines) == 8              # the last word, at exit
    last = {line.split()[2].rstrip(":"): line for line in lines[4:]}
    assert last["ok"].endswith("100.0% of 1,000 samples, done")
    assert last["bad"].endswith("30.0% of 1,000 samples, failed")
    assert last["cut"].endswith("50.0% of 1,000 samples, stopped")
    assert last["busy"].endswith("25.0% of 1,000 samples, 2 node(s), loss 0.5")
