"""The fragment <-> orchestrator protocol: what they tell each other through a job's directory.

Both sides import this module and nothing else of each other. A job directory (on the shared file system of a
site) holds, besides the checkpoints:

``STOP``            the orchestrator's "checkpoint and stop" request (a reclaim notice, a rescale, shutdown);
                    "hand-over" in it (not at shutdown): the newest periodic checkpoint may stand for the final save
``GENERATION``      the orchestrator life that owns the job; a fragment of an older life must not save
``FRAGMENT``        the fragment that runs the job now; an older one (given up for lost) must not save
``progress.json``   rank 0's live progress: step, samples, the last periodic save (work at risk)
``.ranks-<host>-<frag>-<pid>.pid``  the rank processes of a fragment on one host, with their start times, so a
                    restarted orchestrator kills its predecessor's ranks and never a recycled pid
``.errors/<frag>/rank<r>.json``  a failed rank's exception and traceback (torch.distributed.elastic's
                    ``@record`` idea): the failure report names the rank that failed first, with its traceback

Rank placement and the rendezvous itself go through a torch TCPStore, not files (see ``launcher``).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

HAND_OVER = "hand-over"      # the STOP file's text when the fragment may hand over its periodic checkpoint


def hostname() -> str:
    """This host's name, as the rank pid files and temporary files are named."""
    return socket.gethostname()


def proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None when there is no such process.
    With the pid it identifies a process uniquely: pids are recycled, (pid, start) pairs are not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # the command name (field 2) may hold spaces and ')': fields after the last ')' are plain
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass
class Progress:
    """Rank 0's live report (``progress.json``): where training stands and how much work a loss would cost."""

    step: int
    samples_done: int
    loss: float
    world: int
    saved_step: int          # the newest checkpoint this fragment has written (its start step before any)
    saved_at: float          # unix time of that save (the fragment's start before any)
    t: float                 # unix time of this report


@dataclass
class RankError:
    """A failed rank's exception, where and when it happened, and its traceback (``.errors/<frag>/rank<r>.json``)."""

    rank: int
    host: str
    pid: int
    t: float
    kind: str
    message: str
    traceback: str

    def summary(self, lines: int = 200) -> str:
        """Who failed first (rank, host, exception) and the last ``lines`` lines of the traceback."""
        tb = "\n".join(self.traceback.rstrip().splitlines()[-lines:])
        return f"rank {self.rank} on {self.host} failed first: {self.kind}: {self.message}\n{tb}"


class JobDir:
    """One job's directory at one site, as both sides see it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def ensure(self) -> JobDir:
        """Create the directory if it is not there yet."""
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # --- stop requests -------------------------------------------------------------------------------
    @property
    def stop_file(self) -> Path:
        """The ``STOP`` file a running fragment watches."""
        return self.path / "STOP"

    def request_stop(self, hand_over: bool = False) -> None:
        """Ask the running fragment to checkpoint and stop; ``hand_over``: it may hand over its newest periodic
        checkpoint instead of a final save when that is cheaper (``saver.hand_over``: a resize or a reclaim, not
        a shutdown, whose checkpoint is the newest state)."""
        self.stop_file.write_text(HAND_OVER if hand_over else "")

    def stop_hands_over(self) -> bool:
        """Whether the stop request lets the fragment hand over its newest periodic checkpoint."""
        try:
            return self.stop_file.read_text()[:len(HAND_OVER) + 1] == HAND_OVER
        except (OSError, UnicodeDecodeError):
            return False

    def clear_stop(self) -> None:
        """Withdraw the stop request (before the next fragment starts)."""
        self.stop_file.unlink(missing_ok=True)

    # --- fencing -------------------------------------------------------------------------------------
    def _mark(self, name: str, value: str) -> None:
        self.ensure()
        tmp = self.path / f".{name}.{hostname()}.{os.getpid()}"
        tmp.write_text(value)
        os.replace(tmp, self.path / name)          # never half-written for a reader

    def _marked(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text().strip()
        except FileNotFoundError:
            return None

    def own(self, generation: str) -> None:
        """This orchestrator life owns the job from now on: older fragments may no longer save."""
        self._mark("GENERATION", generation)

    def owner(self) -> str | None:
        """The orchestrator life that owns the job (None: none has yet)."""
        return self._marked("GENERATION")

    def run_fragment(self, fragment: str) -> None:
        """The fragment the orchestrator runs the job as from now on: an older one of the same life (one given
        up for lost while a rank of it still ran) may no longer save."""
        self._mark("FRAGMENT", fragment)

    def current_fragment(self) -> str | None:
        """The fragment the job runs as now (None: none started yet)."""
        return self._marked("FRAGMENT")

    # --- progress ------------------------------------------------------------------------------------
    def write_progress(self, p: Progress) -> None:
        """Replace ``progress.json`` with ``p`` (atomically)."""
        tmp = self.path / f".progress.{hostname()}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(p)))
        os.replace(tmp, self.path / "progress.json")       # never a half-written file for the reader

    def progress(self) -> Progress | None:
        """The newest progress report, or None (none yet, or unreadable)."""
        try:
            return Progress(**json.loads((self.path / "progress.json").read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    # --- rank processes ------------------------------------------------------------------------------
    def record_ranks(self, fragment: str, pids: list[int], node: str = "") -> Path:
        """``node``: the scheduler's name of the node (several may share a host, as on a local Slurm)."""
        f = self.path / f".ranks-{hostname()}-{fragment}-{os.getpid()}.pid"
        f.write_text(json.dumps({"host": hostname(), "node": node,
                                 "pids": {str(p): proc_start_time(p) for p in pids}}))
        return f

    def live_ranks(self, fragment: str | None = None, forget: bool = False) -> list[int]:
        """The recorded rank processes on this host (of one fragment, or all) that still run and are still the
        processes recorded (a pid may be reused); ``forget``: delete the records read. Ranks on other hosts are
        not seen here."""
        out = []
        for f in self.path.glob(f".ranks-{hostname()}-{fragment or '*'}-*.pid"):
            try:
                rec = json.loads(f.read_text())
            except (FileNotFoundError, ValueError):
                continue
            pids = rec.get("pids") if isinstance(rec, dict) else None
            for pid, start in (pids.items() if isinstance(pids, dict) else ()):   # another shape: not ours
                if str(pid).isdigit() and isinstance(start, str) and proc_start_time(int(pid)) == start:
                    out.append(int(pid))
            if forget:
                f.unlink(missing_ok=True)
        return out

    def kill_ranks(self, fragment: str | None = None) -> int:
        """SIGKILL the recorded rank processes on this host (of one fragment, or all) that are still the
        processes recorded; returns how many were killed. Ranks on other hosts end with their pilot."""
        killed = 0
        for pid in self.live_ranks(fragment, forget=fragment is None):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    # --- the launcher's handshake with its ranks -------------------------------------------------------
    # files beside the ranks, not store keys: the launcher (a Parsl worker) then never imports torch, and a
    # local worker warms up in one torch import (its rank forkserver's), not two

    def _ready_path(self, fragment: str, rank: int) -> Path:
        return self.path / f".ready-{fragment}-{rank}"

    def mark_ready(self, fragment: str, rank: int) -> None:
        """Rank ``rank`` has its signal handlers: the launcher may now forward signals to it."""
        self._ready_path(fragment, rank).touch()

    def all_ready(self, fragment: str, ranks: list[int]) -> bool:
        """Whether every rank of ``ranks`` has said ``mark_ready``."""
        return all(self._ready_path(fragment, r).exists() for r in ranks)

    @staticmethod
    def _result_name(fragment: str) -> str:
        return f".result-{fragment}.json"

    def write_result(self, fragment: str, text: str) -> None:
        """Rank 0's result, whole or not at all (a reader never sees half of it)."""
        self._mark(self._result_name(fragment), text)

    def read_result(self, fragment: str) -> str | None:
        """Rank 0's result (None: it wrote none)."""
        return self._marked(self._result_name(fragment))

    def end_handshake(self, fragment: str, ranks: list[int]) -> None:
        """The launcher of ``ranks`` is done with their marks (and with the result, when rank 0 was its)."""
        for r in ranks:
            self._ready_path(fragment, r).unlink(missing_ok=True)
        if 0 in ranks:
            (self.path / self._result_name(fragment)).unlink(missing_ok=True)

    # --- failures ------------------------------------------------------------------------------------
    # --- rank output ----------------------------------------------------------------------------------
    KEEP_LOGS = 32            # the newest rank logs kept per job (a failed rank's among them)

    def log_path(self, fragment: str, rank: int) -> Path:
        """Where rank ``rank`` of ``fragment`` writes its stdout and stderr."""
        return self.path / "logs" / f"{fragment}-rank{rank}.log"

    def prune_logs(self) -> None:
        """Keep the newest ``KEEP_LOGS`` rank logs."""
        logs = sorted((self.path / "logs").glob("*.log"), key=lambda f: f.stat().st_mtime if f.exists() else 0)
        for f in logs[: -self.KEEP_LOGS]:
            f.unlink(missing_ok=True)

    def errors_dir(self, fragment: str) -> Path:
        """Where the failed ranks of ``fragment`` leave their errors."""
        return self.path / ".errors" / fragment

    def record_error(self, fragment: str, rank: int, exc: BaseException) -> None:
        """Leave rank ``rank``'s exception (message and traceback, bounded) for the launcher's failure report."""
        d = self.errors_dir(fragment)
        d.mkdir(parents=True, exist_ok=True)
        err = RankError(rank, hostname(), os.getpid(), time.time(), type(exc).__name__, str(exc)[:2000],
                        "".join(traceback.format_exception(exc))[-20_000:])
        tmp = d / f".rank{rank}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(err)))
        os.replace(tmp, d / f"rank{rank}.json")

    def errors(self, fragment: str) -> list[RankError]:
        """The fragment's rank errors, first failure first."""
        out = []
        for f in self.errors_dir(fragment).glob("rank*.json"):
            try:
                out.append(RankError(**json.loads(f.read_text())))
            except (FileNotFoundError, ValueError, TypeError):
                continue
        return sorted(out, key=lambda e: (e.t, e.rank))

    def forget_fragment(self, fragment: str) -> None:
        """Remove the fragment's recorded rank errors (it has been reported) and what a launcher killed before its
        end left of the handshake."""
        for f in self.path.glob(f".ready-{fragment}-*"):
            f.unlink(missing_ok=True)
        (self.path / self._result_name(fragment)).unlink(missing_ok=True)
        d = self.errors_dir(fragment)
        if d.exists():
            for f in d.iterdir():
                f.unlink(missing_ok=True)
            d.rmdir()
