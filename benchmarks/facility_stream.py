"""A production log's job stream, replayed as real sbatch jobs on the local Slurm (tools/local-slurm.sh): the
facility side of benchmarks/facility_replay.py.

How a log's job becomes a local job (``stream_from_swf``):
- size: ``round(nodes * N / machine)`` of the N virtual nodes; a job smaller than one virtual node (a 128-node job
  of a 4,360-node machine is 0.47 of one of 16) is kept as a 1-node job with that probability (a fixed draw per
  job id), so the stream offers the machine the load the log did instead of doubling it (the offered loads
  of the log and of the replayed stream are printed side by side);
- time: compressed by a stated factor C (default 60: a log's hour is a minute here);
- walltime: Slurm's limits are whole minutes, so the compressed walltime is rounded to the nearest whole minute
  (at least 1), and the job's run time is scaled by the SAME factor as its walltime (``run / walltime`` is kept
  per job): the holes the scheduler plans around keep their shape, only their lengths snap to minutes;
- each job is ``sleep`` of its run time (a job that ran into its limit sleeps 2 s less than it: it ends as
  COMPLETED, not TIMEOUT, in both runs alike);
- the machine starts as the log had it: jobs submitted before the window that were still queued or running at
  its start are submitted at 0 with what was left of them (in their submit order).
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from parsl_bft.hostlist import expand_hostlist
from parsl_bft.idle.swf import read_swf

ROOT = Path(__file__).resolve().parent.parent
FACILITY_PREFIX = "fac-"          # facility jobs' names; everything else in a replay is a pilot


@dataclass(frozen=True)
class StreamJob:
    """One facility job of the replayed stream."""

    key: str              # the log's job id
    offset_s: float       # submit time, seconds from the replay's start
    nodes: int
    minutes: int          # Slurm walltime
    sleep_s: float        # its run time here

    @property
    def name(self) -> str:
        return f"{FACILITY_PREFIX}{self.key}"


@dataclass(frozen=True)
class StreamInfo:
    """What was replayed, for the report."""

    swf: str
    window: tuple[float, float]      # unix seconds of the log
    machine: int                     # the log's nodes
    log_load: float                  # offered load: node-seconds the log's jobs ask for within the window (from
    #                                  submit, or the window's start) / the machine's node-seconds
    replay_load: float               # the same for the scaled stream (sizes rounded, walltimes snapped)


def stream_from_swf(path: str | Path, start: float, duration_s: float, nodes: int, compression: float
                    ) -> tuple[list[StreamJob], StreamInfo]:
    """The jobs of ``[start, start + duration_s)`` of the log (log seconds), scaled to ``nodes`` nodes and
    compressed ``compression`` times (module docstring)."""
    t = read_swf(path)
    end = start + duration_s
    jobs: list[StreamJob] = []
    log_busy = replay_busy = 0.0
    for i in range(len(t)):
        sub, run, est = float(t.submit[i]), float(t.run[i]), float(max(t.estimate[i], 1.0))
        began = sub + max(float(t.wait[i]), 0.0)
        if sub >= end or began + run <= start:
            continue
        done = max(0.0, start - began)              # what had run before the window (running at its start)
        run_left, est_left = run - done, max(est - done, 1.0)
        size = int(t.size[i])
        log_busy += size * min(run_left, end - max(sub, start))
        minutes = max(1, round(est_left / compression / 60))
        sleep_s = min(run_left / est_left * minutes * 60, minutes * 60 - 2.0)
        share = size * nodes / t.capacity
        if share < 1 and _draw(int(t.job_id[i])) >= share:
            continue                                # thinned: see the module docstring
        n = min(nodes, max(1, round(share)))
        offset = max(0.0, (sub - start) / compression)
        jobs.append(StreamJob(str(int(t.job_id[i])), offset, n, minutes, max(sleep_s, 1.0)))
        replay_busy += n * min(max(sleep_s, 1.0), duration_s / compression - offset)
    jobs.sort(key=lambda j: j.offset_s)
    return jobs, StreamInfo(str(path), (start, end), t.capacity, log_busy / (t.capacity * duration_s),
                            replay_busy / (nodes * duration_s / compression))


def _draw(job_id: int) -> float:
    """A fixed number in [0, 1) per job id (the same in every run and on every machine)."""
    return (job_id * 0.6180339887498949) % 1.0


@dataclass(frozen=True)
class JobRecord:
    """One job of a replay as Slurm's job-completion log has it, in seconds from the replay's start."""

    job_id: str
    name: str
    partition: str
    state: str
    start: float | None      # None: it never started
    end: float | None
    nodes: tuple[str, ...]


class LocalSlurm:
    """The replay's own local Slurm (its own base folder and ports, so it never meets the tests' cluster)."""

    def __init__(self, nodes: int, base: str = "/tmp/local-slurm-replay", port: int = 19817):
        self.nodes, self.base, self.port = nodes, base, port
        self.env = {**os.environ, "SLURM_CONF": f"{base}/etc/slurm.conf", "SLURM_TIME_FORMAT": "%s"}

    @property
    def conf(self) -> str:
        return self.env["SLURM_CONF"]

    def _script(self, action: str) -> subprocess.CompletedProcess[str]:
        """tools/local-slurm.sh ACTION on this cluster (fresh state on restart, no munge)."""
        env = {**self.env, "SLURM_LOCAL_BASE": self.base, "SLURM_LOCAL_PORT": str(self.port),
               "SLURM_LOCAL_NODES": str(self.nodes), "SLURM_LOCAL_AUTH": "none", "SLURM_LOCAL_FRESH": "1"}
        return subprocess.run([str(ROOT / "tools" / "local-slurm.sh"), action], env=env, capture_output=True,
                              text=True)

    def restart(self) -> None:
        """A fresh cluster: no jobs, every node idle."""
        r = self._script("restart")
        if r.returncode != 0:
            raise RuntimeError(f"tools/local-slurm.sh restart failed: {r.stderr[-2000:]}")

    def clean(self) -> None:
        self._script("clean")

    def hold(self) -> None:
        """A maintenance reservation on every node: nothing starts until ``release``."""
        self.run("scontrol", "create", "reservation", "reservationname=hold", "starttime=now", "duration=30",
                 "nodes=ALL", "users=root", "flags=maint,ignore_jobs")

    def release(self) -> None:
        self.run("scontrol", "delete", "reservationname=hold")

    def run(self, *argv: str) -> str:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=True).stdout

    def query(self, *argv: str, tries: int = 10) -> str:
        """A read-only command (squeue), tried again for a while: a busy slurmctld on a loaded machine times out
        now and then (the CI's replay failed on one squeue), and asking twice changes nothing."""
        for i in range(tries):
            r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True)
            if r.returncode == 0:
                return r.stdout
            time.sleep(min(2.0, 0.2 * 2 ** i))
        raise RuntimeError(f"{' '.join(argv)} failed {tries} times (exit {r.returncode}): {r.stderr.strip()[-500:]}")

    def sbatch(self, job: StreamJob) -> str:
        return self.run("sbatch", "--parsable", "-p", "debug", "-N", str(job.nodes), "-t", str(job.minutes),
                        "-J", job.name, "-o", "/dev/null", "--wrap", f"sleep {job.sleep_s:.1f}").strip().split(";")[0]

    def planned(self) -> dict[str, float]:
        """Pending jobs' planned starts (unix s), by name; those without a plan are left out."""
        out = {}
        for line in self.query("squeue", "-h", "-t", "PD", "-o", "%j|%S").splitlines():
            name, _, when = line.partition("|")
            if when.strip().isdigit():
                out[name] = float(when)
        return out

    def cancel_all(self, timeout_s: float = 120.0) -> None:
        """scancel every job and wait until none runs (their records are then in the completion log)."""
        subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], env=self.env, capture_output=True)
        deadline = time.monotonic() + timeout_s
        while self.query("squeue", "-h", "-o", "%i").strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"ran out of time waiting for the replay's jobs to end ({timeout_s:.0f} s)")
            time.sleep(0.5)

    @property
    def jobcomp(self) -> Path:
        return Path(self.base) / "state" / "log" / "jobcomp.txt"

    def records(self, since_byte: int, t0: float) -> list[JobRecord]:
        """The completion log's records written after ``since_byte``, times relative to ``t0``."""
        if not self.jobcomp.exists():
            return []
        with open(self.jobcomp, "rb") as f:
            f.seek(since_byte)
            text = f.read().decode(errors="replace")
        return [r for r in (_record(line, t0) for line in text.splitlines()) if r is not None]

    def jobcomp_size(self) -> int:
        return self.jobcomp.stat().st_size if self.jobcomp.exists() else 0


def _record(line: str, t0: float) -> JobRecord | None:
    kv = dict(item.partition("=")[::2] for item in line.split() if "=" in item)
    if "JobId" not in kv:
        return None

    def when(key: str) -> float | None:
        text = kv.get(key, "")
        if not text or text in ("Unknown", "None", "N/A"):
            return None
        return (float(text) if text.isdigit() else datetime.fromisoformat(text).timestamp()) - t0
    start, end = when("StartTime"), when("EndTime")
    nodes = expand_hostlist(kv.get("NodeList", "")) if kv.get("NodeList") not in (None, "", "(null)") else ()
    if not nodes or start is None or (end is not None and end <= start and kv.get("JobState") == "CANCELLED"):
        start = None                          # cancelled while queued: never ran
    return JobRecord(kv["JobId"], kv.get("Name", ""), kv.get("Partition", ""), kv.get("JobState", ""), start, end,
                     nodes)


@dataclass
class Replayed:
    """What one replay of the stream saw: every job's record, and each facility job's first planned start."""

    t0: float
    duration_s: float
    since: int                            # the completion log's size when the replay began
    first_plan: dict[str, float]          # facility job name -> its first planned start (s from t0)
    records: list[JobRecord]

    def facility(self) -> dict[str, JobRecord]:
        return {r.name: r for r in self.records if r.name.startswith(FACILITY_PREFIX)}

    def pilots(self) -> list[JobRecord]:
        return [r for r in self.records if not r.name.startswith(FACILITY_PREFIX)]


def replay(cluster: LocalSlurm, jobs: list[StreamJob], duration_s: float,
           progress: Callable[[float], object] | None = None) -> Replayed:
    """The stream on a cluster ``hold()`` keeps from starting anything: the jobs queued at the stretch's start
    are submitted, the hold is lifted, and from that whole second (t0) each later job is submitted at its
    offset while the planned starts are watched, until ``duration_s``. The records are read by ``finish``
    (after whatever ran beside the stream has been stopped). ``progress(seconds)`` is called about once a
    second."""
    since = cluster.jobcomp_size()
    pending = list(jobs)
    while pending and pending[0].offset_s <= 0:
        cluster.sbatch(pending.pop(0))
    t0 = float(int(time.time()) + 1)           # Slurm's times are whole seconds: so is every run's t0
    time.sleep(max(0.0, t0 - time.time()))
    cluster.release()
    out = Replayed(t0, duration_s, since, {}, [])
    last_look = -1.0
    while (now := time.time() - t0) < duration_s:
        while pending and pending[0].offset_s <= now:
            cluster.sbatch(pending.pop(0))
        if now - last_look >= 1.0:
            last_look = now
            for name, when in cluster.planned().items():
                if name.startswith(FACILITY_PREFIX) and name not in out.first_plan:
                    out.first_plan[name] = when - t0
            if progress is not None:
                progress(now)
        nxt = pending[0].offset_s if pending else duration_s
        time.sleep(max(0.0, min(0.2, nxt - now)))
    return out


def finish(cluster: LocalSlurm, replayed: Replayed) -> Replayed:
    """End the replay: cancel what is left, read the completion log. A job that started after the stretch's
    end (while what ran beside it was being stopped) did not start within it."""
    cluster.cancel_all()
    replayed.records = [r if r.start is None or r.start < replayed.duration_s else replace(r, start=None, end=None)
                        for r in cluster.records(replayed.since, replayed.t0)]
    return replayed
