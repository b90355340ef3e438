"""The orchestrator's state has one owner (execution/inbox.py): while its loop runs in the background, jobs are
submitted from many threads at once, futures a job waits for resolve in other threads, the loop's own thread
submits from a job's callback, and readers call wait() and live_progress() all along. Every job is planned, run
and done exactly once; no thread but the owner changes the state (``Inbox.check_owner`` would fail the run)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from simulated import RATE, ScriptedPool, SimulatedFragments, _orchestrator

from parsl_bft.execution.clock import SimulatedClock
from parsl_bft.execution.inbox import Inbox
from parsl_bft.execution.orchestrator import TrainingJob

from harness import RanOutOfTime

THREADS, PER_THREAD, LATE = 6, 4, 4       # submitting threads, jobs each, jobs whose input resolves elsewhere
BUDGET_S = 300.0                          # only stops a hung test: the machine may be loaded


def _job(name: str, **kw: object) -> TrainingJob:
    return TrainingJob(name, samples=400, max_nodes=2, global_batch=8, rate_guess=RATE, **kw)  # type: ignore[arg-type]


def _threads(targets: list[Callable[[], object]], errors: list[BaseException]) -> list[threading.Thread]:
    def guarded(f: Callable[[], object]) -> Callable[[], None]:
        def body() -> None:
            try:
                f()
            except BaseException as e:
                errors.append(e)
        return body
    ts = [threading.Thread(target=guarded(f), daemon=True) for f in targets]
    for t in ts:
        t.start()
    return ts


def _join(ts: list[threading.Thread], step: str) -> None:
    for t in ts:
        t.join(BUDGET_S)
        if t.is_alive():
            raise RanOutOfTime(f"ran out of time at step: {step}")


def test_jobs_submitted_from_many_threads_while_the_loop_runs_are_each_run_once(tmp_path):
    clock = SimulatedClock()
    frags = SimulatedFragments(clock)
    orch = _orchestrator(tmp_path, clock, ScriptedPool(clock, [(0, "join", ("a", "b", "c", "d"))]), frags,
                         poll_s=0.5)
    errors: list[BaseException] = []
    futs: dict[str, Future] = {}
    futs_lock = threading.Lock()
    orch.start()
    go = threading.Barrier(THREADS + LATE + 1)

    def submitter(i: int) -> Callable[[], None]:
        def body() -> None:
            go.wait()
            for k in range(PER_THREAD):
                name = f"t{i}-{k}"
                f = orch.submit(_job(name))
                assert orch.submit(_job(name)) is f          # the same job again: its future
                with futs_lock:
                    futs[name] = f
        return body

    inputs = [Future() for _ in range(LATE)]
    for i, inp in enumerate(inputs):       # declared now, submitted when their input resolves (in its thread)
        futs[f"late{i}"] = orch.submit(_job(f"late{i}", workload_args={"n": inp}))

    def resolver(i: int) -> Callable[[], None]:
        def body() -> None:
            go.wait()
            inputs[i].set_result(64)
        return body

    def chained(f: Future) -> None:        # runs in the loop's thread: the owner submits too
        with futs_lock:
            futs["after"] = orch.submit(_job("after"))
    futs["first"] = first = orch.submit(_job("first"))
    first.add_done_callback(chained)

    stop_reading = threading.Event()

    def reader() -> None:
        go.wait()
        while not stop_reading.is_set():
            orch.wait(0.0)
            orch.live_progress()
    readers = _threads([reader], errors)
    _join(_threads([submitter(i) for i in range(THREADS)] + [resolver(i) for i in range(LATE)], errors),
          "submitting from many threads")
    try:
        if not orch.wait(BUDGET_S):
            raise RanOutOfTime("ran out of time at step: every job done")
    finally:
        stop_reading.set()
        _join(readers, "the reader ending")
        summary = orch.stop()
        submits = [d["job"] for _, _, d in orch.db.events("submit")] + list(orch.db.events("start")[0][2]["jobs"])
        orch.close()
    assert not errors, errors
    names = {f"t{i}-{k}" for i in range(THREADS) for k in range(PER_THREAD)} | \
        {f"late{i}" for i in range(LATE)} | {"first", "after"}
    assert "after" in futs and all(f.exception(timeout=0) is None for f in futs.values())
    assert summary is not None and {r.job: r.status for r in summary.jobs} == {n: "done" for n in names}
    launched = [j for j, _ in frags.launches]
    assert sorted(set(launched)) == sorted(names)            # every job ran ...
    assert sorted(submits) == sorted(names)                  # ... and was planned exactly once


def test_a_thread_that_does_not_own_the_state_is_refused(tmp_path):
    """The enforcement itself: while a loop owns the state, another thread's change is an AssertionError."""
    inbox = Inbox(tmp_path)
    owned = threading.Event()
    done = threading.Event()

    def loop() -> None:
        with inbox.own(lambda msg: None):
            owned.set()
            done.wait(BUDGET_S)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    if not owned.wait(BUDGET_S):
        raise RanOutOfTime("ran out of time at step: the loop taking the state")
    try:
        with pytest.raises(AssertionError, match="does not own the orchestrator's state"):
            inbox.check_owner("a change")
        with pytest.raises(AssertionError):
            inbox.take()
    finally:
        done.set()
        t.join(BUDGET_S)
    with pytest.raises(AssertionError):
        inbox.check_owner("a change with no loop, without the inbox's lock")
    with inbox.direct():
        inbox.check_owner("a change with no loop, holding the inbox's lock")
