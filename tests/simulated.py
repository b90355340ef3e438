"""The orchestrator on simulated time, shared by the tests that drive it: a scripted idle pool and fragments that
'train' at a fixed rate per node (no Parsl, no torch ranks), and an Orchestrator on an injected SimulatedClock."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

from parsl_bft.execution.clock import SimulatedClock
from parsl_bft.execution.htex import FragmentHandle
from parsl_bft.execution.orchestrator import Orchestrator
from parsl_bft.execution.protocols import PoolEvent
from parsl_bft.planner import Planner
from parsl_bft.train.config import FragmentConfig, FragmentFailed, FragmentResult, StopReason
from parsl_bft.train.leftovers import SHARE_ENV, share_mark
from parsl_bft.train.protocol import JobDir, Progress

RATE = 100.0          # samples/s per node


class ScriptedPool:
    """Idle nodes that join, get a notice and leave at scripted simulated seconds after start()."""

    gang = False
    demand: int | None = None
    topology = None

    def __init__(self, clock: SimulatedClock, script: list[tuple[float, str, tuple[str, ...]]]):
        self.clock, self.script, self.released = clock, sorted(script), []
        self.t0 = 0.0
        self.left: set[str] = set()

    def start(self) -> None:
        self.t0 = self.clock.monotonic()

    def poll(self) -> list[PoolEvent]:
        wall = self.clock.monotonic() - self.t0
        due = [e for e in self.script if e[0] <= wall]
        self.script = self.script[len(due):]
        for _, kind, nodes in due:
            (self.left.update if kind == "leave" else self.left.difference_update if kind == "join" else len)(nodes)
        return [PoolEvent(kind, nodes, t) for t, kind, nodes in due]

    def release(self, nodes) -> None:
        self.released.extend(nodes)

    def stop(self) -> None:
        pass

    def executor_label(self, node: str) -> str | None:
        return None


class SimulatedFragments:
    """Fragments that advance RATE samples/s per node of simulated time, end at their job's budget or at the job
    directory's STOP file (saving what they did), and fail at once for jobs listed in ``crash``. Jobs in ``deaf``
    report progress but never stop, those in ``silent`` never report either: both die when a node of theirs
    leaves (``pool.left``)."""

    gang = False

    def __init__(self, clock: SimulatedClock, crash: tuple[str, ...] = (), deaf: tuple[str, ...] = (),
                 silent: tuple[str, ...] = (), pool: ScriptedPool | None = None):
        self.clock, self.crash, self.deaf, self.silent, self.pool = clock, crash, deaf, silent, pool
        self.nodes: dict[str, tuple[str, ...]] = {}
        self.helpers: list[subprocess.Popen] = []
        self.saved: dict[str, int] = {}
        self.live: list[tuple[FragmentConfig, float, Future]] = []
        self.launches: list[tuple[str, int]] = []
        clock.on_sleep.append(lambda _: self.advance())

    def launch(self, cfg: FragmentConfig, nodes: tuple[str, ...]) -> FragmentHandle:
        fut: Future = Future()
        self.launches.append((cfg.job, len(nodes)))
        self.nodes[cfg.fragment_id] = nodes
        if cfg.job in self.silent:        # what its loop started in a session of its own, marked as a rank's is
            self.helpers.append(subprocess.Popen(
                [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True,
                env={**os.environ, SHARE_ENV: share_mark(cfg.fragment_id, 0)}))
        if cfg.job in self.crash:
            fut.set_exception(FragmentFailed(f"{cfg.job}: ImportError in the user's model"))
        else:
            self.live.append((cfg, self.clock.monotonic(), fut))
        return FragmentHandle([fut])

    def advance(self) -> None:
        for item in list(self.live):
            cfg, t0, fut = item
            if cfg.job in self.deaf + self.silent:
                if cfg.job in self.deaf:
                    JobDir(cfg.checkpoint_dir).write_progress(Progress(1, 8, 0.5, 1, 0, time.time(), time.time()))
                if self.pool is not None and set(self.nodes[cfg.fragment_id]) & self.pool.left:
                    self.live.remove(item)
                    fut.set_exception(FragmentFailed(f"{cfg.job}: rank 0 exited with -9"))
                continue
            start = self.saved.get(cfg.job, 0)
            done = min(int(start + RATE * cfg.world_size * (self.clock.monotonic() - t0)), cfg.total_samples)
            stop = JobDir(cfg.checkpoint_dir).stop_file.exists()
            if done >= cfg.total_samples or stop:
                self.saved[cfg.job] = done
                self.live.remove(item)
                fut.set_result(FragmentResult(
                    cfg.job, cfg.world_size, 0, 1, done - start, done, 1.0, 0.0, 0.0, 0.0, 0.0,
                    StopReason.DONE if done >= cfg.total_samples else StopReason.SIGNAL, 0.5, ""))

    def prime(self, nodes) -> list:
        return []

    def placed(self, fragment: str, nodes: int) -> dict[int, str]:
        return {}

    def warm_up(self, barrier_dir: Path, log, stop) -> None:
        pass


def _orchestrator(tmp_path, clock, pool, fragments, **kw) -> Orchestrator:
    return Orchestrator(tmp_path / "state", pool, Planner(method="dp", objective="throughput"), warm_up=False,
                        clock=clock, runners=lambda sites: {n: fragments for n in sites},
                        **{"poll_s": 1.0, "settle_s": 2.0, **kw})
