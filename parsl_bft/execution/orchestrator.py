"""The orchestrator: watches the idle pool, re-plans, and runs training fragments as Parsl apps.

It drives the same ``Controller`` as the simulator (admission, reclaims, planner calls) but with real progress:
fragments report samples done; a node's reclaim notice becomes a "stop and checkpoint" request, and whatever
still runs on a node when it leaves is killed (the fragment fails; the job resumes from its last checkpoint -
a normal event, no retry is spent). State lives in SQLite, so a restarted orchestrator picks every job up again;
stale fragments of a dead orchestrator are killed and fenced off (GENERATION file) before anything restarts.
On pilots (a pool with ``gang``) a fragment is one Parsl task per rank and the books follow where they landed;
with a MultiPool each site has its executor and checkpoint directory, and a job that moves takes its newest
good checkpoint along.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
import uuid
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..control import Controller, Timeline
from ..jobs import JobSpec
from ..scaling import ScalingCurve
from ..train.checkpoint import CheckpointStore
from ..planner.problem import site_of
from .pool import MultiPool, SitePool
from .state import StateDB


@dataclass
class TrainingJob:
    """What a scientist declares: a model to train on whatever idle nodes there are."""

    name: str
    workload: str = "images"
    samples: int = 50_000
    min_nodes: int = 1
    max_nodes: int = 4
    global_batch: int = 64
    workload_args: dict = field(default_factory=dict)
    t_up: float = 10.0             # seconds of progress a rescale costs (measure yours: parsl-bft profile)
    t_down: float = 10.0
    weight: float = 1.0
    rate_guess: float = 1000.0     # samples/s on one node until measured (fragments feed real rates back)

    def spec(self) -> JobSpec:
        return JobSpec(self.name, self.name, self.min_nodes, self.max_nodes, self.t_up, self.t_down,
                       float(self.samples), 0.0, self.weight)


class _Gang:
    """The n one-rank tasks of a fragment as one future: done when all are, or as soon as one has failed."""

    def __init__(self, futures: list[Future]):
        self.futures = futures

    def _failed(self) -> Future | None:
        return next((f for f in self.futures if f.done() and f.exception() is not None), None)

    def done(self) -> bool:
        return self._failed() is not None or all(f.done() for f in self.futures)

    def result(self) -> dict:
        failed = self._failed()
        if failed is not None:
            raise failed.exception()
        return self.futures[0].result()


@dataclass
class _Running:
    future: Future | _Gang
    size: int
    wall_launched: float           # unix time
    stop_requested: bool = False
    killed: bool = False           # we killed it (its node was reclaimed): a normal event, not a failure
    rendezvous: Path | None = None  # a gang: where its ranks meet and say which node they run on
    placed: set[str] = field(default_factory=set)
    doomed: set[str] = field(default_factory=set)    # its nodes the facility is taking back
    site: str = ""


class Orchestrator:
    def __init__(self, state_dir: str | Path, pool, planner, *, executor: str = "bft_local",
                 max_concurrent: int = 10, poll_s: float = 0.2, max_failures: int = 3, settle_s: float = 1.5,
                 warm_up: bool = True, weights: dict[str, float] | None = None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = StateDB(self.dir / "state.sqlite")
        self.pool, self.planner = pool, planner
        # one site, or several (a MultiPool: node ids 'site:node', one executor per site)
        self.sites = pool.sites if isinstance(pool, MultiPool) else {"": SitePool(pool, executor)}
        self.max_concurrent, self.poll_s, self.max_failures = max_concurrent, poll_s, max_failures
        self.settle_s = settle_s       # a rescale costs a fragment restart: wait this long for more joins
        self.warm_up = warm_up         # start every local worker's rank forkserver before the pool starts
        self.weights = dict(weights or {})   # the site admin's per-job weights (weighted objective), by name
        self.failures: dict[str, int] = {}     # consecutive failures that were not reclaims
        self.jobs: dict[str, TrainingJob] = {}
        self.curves: dict[str, ScalingCurve] = {}
        self.futures: dict[str, Future] = {}
        self.running: dict[str, _Running] = {}
        self.generation = uuid.uuid4().hex[:12]
        self.timeline = Timeline()
        self.pool_node_s = 0.0
        self.warm_up_s = 0.0
        self._apps: dict[str, object] = {}
        self.job_site: dict[str, str] = {}     # where each job's checkpoints are (the site it last ran at)
        for name, row in self.db.jobs().items():        # a restart: everything the last orchestrator had
            self._add(TrainingJob(**row["spec"]), row)

    # --- the scientist's API -------------------------------------------------------------------------
    def submit(self, job: TrainingJob) -> Future:
        """Declare a job; the future resolves to the path of its final checkpoint."""
        if job.name in self.jobs:
            if asdict(self.jobs[job.name]) != asdict(job):
                raise ValueError(f"job {job.name!r} already exists with a different spec (state in {self.dir})")
            return self.futures[job.name]
        job.spec()                          # validates sizes etc. with a clear message
        return self._add(job, None)

    def _add(self, job: TrainingJob, row: dict | None) -> Future:
        """Track a job: a new one (``row`` None: persist it) or one found in the state database."""
        self.jobs[job.name] = job
        self.job_site[job.name] = self.db.meta(f"site:{job.name}") or next(iter(self.sites))
        measured = self.db.meta(f"curve:{job.name}")
        # the guess only until the first measurement: never mix guessed and measured points
        self.curves[job.name] = ScalingCurve(job.name, {int(k): v for k, v in measured.items()} if measured
                                             else {1: job.rate_guess})
        fut: Future = Future()
        self.futures[job.name] = fut
        if row is None:
            self.db.upsert(job.name, asdict(job))
        if row and row["status"] == "done":
            fut.set_result(row["checkpoint"])
        return fut

    def pending_specs(self) -> list[JobSpec]:
        """What the planner sees of the jobs not done yet (with the site's weights)."""
        return [replace(self.jobs[n].spec(), weight=self.weights.get(n, self.jobs[n].weight))
                for n, f in self.futures.items() if not f.done()]

    def job_dir(self, name: str, site: str | None = None) -> Path:
        """A job's checkpoints, STOP file and progress at a site (by default: the site it last ran at)."""
        site = self.job_site[name] if site is None else site
        return self.dir / "jobs" / name if not site else self.dir / "sites" / site / "jobs" / name

    def _gang(self, site: str) -> bool:
        """One Parsl task per rank (placed by the executor, one per node), or all ranks in one task."""
        return getattr(self.sites[site].pool, "gang", False)

    # --- the loop ------------------------------------------------------------------------------------
    def run(self, *, progress=None, timeout_s: float | None = None) -> dict:
        """Drive every job to completion (or until ``timeout_s``); returns the run's summary."""
        from parsl import python_app

        from .apps import fragment_rank_task, fragment_task
        self._apps = {name: python_app(fragment_rank_task if self._gang(name) else fragment_task,
                                       executors=[site.executor]) for name, site in self.sites.items()}
        pending = self.pending_specs()
        ctl = Controller(pending, self.curves, self.planner, max_concurrent=self.max_concurrent, model_costs=False)
        for spec in pending:
            self._fence(spec.name)
        self.db.event("start", generation=self.generation, jobs=[s.name for s in pending])
        t_warm = time.monotonic()
        if self.warm_up:
            self._warm_up()
        self.warm_up_s = time.monotonic() - t_warm
        self.pool.start()
        t_start = last = time.monotonic()
        changed, joined_at = True, None
        while ctl.active or ctl.waiting:
            now = time.monotonic()
            dt, last = now - last, now
            self.pool_node_s += len(ctl.pool) * dt
            for a in ctl.active.values():
                a.node_seconds += a.state.size * dt
            for ev in self.pool.poll():
                if ev.kind == "join":     # nodes arrive one by one: plan once they have settled
                    ctl.nodes_joined(ev.nodes, [t_start + u for u in ev.until] if ev.until else ())
                    joined_at = now
                    continue
                changed = True
                # a notice: checkpoint now, and plan without these nodes already; a leave: kill what still runs
                for a in list(ctl.active.values()):
                    r = self.running.get(a.name)
                    if r is not None and set(ev.nodes) & set(a.state.nodes):
                        r.doomed.update(set(ev.nodes) & set(a.state.nodes))
                        self._request_stop(a.name, f"reclaim {ev.kind}")
                if ev.kind == "leave":
                    for name, r in self.running.items():
                        if r.doomed & set(ev.nodes):
                            self._kill(name)
                for name in ctl.nodes_left(ev.nodes):
                    self.db.event("reclaim", job=name, nodes=list(ev.nodes), by=ev.kind,
                                  **({"why": ev.why} if ev.why else {}))
            self._follow_placement(ctl)
            changed |= self._collect(ctl)
            if changed or (joined_at is not None and now - joined_at >= self.settle_s):
                joined_at = None
                ctl.replan(now)
                self._reconcile(ctl)
                self.timeline.record(now - t_start, ctl, lambda a: a.name)
                changed = False
            if progress is not None:
                progress(self)
            if timeout_s is not None and now - t_start > timeout_s:
                break
            time.sleep(self.poll_s)
        for name in list(self.running):
            self._request_stop(name, "shutdown")
        deadline = time.monotonic() + 60
        while self.running and time.monotonic() < deadline:
            self._collect(ctl)
            time.sleep(self.poll_s)
        if hasattr(self.pool, "stop"):
            self.pool.stop()
        self.db.event("stop", generation=self.generation)
        return self.summary(time.monotonic() - t_start)

    def _warm_up(self) -> None:
        """Executors whose workers stay (not pilots): start every worker's rank forkserver before the pool
        does, so no planned node waits seconds for torch to import."""
        from parsl import python_app
        from parsl.dataflow.dflow import DataFlowKernelLoader

        from .apps import warm_up
        futs = []
        for name, site in self.sites.items():
            ex = DataFlowKernelLoader.dfk().executors[site.executor]
            if self._gang(name) or not hasattr(ex, "connected_managers"):
                continue
            deadline = time.monotonic() + 60
            while not ex.connected_managers() and time.monotonic() < deadline:
                time.sleep(0.2)
            n = sum(int(m.get("worker_count", 0)) for m in ex.connected_managers())
            if n < 1:
                continue
            barrier = self.dir / ".warm-up" / f"{self.generation}-{name or 'local'}"
            app = python_app(warm_up, executors=[site.executor])
            futs += [app(str(barrier), n) for _ in range(n)]
        for f in futs:
            try:
                f.result(timeout=180)
            except Exception as e:          # only a slower first fragment; nothing is lost
                self.db.event("warm-up-failed", error=str(e)[:200])
        shutil.rmtree(self.dir / ".warm-up", ignore_errors=True)

    # --- fragments -----------------------------------------------------------------------------------
    def _fence(self, name: str) -> None:
        """Before (re)starting a job: kill ranks left by a dead orchestrator, and fence off their saves."""
        d = self.job_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "GENERATION").write_text(self.generation)
        self._kill_pids(d)
        (d / "STOP").unlink(missing_ok=True)

    def _kill_pids(self, d: Path) -> None:
        for pids in d.glob(".ranks*.pid"):
            host, *ids = pids.read_text().split() or [""]
            if host != socket.gethostname():      # ranks on another node: its scheduler ends them with the pilot
                continue
            for pid in ids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def _launch(self, name: str, size: int, site: str) -> None:
        job = self.jobs[name]
        if site != self.job_site[name]:      # the job moves: its newest good checkpoint goes with it
            staged = CheckpointStore(self.job_dir(name)).stage_to(self.job_dir(name, site))
            self.db.event("stage", job=name, to=site, checkpoint=str(staged) if staged else None)
            self.job_site[name] = site
            self.db.set_meta(f"site:{name}", site)
            self._fence(name)
        d = self.job_dir(name)
        (d / "STOP").unlink(missing_ok=True)
        cfg = dict(job=name, workload=job.workload, checkpoint_dir=str(d), world_size=size,
                   global_batch=job.global_batch, total_samples=job.samples, workload_args=job.workload_args,
                   stop_file=str(d / "STOP"), generation=self.generation, timeout_s=30.0)
        app = self._apps[site]
        rdzv = d / f".rdzv-{uuid.uuid4().hex[:8]}" if self._gang(site) else None
        future = _Gang([app(cfg, r, str(rdzv)) for r in range(size)]) if rdzv else app(cfg)
        self.running[name] = _Running(future, size, time.time(), rendezvous=rdzv, site=site)
        self.db.event("launch", job=name, size=size, **({"site": site} if site else {}))

    def _request_stop(self, name: str, why: str) -> None:
        r = self.running.get(name)
        if r and not r.stop_requested:
            r.stop_requested = True
            (self.job_dir(name) / "STOP").touch()
            self.db.event("stop-request", job=name, why=why)

    def _kill(self, name: str) -> None:
        """The node is gone: whatever did not stop in the notice period dies now."""
        self.running[name].killed = True
        self._kill_pids(self.job_dir(name))

    def _follow_placement(self, ctl: Controller) -> None:
        """A gang's ranks say which node they landed on: the books (who is hit by a reclaim) follow."""
        for name, r in self.running.items():
            if r.rendezvous is None or len(r.placed) == r.size or name not in ctl.active:
                continue
            for f in r.rendezvous.parent.glob(r.rendezvous.name + ".node*"):
                node = f.read_text().strip()
                node = f"{r.site}:{node}" if node and r.site else node
                if node and node not in r.placed:
                    ctl.bind(name, node, r.placed)
                    if node in ctl.active[name].state.nodes:
                        r.placed.add(node)

    def _collect(self, ctl: Controller) -> bool:
        changed = False
        for name, r in list(self.running.items()):
            if not r.future.done():
                continue
            del self.running[name]
            if r.rendezvous is not None:
                self._kill_pids(self.job_dir(name))      # peers of a failed rank; nothing if all ended
                for f in r.rendezvous.parent.glob(r.rendezvous.name + "*"):
                    f.unlink(missing_ok=True)
            changed = True
            row = self.db.jobs()[name]
            a = ctl.active.get(name)
            try:
                res = r.future.result()
                done = int(res["samples_done"])
                ckpt = res["checkpoint"]
                self.failures[name] = 0
                self.db.event("fragment-done", job=name, size=res["world_size"], launched=r.wall_launched,
                              train_started=res["train_started"], train_s=res["train_s"],
                              stopped_by=res["stopped_by"])
                if res["throughput"] > 0 and res["end_step"] > res["start_step"]:
                    measured = {int(k): v for k, v in (self.db.meta(f"curve:{name}") or {}).items()}
                    measured[res["world_size"]] = res["throughput"]
                    self.curves[name] = ScalingCurve(name, measured)
                    self.db.set_meta(f"curve:{name}", measured)
                    if a is not None:
                        a.state.curve = self.curves[name]
                self.db.upsert(name, asdict(self.jobs[name]), fragments=row["fragments"] + 1,
                               train_node_s=row["train_node_s"] + res["train_s"] * res["world_size"])
            except Exception as e:   # a killed or failed fragment: resume from the last good checkpoint
                r.killed |= type(e).__name__ == "ManagerLost"     # its node's worker pool died with the node
                st = CheckpointStore(self.job_dir(name)).latest()
                done, ckpt = (st.samples_done, None) if st else (0, None)
                self.db.event("fragment-failed", job=name, error=str(e)[:300], reclaimed=r.killed)
                self.db.upsert(name, asdict(self.jobs[name]), fragments=row["fragments"] + 1)
                if not r.killed:
                    self.failures[name] = self.failures.get(name, 0) + 1
                    if self.failures[name] >= self.max_failures:
                        self._give_up(ctl, name, e)
                        continue
            if ckpt is None:
                paths = CheckpointStore(self.job_dir(name)).paths()
                ckpt = str(paths[0]) if paths else None
            self.db.upsert(name, asdict(self.jobs[name]), samples_done=done, checkpoint=ckpt,
                           **({"node_s": a.node_seconds} if a is not None else {}))
            if a is not None:
                a.state.samples_done = done
            if done >= self.jobs[name].samples:
                if a is not None:
                    ctl.job_finished(name, time.monotonic())
                self.db.upsert(name, asdict(self.jobs[name]), status="done", size=0)
                self.db.event("done", job=name, checkpoint=ckpt)
                if not self.futures[name].done():
                    self.futures[name].set_result(ckpt)
        return changed

    def _give_up(self, ctl: Controller, name: str, err: Exception) -> None:
        """A job whose fragments fail on their own (not by reclaims) max_failures times in a row stops; its
        checkpoints stay, the error reaches the scientist through the future."""
        if name in ctl.active:
            ctl.job_finished(name, time.monotonic())
        self.db.upsert(name, asdict(self.jobs[name]), status="failed", size=0)
        self.db.event("failed", job=name, error=str(err)[:300])
        if not self.futures[name].done():
            self.futures[name].set_exception(RuntimeError(
                f"job {name}: {self.max_failures} fragments failed in a row; last: {err} "
                f"(checkpoints kept in {self.job_dir(name)})"))

    def _reconcile(self, ctl: Controller) -> None:
        """Make the fragments match the plan: stop those whose size changed, start those that should run."""
        rows = self.db.jobs()
        for a in ctl.active.values():
            want = a.state.size
            r = self.running.get(a.name)
            row = rows[a.name]
            if r is not None and r.size != want and not r.stop_requested:
                self._request_stop(a.name, f"rescale {r.size} -> {want}")
                self.db.upsert(a.name, asdict(self.jobs[a.name]), rescales=row["rescales"] + 1)
            elif r is None and want > 0:
                self._launch(a.name, want, site_of(a.state.nodes[0]))
            self.db.upsert(a.name, asdict(self.jobs[a.name]), status="running" if want else "waiting", size=want,
                           node_s=a.node_seconds)

    # --- reporting -----------------------------------------------------------------------------------
    def live_progress(self) -> dict[str, float]:
        out = {}
        rows = self.db.jobs()
        for name, job in self.jobs.items():
            p = self.job_dir(name) / "progress.json"
            row = rows.get(name, {})
            done = row.get("samples_done", 0)
            if p.exists():
                try:
                    done = max(done, json.loads(p.read_text())["samples_done"])
                except (ValueError, KeyError):
                    pass
            out[name] = min(done, job.samples)
        return out

    def summary(self, wall_s: float) -> dict:
        rows = []
        held = trained = work = 0.0
        for name, r in self.db.jobs().items():
            c = self.curves[name]
            reclaims = sum(1 for _, _, d in self.db.events("reclaim") if d["job"] == name)
            rows.append({"job": name, "status": r["status"], "samples": r["samples_done"], "node_s": r["node_s"],
                         "train_node_s": r["train_node_s"], "fragments": r["fragments"],
                         "rescales": r["rescales"], "reclaims": reclaims, "checkpoint": r["checkpoint"],
                         "e_used": (r["samples_done"] / c.rate(1)) / r["node_s"] if r["node_s"] else 0.0})
            held += r["node_s"]
            trained += r["train_node_s"]
            work += r["samples_done"] / c.rate(1)
        return {"wall_s": wall_s, "warm_up_s": self.warm_up_s, "jobs": rows, "pool_node_s": self.pool_node_s,
                "held_node_s": held, "train_share": trained / held if held else 0.0, "e_used": work / held if held else 0.0}
