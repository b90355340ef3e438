"""What the end-to-end tests share: start and finish an orchestrator process, wait for conditions, find what
still runs, and read the event log's chain of committed steps."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_orchestrator(state, timeout=300, mode=None, env=None, img_steps=None):
    args = [sys.executable, str(HERE / "orchestrate.py"), str(state), str(timeout)]
    if mode:
        args += [mode] + ([str(img_steps)] if img_steps else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


class RanOutOfTime(AssertionError):
    """A test's budget ran out while waiting for a condition: says at which step, never a wrong assertion."""


def finish(p, timeout=600, what="the orchestrated run's jobs"):
    """The last JSON line of an orchestrate.py process (its summary and results). A process still running after
    ``timeout`` s, or a run that ended at its own time cap (its summary's ``ended``), ran out of time at step
    ``what``: RanOutOfTime, not the wrong job status a later assertion would report."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RanOutOfTime(f"ran out of time at step: {what} (the process still ran after {timeout} s)") from None
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    summary = res.get("summary") or {}
    if summary.get("ended") == "timeout":
        left = {r["job"]: f"{r['samples']:,} samples" for r in summary.get("jobs", []) if r["status"] != "done"}
        raise RanOutOfTime(f"ran out of time at step: {what} (the orchestrator's time cap ended the run after "
                           f"{summary.get('wall_s', 0):.0f} s; not done: {left})")
    return res


def wait_for(pred, timeout=300, step=0.2, what="condition", or_none=False):
    """Conditions, not sleeps: the machine may be loaded; ``timeout`` only stops a hung test (an AssertionError
    naming ``what``; None instead with ``or_none``, where a caller goes on without it)."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    if or_none:
        return None
    raise RanOutOfTime(f"ran out of time at step: {what} (not met within {timeout} s; a loaded machine, or a hang)")


def term_group(p, within_s: float) -> tuple[float, str]:
    """One SIGTERM to the process group of ``p`` (started with ``start_new_session``), which must then end within
    ``within_s``: when it was sent, and what ``p`` wrote to stderr."""
    t = time.time()
    os.killpg(p.pid, signal.SIGTERM)
    wait_for(lambda: p.poll() is not None, within_s, 0.1, what="the run's end after one SIGTERM to its group")
    return t, p.stderr.read()


def live_ranks(state) -> list[int]:
    """Rank processes recorded in the job directories under ``state`` that still run (and are still those processes)."""
    from parsl_bft.train.protocol import proc_start_time
    out = []
    for f in state.glob("**/.ranks-*.pid"):
        try:
            rec = json.loads(f.read_text())
        except (FileNotFoundError, ValueError):
            continue
        out += [int(p) for p, st in rec["pids"].items() if st and proc_start_time(int(p)) == st]
    return out


def wait_training(state, reports: int, timeout: float = 120) -> bool:
    """Until the ranks under ``state`` have reported progress ``reports`` more times (rank 0 of each running
    fragment reports every 0.5 s of training): a moment for a fault picked by how far training got, not by a
    sleep. False when nothing trained for ``timeout`` s (the caller strikes anyway: faults meet any state)."""
    seen: dict[Path, set[float]] = {}

    def progressed():
        for f in state.glob("**/progress.json"):
            try:
                seen.setdefault(f, set()).add(json.loads(f.read_text())["t"])
            except (FileNotFoundError, ValueError, KeyError):
                continue
        return sum(len(ts) - 1 for ts in seen.values()) >= reports
    return bool(wait_for(progressed, timeout, 0.05, or_none=True))


def our_processes(state) -> list[str]:
    """Processes whose command line names the state directory (Parsl interchange and worker pools)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,etimes,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if str(state) in line and "ps -eo" not in line]


def assert_nothing_left(state, timeout=120):
    """No rank and no Parsl process of the run under ``state`` outlives it; a failure names what is left."""
    if wait_for(lambda: not live_ranks(state) and not our_processes(state), timeout, or_none=True):
        return
    ranks = [subprocess.run(["ps", "-o", "pid,ppid,etimes,args", "-p", str(p)], capture_output=True,
                            text=True).stdout.splitlines()[-1] for p in live_ranks(state)]
    raise AssertionError(f"left {timeout} s after the run: ranks {ranks}, processes {our_processes(state)}")


class Beside:
    """Reference runs (``orchestrate.<function>(*args)`` for each call, one after another) in a process of their
    own, started together with the run they check: that run mostly waits (for idle nodes, restarts, pilots), so
    they use the CPU it leaves idle instead of adding their time after it. At the lowest priority (nice 19): they
    must not slow the run they check, whose progress between reclaims depends on the CPU it gets. ``wait()``
    before reading what they wrote; leaving the ``with`` block ends them if they still run (a test failed first)."""

    def __init__(self, *calls: tuple):
        calls_json = json.dumps([[c[0], *(str(a) if isinstance(a, Path) else a for a in c[1:])] for c in calls])
        code = ("import json, os, sys; os.nice(19); sys.path.insert(0, sys.argv[1]); import orchestrate\n"
                "for f, *a in json.loads(sys.argv[2]): getattr(orchestrate, f)(*a)")
        self.p = subprocess.Popen([sys.executable, "-c", code, str(HERE), calls_json])

    def wait(self, timeout: float = 600) -> None:
        assert self.p.wait(timeout=timeout) == 0, "a reference run failed (its output is in the captured stderr)"

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def __enter__(self) -> "Beside":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def check_chain(db, job: str, total_steps: int) -> None:
    """From the event log alone: every fragment resumed from the newest checkpoint there was, the committed
    steps form one unbroken run 0 -> total (no step skipped, none counted twice)."""
    expected = 0
    for _, kind, d in db.events():
        if kind == "start" and job in d["resume"]:
            assert d["resume"][job] >= expected, (job, d, expected)
            expected = d["resume"][job]
        if d.get("job") != job:
            continue
        if kind == "launch":
            assert d["resume_step"] == expected, (job, d, expected)
        elif kind == "fragment-done":
            assert d["start_step"] == expected, (job, d, expected)
            expected = d["end_step"]
        elif kind == "fragment-failed":
            assert d["saved_step"] >= expected, (job, d, expected)
            expected = d["saved_step"]
    assert expected == total_steps, (job, expected, total_steps)


def fragment_path(db, job: str) -> list[tuple[int, int, int]]:
    """The committed chain of a job's fragments, from the event log: (ranks, first step, last step) of each
    fragment that moved the job on (one that failed counts up to the periodic save it left). Replaying these
    fragments one after another outside the orchestrator gives the same model bit for bit (``replay_path``)."""
    ranks: dict[str, int] = {}
    path: list[tuple[int, int, int]] = []
    for _, kind, d in db.events():
        if d.get("job") != job:
            continue
        if kind == "launch":
            ranks[d["fragment"]] = d["ranks"]
        elif kind == "fragment-done" and d["end_step"] > d["start_step"]:
            path.append((d["ranks"], d["start_step"], d["end_step"]))
        elif kind == "fragment-failed" and d["saved_step"] > d["resume_step"]:
            path.append((ranks[d["fragment"]], d["resume_step"], d["saved_step"]))
    return path


def replay_path(path, directory, **cfg) -> None:
    """Train ``path`` (``fragment_path``) into ``directory``: each fragment on its ranks for its steps, from the
    checkpoint the one before left (``cfg``: the job's FragmentConfig fields)."""
    from parsl_bft.train.config import FragmentConfig
    from parsl_bft.train.launcher import run_fragment
    for ranks, first, last in path:
        assert _saved_step(directory) == first, (first, path)
        run_fragment(FragmentConfig(checkpoint_dir=str(directory), world_size=ranks, steps=last - first, **cfg))


def _saved_step(directory) -> int:
    """The step of the newest checkpoint in ``directory`` (0: none)."""
    from parsl_bft.train.checkpoint import CheckpointStore
    st = CheckpointStore(directory).latest(arrays=False)
    return st.step if st is not None else 0


def assert_same_training(final, ref, steps: int) -> None:
    """``final`` (a loaded checkpoint) is the training ``ref`` (an uninterrupted run's) would give: exact steps,
    and the last 20 losses within 5 %. For jobs whose world size changed under Adam(W), which turns float
    summation-order differences into parameter differences of about one learning rate (4e-3 after 20 steps at
    world 2 vs 1), so parameters are not the guarantee; SGD jobs are compared parameter by parameter."""
    assert final.step == steps, (final.step, steps)
    tail, ref_tail = [m["loss"] for m in final.metrics[-20:]], [m["loss"] for m in ref.metrics[-20:]]
    assert abs(sum(tail) - sum(ref_tail)) / sum(ref_tail) < 0.05, (sum(tail) / 20, sum(ref_tail) / 20)


def kill_a_rank(state, rng) -> bool:
    """SIGKILL one of the training ranks still running under ``state`` (chosen by ``rng``, so a seeded schedule
    stays seeded). False when none runs any more."""
    pids = live_ranks(state)
    if not pids:
        return False
    try:
        os.kill(rng.choice(sorted(pids)), signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def break_next_checkpoint_write(chaos_log, proc) -> None:
    """Arm the checkpoint fault (PARSL_BFT_CHAOS_ARM=chaos_log): the next save, periodic or final, dies half-way.
    Returns once it has fired, or ``proc`` (the orchestrator) has ended."""
    (chaos_log / "save_optimizer").touch()
    wait_for(lambda: not (chaos_log / "save_optimizer").exists() or proc.poll() is not None, timeout=300)


def assert_same(a, b) -> None:
    """Two checkpoint states equal bit for bit: tensors (8-bit floats by their bytes), arrays, containers."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 and a.dtype.is_floating_point else a,
                           b.view(torch.uint8) if b.dtype.itemsize == 1 and b.dtype.is_floating_point else b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


class InlineRunner:
    """The cheapest orchestrator harness: a SiteRunner that runs each fragment in this process, at once, on one
    rank (no Parsl, no rank processes)."""

    def __init__(self, name, site, store):
        self.gang = False

    def launch(self, cfg, nodes: int):
        from parsl_bft.execution.htex import FragmentHandle
        from parsl_bft.train.fragment import train_rank
        fut: Future = Future()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            fut.set_result(train_rank(replace(cfg, fsync=False, deterministic=False)))
        except Exception as e:
            fut.set_exception(e)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
        return FragmentHandle([fut])

    def placed(self, fragment, nodes):
        return {}

    def prime(self, nodes):
        return []

    def warm_up(self, *a):
        pass


# what starts HDF5's own structures (object headers, B-trees, heaps, free-space and global heap records)
_HDF5_SIGNATURES = (b"FRHP", b"FHDB", b"FHIB", b"BTHD", b"BTLF", b"BTIN", b"OHDR", b"OCHK", b"TREE", b"HEAP", b"SNOD",
                    b"FSHD", b"FSSE", b"GCOL")


def damage_checkpoint(path: Path) -> None:
    """A single flipped byte that HDF5 itself trips over (RuntimeError inside h5py before issue 12) when there is
    one, else one the checksums catch. The bytes that start HDF5's own structures (their signatures) are tried
    first: flipping one trips HDF5 at once, where trying every 7th byte took hundreds of loads."""
    import pytest

    from parsl_bft.train.checkpoint import CheckpointError, load_checkpoint
    data = path.read_bytes()
    signatures = sorted(m.start() for sig in _HDF5_SIGNATURES for m in re.finditer(re.escape(sig), data))
    for pos in [*signatures, *range(0, len(data), 7)]:
        b = bytearray(data)
        b[pos] ^= 0xFF
        path.write_bytes(b)
        try:
            load_checkpoint(path)
        except CheckpointError as e:
            if "RuntimeError" in str(e):
                return
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    path.write_bytes(b)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def inline_orchestrator(state: Path, monkeypatch, **kw):
    """An Orchestrator on ``state`` whose fragments run in this process (InlineRunner) on one emulated node."""
    from parsl_bft.execution import orchestrator as orch_mod
    from parsl_bft.execution.pool import EmulatedPool
    from parsl_bft.planner import Planner
    monkeypatch.setattr(orch_mod, "SiteRunner", InlineRunner)
    pool = EmulatedPool.pattern(nodes=1, period_s=100_000.0, cycles=1, notice_s=2.0)
    return orch_mod.Orchestrator(state, pool, Planner(method="dp", objective="throughput", t_fwd=20.0),
                                 warm_up=False, settle_s=0.0, poll_s=0.01, **kw)


IMG_JOB = dict(workload="images", samples=32 * 8, global_batch=32, min_nodes=1, max_nodes=1,
               workload_args={"n": 256}, rate_guess=3000.0)


# --- processes, as /proc shows them ---------------------------------------------------------------------------

def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first); [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def parent_of(pid: int) -> int | None:
    """The parent's pid; None once the process is gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def children_of(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_of(int(p)) == pid]


def cmdline_of(pid: int) -> str:
    """The command line, words joined by spaces; "" once the process is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().partition("=")[::2] for kv in raw if b"=" in kv)
