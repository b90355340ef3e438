"""Rank 0's saves of a fragment, fenced: periodic ones written on a thread while training goes on, the final one
when it stops, and the live progress report that says which save is the newest on disk."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from .best import BestRule, keep_if_best
from .checkpoint import BackgroundSave, CheckpointStore, TrainingState, finite_weights
from .config import FragmentConfig, FragmentFailed
from .protocol import JobDir, Progress


def hand_over(since_s: float, save_s: float) -> bool:
    """The rule for a stop on a notice: hand over the newest periodic checkpoint (the next fragment trains the steps
    since it again) rather than write the state now, when those steps took less time (``since_s``: from the
    moment that checkpoint's state was copied to now) than writing a checkpoint does (``save_s``: its write)."""
    return since_s < save_s


class Saver:
    """Rank 0's saves, fenced: a fragment of an older orchestrator life must not write. ``periodic`` saves are a
    memory copy written on a thread while training goes on (a failed one fails the next save); ``save`` (the
    final one, on a notice) waits for that write and skips writing the same step twice."""

    def __init__(self, cfg: FragmentConfig, store: CheckpointStore, jd: JobDir) -> None:
        self.cfg, self.store, self.jd = cfg, store, jd
        self.background = BackgroundSave(self._write)
        self._started: tuple[int, float] | None = None   # (step, time) of the state the background writes
        self.durable: tuple[int, float] | None = None    # the same of the last save on disk
        self.written: tuple[int, int] | None = None      # (step, samples_done) of the last state written ...
        self.write_s = 0.0                               # ... and how long that write took
        self.handed_over: tuple[int, int] | None = None  # the final save handed ``written`` over (see ``save``)
        self._lock = threading.Lock()                    # progress is written by the loop and by the writer
        self._progress: Progress | None = None
        self.best = BestRule.parse(cfg.keep_best) if cfg.keep_best else None

    def _fenced(self) -> str | None:
        """Why this fragment may no longer write the job's files, or None: a newer orchestrator life owns the job
        (GENERATION), or it runs as a newer fragment (FRAGMENT: this one was given up for lost)."""
        if self.cfg.generation is None:
            return None
        owner = self.jd.owner()
        if owner is not None and owner != self.cfg.generation:
            return f"fragment of {self.cfg.job} is stale (generation {self.cfg.generation}, the job is now at {owner})"
        current = self.jd.current_fragment()
        if current is not None and current != self.cfg.fragment_id:
            return f"fragment {self.cfg.fragment_id} of {self.cfg.job} is stale (the job runs as {current} now)"
        return None

    def report(self, p: Progress) -> None:
        """Live progress; its saved step is the newest save on disk (a background write reports when it lands).
        A fenced-off fragment stops here (within a report interval) instead of training on for nobody."""
        stale = self._fenced()
        if stale:
            raise FragmentFailed(f"{stale}: stopping")
        with self._lock:
            if self.durable is not None:
                p = replace(p, saved_step=self.durable[0], saved_at=self.durable[1])
            self.jd.write_progress(p)
            self._progress = p

    def periodic(self, state: TrainingState) -> bool:
        """Start a background save; False while the last one still writes (try again next step)."""
        if self.background.busy():
            return False
        self._started = (state.step, time.time())       # before the thread can finish and read it
        return self.background.start(state)

    def save(self, state: TrainingState, *, notice: bool = False) -> Path:
        """The final save: waits for a background write; the step it already wrote is not written again. Stopped
        by a notice (``notice``), the newest background checkpoint is handed over instead when ``hand_over`` says
        so (``handed_over``: its step and samples, where the job now stands)."""
        last = self.background.wait()
        if last is not None and self.durable is not None and self.durable[0] == state.step:
            return last
        if notice and last is not None and self.durable is not None and self.written is not None \
                and self.written[0] == self.durable[0] and hand_over(time.time() - self.durable[1], self.write_s):
            self.handed_over = self.written
            return last
        return self._write(state)

    def _write(self, state: TrainingState) -> Path:
        stale = self._fenced()
        if stale:
            raise FragmentFailed(f"{stale}: not saving")
        bad = finite_weights(state.model)
        if bad is not None:
            raise FragmentFailed(f"job {self.cfg.job}: weight {bad} is not finite at step {state.step}: not saving "
                                 "(the last finite checkpoint stays)")
        t = time.perf_counter()
        path = self.store.save(state, fsync=self.cfg.fsync)
        if self.best is not None:
            keep_if_best(self.best, path, state.step, state.metrics)
        started = self._started
        with self._lock:
            self.written, self.write_s = (state.step, state.samples_done), time.perf_counter() - t
            self.durable = started if started is not None and started[0] == state.step else (state.step, time.time())
            if self._progress is not None:
                self._progress = replace(self._progress, saved_step=self.durable[0], saved_at=self.durable[1],
                                         t=time.time())
                self.jd.write_progress(self._progress)
        return path
