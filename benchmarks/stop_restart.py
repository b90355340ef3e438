"""One resize as this runtime pays it, timed: a training fragment gets a stop request -> it has saved and exited
-> the next fragment is launched -> its first step is done. Shared by resize_costs.py (CPU: the costs file) and
gpu.py (one GPU)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parsl_bft.train.config import FragmentResult
from parsl_bft.train.protocol import JobDir


@dataclass
class Resize:
    """The two fragments of a resize and the wall time around each."""

    stopped: FragmentResult      # the fragment that got the stop request (its final save: checkpoint_s)
    next: FragmentResult         # the one launched after it
    stop_to_exited_s: float      # stop request -> saved and exited
    launch_to_done_s: float      # launched -> its steps done and its own final save written

    @property
    def total_s(self) -> float:
        """Stop request -> the next fragment's first step (its own final save left out)."""
        return self.stop_to_exited_s + self.launch_to_done_s - self.next.checkpoint_s


def stop_and_relaunch(job_dir: Path, first: Callable[[], FragmentResult | None],
                      then: Callable[[], FragmentResult | None], *, past_step: int, poll_s: float) -> Resize:
    """Run ``first`` (a fragment that trains until stopped) until it is past ``past_step``, request its stop,
    then run ``then`` (the next fragment, a step or a few) in the same job directory."""
    job = JobDir(job_dir).ensure()
    out: dict[str, FragmentResult | None] = {}
    th = threading.Thread(target=lambda: out.setdefault("r", first()))
    th.start()
    while (p := job.progress()) is None or p.step < past_step:      # training, past its first steps
        if not th.is_alive():
            raise RuntimeError(f"{job_dir}: the first fragment ended before it trained")
        time.sleep(poll_s)
    t_stop = time.perf_counter()
    job.request_stop()
    th.join()
    t_exited = time.perf_counter()
    job.clear_stop()
    t_launch = time.perf_counter()
    b = then()
    t_done = time.perf_counter()
    a = out.get("r")
    if a is None or b is None:
        raise RuntimeError(f"{job_dir}: a fragment of the resize ended without a result")
    return Resize(a, b, t_exited - t_stop, t_done - t_launch)
