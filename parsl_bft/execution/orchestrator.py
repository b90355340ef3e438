"""The orchestrator: watches the idle pool, re-plans, and runs training fragments as Parsl apps.

It drives the same ``Controller`` as the simulator (admission, reclaims, planner calls) but with real progress:
fragments report samples done; a node's reclaim notice becomes a "stop and checkpoint" request, and whatever
still runs on a node when it leaves is killed (the fragment fails; the job resumes from its last checkpoint -
a normal event, no retry is spent). State lives in SQLite, so a restarted orchestrator picks every job up again;
stale fragments of a dead orchestrator are killed and fenced off (GENERATION file) before anything restarts.
On pilots (a pool with ``gang``) a fragment is one Parsl task per rank and the books follow where they landed;
with a MultiPool each site has its executor and checkpoint directory, and a job that moves takes its newest
good checkpoint along. The loop's thread owns all this state; other threads reach it through the inbox (inbox.py).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO, Any

from ..control import Controller, Timeline
from ..jobs import JobSpec
from ..nodes import local_name, site_of
from ..planner.freeze import LayerThroughput
from ..scaling import ScalingCurve
from ..train.launcher import RendezvousStore
from ..train.protocol import JobDir, Progress
from . import events
from .background import BackgroundLoop
from .checkpoint_policy import CheckpointPolicy
from .clock import Clock, SystemClock
from .errors import JobFailed, RunStopped, StateError, StateLocked
from .fragments import (
    Collected,
    FragmentRunner,
    Fragments,
    Outcome,
    Running,
    collect,
    done_event,
    failure_event,
    fragment_config,
    new_fragment_id,
    newest_step,
)
from .htex import SiteRunner, check_run_helpers, serve_site_store
from .inbox import Inbox, Submit
from .jobstore import JobRow, JobStatus, JobStore, damaged_advice
from .layers import fragment_reported, job_layers
from .pool import MultiPool, PoolEvent, SitePool
from .protocols import IdlePool, JobPlanner
from .report import RunSummary, live_progress, run_summary
from .signals import sigterm_unwinds, stop_reason
from .statedir import StateDir, lock_state_dir
from .training_job import TrainingJob, check_job_name, submit_when_ready
from .warming import WarmingNodes

__all__ = ["JobFailed", "Orchestrator", "RunStopped", "StateLocked", "TrainingJob", "check_job_name",
           "lock_state_dir"]

log = logging.getLogger(__name__)


class Orchestrator:
    """Runs training jobs on an idle pool: re-plans at every change and keeps one fragment per job running at
    its planned size (see the module's docstring). ``run()`` drives it in the calling thread; ``start()`` in the
    background, with ``submit()``, ``wait()`` and ``stop()`` from the workflow's thread."""

    def __init__(self, state_dir: str | Path, pool: IdlePool | MultiPool, planner: JobPlanner, *,
                 executor: str = "bft_local", checkpoint_dir: str | Path | None = None, ranks_per_node: int = 1,
                 max_concurrent: int = 10, poll_s: float = 0.2, max_failures: int = 3, settle_s: float = 1.5,
                 warm_up: bool = True, weights: dict[str, float] | None = None,
                 checkpoint_policy: CheckpointPolicy | None = None, state_lock: IO[str] | None = None,
                 clock: Clock | None = None,
                 runners: Callable[[dict[str, SitePool]], dict[str, FragmentRunner]] | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._make_runners = runners or self._site_runners      # tests: fragments without Parsl
        self.state = StateDir(state_dir)
        self.dir = self.state.root
        self._lock: IO[str] | None = state_lock or self.state.lock()     # state_lock: taken already (training_session)
        self.db = JobStore(self.state.database)
        self.pool, self.planner = pool, planner
        # one site, or several (a MultiPool: node ids 'site:node', one executor per site)
        self.sites = pool.sites if isinstance(pool, MultiPool) else {
            "": SitePool(pool, executor, Path(checkpoint_dir) if checkpoint_dir else None, ranks_per_node)}
        bad = [n for n, s in self.sites.items() if s.ranks_per_node < 1]
        if bad:
            raise ValueError(f"ranks_per_node must be >= 1 (site {bad[0] or 'default'})")
        self.max_concurrent, self.poll_s, self.max_failures = max_concurrent, poll_s, max_failures
        self.settle_s = settle_s       # a rescale costs a fragment restart: wait this long for more joins
        self.warm_up = warm_up         # start every local worker's rank forkserver before the pool starts
        self.weights = dict(weights or {})   # the site admin's per-job weights (weighted objective), by name
        stored = self.db.meta("checkpoint-policy")
        self.policy = checkpoint_policy or (CheckpointPolicy(**stored) if stored else CheckpointPolicy())
        self.failures: dict[str, int] = {}     # consecutive failures that were not reclaims
        self.jobs: dict[str, TrainingJob] = {}
        self.curves: dict[str, ScalingCurve] = {}
        self.layers: dict[str, LayerThroughput] = {}       # freezable jobs' (execution/layers.py)
        self.futures: dict[str, Future[str | None]] = {}
        self._inbox = Inbox(self.dir)                  # how other threads reach this state (inbox.py)
        self.fragments = Fragments(self.db, self.job_dir, self.clock.time)
        self.running: dict[str, Running] = self.fragments.running
        self.generation = self.fragments.generation
        self.timeline = Timeline()
        self.pool_node_s = 0.0
        self.warm_up_s = 0.0
        self._runners: dict[str, FragmentRunner] = {}
        self._warming = WarmingNodes(self._runners)   # joined nodes enter the plan once warm (warming.py)
        self._store: RendezvousStore | None = None
        self._bg = BackgroundLoop(self._inbox, self.dir)   # the loop, when it runs in the background (start())
        self._stopping = self._inbox.stopping
        self._arrivals: list[str] = []                 # jobs added since the loop's last turn
        self._noticed: set[str] = set()                # nodes on notice whose pilots we have not let go yet
        self.job_site: dict[str, str] = {}     # where each job's checkpoints are (the site it last ran at)
        with self._inbox.direct():
            for name, row in self.db.jobs().items():        # a restart: everything the last orchestrator had
                try:
                    job = TrainingJob(**row.spec)
                    if job.name != name:
                        raise ValueError(f"row {name!r} holds the spec of {job.name!r}")
                except (TypeError, ValueError) as e:
                    raise StateError(damaged_advice(self.db.path, e)) from None
                self._add(job, row)

    def close(self) -> None:
        """Give the state directory up (its lock, the database); the process ending does the same."""
        self.db.close()
        if self._store is not None:     # the rendezvous store's process
            self._store.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # --- the scientist's API -------------------------------------------------------------------------
    def submit(self, job: TrainingJob) -> Future[str | None]:
        """Declare a job; the future resolves to the path of its final checkpoint. ``workload_args`` values may
        be futures (a Parsl app preparing the data, another job's checkpoint): the job is declared when they
        have resolved. Any thread may call it: while a loop runs, the job joins at its next turn (inbox.py)."""
        inputs = {k: v for k, v in job.workload_args.items() if isinstance(v, Future)}
        if inputs:
            return self._submit_after(job, inputs)
        known = self._inbox.known(job)
        if known is not None:
            return known
        job.check_submit(max(s.ranks_per_node for s in self.sites.values()))
        return self._inbox.submit(job, self._apply)

    def _apply(self, msg: Submit) -> None:
        """The owner adds a submitted job; the running loop (if any) plans it at its next turn."""
        self._add(msg.job, None, msg.future)
        self._arrivals.append(msg.job.name)

    def _submit_after(self, job: TrainingJob, inputs: dict[str, Future[Any]]) -> Future[str | None]:
        return submit_when_ready(job, inputs, self.submit,
                                 lambda: RunStopped(f"job {job.name!r}: the run stopped before its inputs were ready")
                                 if self._stopping.is_set() else None)

    def start(self, *, progress: Callable[[Orchestrator], object] | None = None) -> Orchestrator:
        """Run the loop in the background: futures resolve on their own, Parsl apps can wait on them, and jobs
        submitted later join the running plan. ``wait()`` for the jobs, ``stop()`` to checkpoint and leave."""
        self._bg.start(lambda: self.run(progress=progress, _background=True), self.clock.monotonic())
        return self

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until every submitted job is done (True) or ``timeout_s`` passed (False)."""
        return self._bg.wait(timeout_s)

    def stop(self, why: str | None = None) -> RunSummary | None:
        """Leave the background loop: running fragments checkpoint, pilots are given back; futures of jobs not
        done get ``RunStopped`` (nothing waits forever on them). ``why``: the event log's reason (default
        "stopped"; a session passes "interrupted", "SIGTERM" or the error it unwinds with). Returns the summary."""
        return self._bg.stop(why)

    def _add(self, job: TrainingJob, row: JobRow | None, fut: Future[str | None] | None = None) -> None:
        """Track a job: a new one (``row`` None: persist it; ``fut``: the future submit returned) or one found in
        the state database."""
        self._inbox.check_owner("Orchestrator._add")
        self.jobs[job.name] = job
        self.job_site[job.name] = self.db.site(job.name) or next(iter(self.sites))
        self.curves[job.name] = self.db.curve(job.name, job.rate_guess)
        if job.freeze != "off":
            self.layers[job.name] = job_layers(job.name, job.workload, job.global_batch, job.workload_args,
                                               self.curves[job.name])
        if fut is None:
            fut = Future()
            self._inbox.register(job, fut)
        self.futures[job.name] = fut
        if row is None:
            self.db.add(job.name, asdict(job))
        if row and row.status is JobStatus.DONE:
            fut.set_result(self.state.abs(row.checkpoint))

    def pending_specs(self) -> list[JobSpec]:
        """What the planner sees of the jobs not done yet (with the site's weights)."""
        return [self._spec(n) for n, f in self.futures.items() if not f.done()]

    def _spec(self, name: str) -> JobSpec:
        return replace(self.jobs[name].spec(), weight=self.weights.get(name, self.jobs[name].weight))

    def job_dir(self, name: str, site: str | None = None) -> Path:
        """A job's checkpoints and protocol files at a site (by default: the site it last ran at): under the
        site's checkpoint_dir when it names one, else under the state directory. Any thread may ask (one key's
        read); a job submitted but not added by the loop yet is at the first site."""
        site = self.job_site.get(name, next(iter(self.sites))) if site is None else site
        return self.state.jobs_root(site, self.sites[site].checkpoint_dir) / name

    # --- the loop ------------------------------------------------------------------------------------
    def run(self, *, progress: Callable[[Orchestrator], object] | None = None, timeout_s: float | None = None,
            _background: bool = False) -> RunSummary:
        """Drive every job to completion (or until ``timeout_s``); returns the run's summary. However it is
        left - done, timeout, an exception, Ctrl-C or SIGTERM - running fragments are asked to checkpoint and
        collected, and every pilot is given back. After ``start()``: wait for the jobs (then, on timeout,
        stop) instead."""
        if self._bg.thread is not None and not _background:
            if not self.wait(timeout_s):
                return self.stop() or self.summary(self.clock.monotonic() - self._bg.started_at)
            return self.summary(self.clock.monotonic() - self._bg.started_at)
        with self._inbox.own(self._apply):       # this thread owns the state until the loop has ended
            return self._run(progress, timeout_s, _background)

    def _run(self, progress: Callable[[Orchestrator], object] | None, timeout_s: float | None,
             stay: bool) -> RunSummary:
        self._runners = self._make_runners(self.sites)
        self._warming = WarmingNodes(self._runners)
        self._arrivals.clear()
        pending = self.pending_specs()
        ctl = Controller(pending, self.curves, self.planner, max_concurrent=self.max_concurrent, model_costs=False,
                         layers=self.layers, held_before={n: r.node_s for n, r in self.db.jobs().items()})
        for spec in pending:
            self.fragments.fence(spec.name)
        self.db.record(events.Start(self.generation, [s.name for s in pending],
                                {s.name: newest_step(self.job_dir(s.name)) for s in pending}))
        t_start = self.clock.monotonic()
        why: str = events.RunEnd.DONE
        with sigterm_unwinds():
            try:
                if self.warm_up:
                    for name, runner in self._runners.items():
                        runner.warm_up(self.state.warm_up_dir(self.generation, name), self.db.record,
                                       self._stopping.is_set)
                self.warm_up_s = self.clock.monotonic() - t_start
                self.pool.start()
                t_start = self.clock.monotonic()
                why = self._loop(ctl, t_start, progress, timeout_s, stay)
            except BaseException as e:
                why = stop_reason(e)
                raise
            finally:
                self._shutdown(ctl, why)
        return self.summary(self.clock.monotonic() - t_start)

    def _site_runners(self, sites: dict[str, SitePool]) -> dict[str, FragmentRunner]:
        """The default runners: each site's Parsl apps, meeting at one rendezvous store served here (loopback
        only unless ranks on other nodes, on pilots, must reach it)."""
        store = self._store = serve_site_store(sites)      # its own process; ends with the run (close())
        return {name: SiteRunner(name, s, store) for name, s in sites.items()}

    def _loop(self, ctl: Controller, t_start: float, progress: Callable[[Orchestrator], object] | None,
              timeout_s: float | None, stay: bool) -> str:
        """Returns why it ended: every job done, timeout, or stopped (``stay``: keep going when all are done,
        for jobs still to come, until ``stop()``). One turn: arrivals, time, pool events, fragments, the plan."""
        last = self.clock.monotonic()
        changed, joined_at = True, None
        while ctl.active or ctl.waiting or (stay and not self._stopping.is_set()):
            if self._stopping.is_set():
                return self._inbox.stop_reason
            check_run_helpers(self._store, self.sites)
            changed |= self._take_arrivals(ctl)
            used = {n for a in ctl.active.values() for n in a.state.nodes}
            for name, site in self.sites.items():  # no pilots for nodes no job could use; long unused ones go back
                site.pool.demand, site.pool.in_use = ctl.demand, {local_name(n) for n in used if site_of(n) == name}
                site.pool.stop_s = self.policy.stop_s      # a walltime's notice: no earlier than a stop needs
            now = self.clock.monotonic()
            dt, last = now - last, now
            self.pool_node_s += len(ctl.pool) * dt
            ctl.accrue(dt)
            for ev in self.pool.poll():
                if ev.kind == "join":
                    self._nodes_joined(ev, t_start, now)
                else:
                    self._nodes_reclaimed(ctl, ev)
                    changed = True
            if warm := self._warming.warmed(now):   # nodes arrive one by one: plan once they have settled ...
                ctl.nodes_joined([n for n, _ in warm], [u for _, u in warm])
                # ... or at once when they had to warm up and no other is warming: none is about to come
                joined_at = now - self.settle_s if self._warming.drained else now
            changed |= self._follow_placement(ctl)
            changed |= self._collect(ctl)
            self._release_checkpointed()
            if changed or (joined_at is not None and now - joined_at >= self.settle_s):
                joined_at = None
                ctl.replan(now)
                self._reconcile(ctl)
                self.timeline.record(now - t_start, ctl, lambda a: a.name)
                changed = False
            if progress is not None:
                progress(self)
            if timeout_s is not None and now - t_start > timeout_s:
                return events.RunEnd.TIMEOUT
            self.clock.sleep(self.poll_s)
        return self._inbox.stop_reason if self._stopping.is_set() else events.RunEnd.DONE

    def _follow_placement(self, ctl: Controller) -> bool:
        """The books follow where fragments' ranks landed. A rank on a joined node still warming up (its idle
        worker took a task meant for another node) makes that node ready now: its warm-up waits behind the rank
        on the node's one worker. True if so (the node the rank was meant for is free: plan again)."""
        landed = self._warming.take(self.fragments.follow_placement(ctl, self._runners))
        if landed:
            ctl.nodes_joined([n for n, _ in landed], [u for _, u in landed])
            self.fragments.follow_placement(ctl, self._runners)
        return bool(landed)

    def _take_arrivals(self, ctl: Controller) -> bool:
        """Jobs submitted while the loop runs join the plan; True if any did."""
        self._inbox.check_owner("Orchestrator._take_arrivals")
        for msg in self._inbox.take():
            self._apply(msg)
        changed = False
        while self._arrivals:
            name = self._arrivals.pop(0)
            if not self.futures[name].done() and ctl.submit(self._spec(name)):
                self.fragments.fence(name)
                self.db.record(events.Submit(name))
                changed = True
        return changed

    def _nodes_joined(self, ev: PoolEvent, t_start: float, now: float) -> None:
        self._inbox.check_owner("Orchestrator._nodes_joined")
        for r in self.running.values():
            r.gone.difference_update(ev.nodes)     # a new pilot there: a share may start on it
        self._warming.add(ev.nodes, [t_start + u for u in ev.until] if ev.until else (), now)

    def _nodes_reclaimed(self, ctl: Controller, ev: PoolEvent) -> None:
        """A notice: checkpoint now, and plan without these nodes already; a leave: kill what still runs."""
        self._inbox.check_owner("Orchestrator._nodes_reclaimed")
        self._warming.drop(ev.nodes)
        for a in list(ctl.active.values()):
            r = self.running.get(a.name)
            if r is not None and set(ev.nodes) & set(a.state.nodes):
                r.doomed.update(set(ev.nodes) & set(a.state.nodes))
                self.fragments.request_stop(a.name, f"reclaim {ev.kind}")
                self.fragments.abandon_waiting(a.name, all_or_none=ev.kind == "notice")
        if ev.kind == "leave":
            for name, r in self.running.items():
                r.gone.update(ev.nodes)
                if r.doomed & set(ev.nodes):
                    self.fragments.kill(name)
            self._noticed.difference_update(ev.nodes)
        else:
            self._noticed.update(ev.nodes)
        for name in ctl.nodes_left(ev.nodes):
            self.db.record(events.Reclaim(name, list(ev.nodes), ev.kind, ev.why or None))

    def _release_checkpointed(self) -> None:
        """Nodes on notice whose fragments have checkpointed: their pilots go now, so replacements can start."""
        done_with = self._noticed - set().union(*(r.doomed for r in self.running.values()))
        if done_with:
            self._noticed -= done_with
            self.pool.release(done_with)

    def _shutdown(self, ctl: Controller, why: str) -> None:
        self._inbox.check_owner("Orchestrator._shutdown")
        for name in list(self.running):
            self.fragments.request_stop(name, "shutdown")
            self.fragments.abandon_waiting(name, all_or_none=True)      # nothing to save: no waiting for a worker
        deadline, labels = self.clock.monotonic() + 60, {n: s.executor for n, s in self.sites.items()}
        try:        # fragments whose interchange is gone send no result: not waited for (the next run resumes them)
            while self.running and self.clock.monotonic() < deadline and not self.fragments.unreachable(labels):
                self._collect(ctl)
                self.clock.sleep(self.poll_s)
        finally:
            for name in list(self.running):        # did not stop in time: nothing may outlive us here
                self.fragments.kill(name)
            self.pool.stop()
            self.db.none_running()
            self.db.set_meta("checkpoint-policy", self.policy.state())
            self.db.record(events.Stop(self.generation, why, sorted(self.running)))

    # --- fragments -----------------------------------------------------------------------------------
    def _launch(self, ctl: Controller, name: str, nodes: tuple[str, ...], site: str) -> None:
        self._inbox.check_owner("Orchestrator._launch")
        if site != self.job_site[name]:      # the job moves: its newest good checkpoint goes with it
            from ..train.checkpoint import CheckpointStore  # torch: imported once a fragment ends or moves
            staged = CheckpointStore(self.job_dir(name)).stage_to(self.job_dir(name, site))
            self.db.record(events.Stage(name, site, str(staged) if staged else None))
            self.job_site[name] = site
            self.db.update(name, site=site)
            self.fragments.fence(name)
        jd = JobDir(self.job_dir(name))
        jd.clear_stop()
        self.db.update(name, dir=str(jd.path))      # where `parsl-bft status` finds its live progress
        fragment = new_fragment_id(name)
        jd.run_fragment(fragment)          # from now on only this fragment may save the job
        k = self.sites[site].ranks_per_node
        hole_left = min((ctl.pool.get(n, math.inf) for n in nodes), default=math.inf) - self.clock.monotonic()
        interval = self.policy.interval(len(nodes), hole_left)
        freeze = ctl.active[name].state.freeze if name in ctl.active else 0      # the planned level
        cfg = fragment_config(self.jobs[name], jd, fragment=fragment, world_size=len(nodes) * k, ranks_per_node=k,
                              generation=self.generation, interval_s=interval, freeze_layers=freeze)
        resume = newest_step(jd.path)
        handle = self._runners[site].launch(cfg, tuple(map(local_name, nodes)))
        self.running[name] = Running(handle, len(nodes), fragment, site, self.clock.time(), resume, interval,
                                     freeze=freeze)
        self.db.record(events.Launch(name, len(nodes), len(nodes) * k, fragment, list(nodes), resume,
                                     round(interval, 2), site or None, freeze or None))

    def _collect(self, ctl: Controller) -> bool:
        """Collect every fragment that has ended (or lost all its nodes), account for it and settle its job;
        True if any ended."""
        self._inbox.check_owner("Orchestrator._collect")
        changed = False
        for name, r in list(self.running.items()):
            lost = not r.handle.done() and r.lost(self._runners[r.site].gang)
            if not (r.handle.done() or lost):
                continue
            del self.running[name]
            changed = True
            jd = JobDir(self.job_dir(name))
            try:
                c = collect(r, jd, lost=lost, job_samples=self.jobs[name].samples, now=self.clock.time())
                go_on = self._account(ctl, name, r, c, jd)
            finally:
                jd.kill_ranks(r.fragment)                # stragglers of a failed share, on this host
                jd.forget_fragment(r.fragment)
            if go_on:
                self._settle(ctl, name, jd, c)
        return changed

    def _account(self, ctl: Controller, name: str, r: Running, c: Collected, jd: JobDir) -> bool:
        """Record an ended fragment (event log, checkpoint policy, measured curve, crash-loop count); False if
        its job gives up here (a crash loop)."""
        self._inbox.check_owner("Orchestrator._account")
        row = self.db.job(name)
        held_s = max(self.clock.time() - r.launched, 0.0) * r.nodes
        if c.result is not None:
            self._record_result(ctl, name, r, c)
            res = c.result
            self.policy.observe_stop(r.stop_at, c.ended, res.train_s / max(res.end_step - res.start_step, 1))
            self.policy.observe_training(held_s, lost_without_notice=False)
            self.db.update(name, fragments=row.fragments + 1,
                           train_node_s=row.train_node_s + c.result.train_s * r.nodes)
            self.failures[name] = 0
            return True
        self.db.record(failure_event(name, r, c, jd))
        self.policy.observe_training(held_s, lost_without_notice=not r.stop_requested)
        self.db.update(name, fragments=row.fragments + 1)
        if c.outcome in (Outcome.FAILED, Outcome.REFUSED):  # in a row without progress: one that saved starts anew
            progressed = c.stands is not None and c.stands.step > r.resume_step      # (a rank killed from outside)
            self.failures[name] = 1 if progressed else self.failures.get(name, 0) + 1
            if self.failures[name] >= self.max_failures or c.permanent or c.outcome is Outcome.REFUSED:
                self._give_up(ctl, name, c.error, refused=c.outcome is Outcome.REFUSED)   # (no retry would do)
                return False
        return True

    def _record_result(self, ctl: Controller, name: str, r: Running, c: Collected) -> None:
        k, res = self.sites[r.site].ranks_per_node, c.result
        assert res is not None
        self.db.record(done_event(name, r, c))
        self.policy.observe_save(res.periodic_save_s or res.checkpoint_s)
        if res.throughput > 0 and res.end_step > res.start_step:      # the planner counts nodes
            ctl.measured(name, self.db.measured(name, res.world_size // k, res.throughput))
        if name in ctl.active:
            fragment_reported(ctl.active[name].state, res)

    def _settle(self, ctl: Controller, name: str, jd: JobDir, c: Collected) -> None:
        """Where the job stands after its fragment: progress, newest checkpoint, and done when it is."""
        self._inbox.check_owner("Orchestrator._settle")
        ckpt = c.checkpoint
        if not ckpt:
            from ..train.checkpoint import CheckpointStore  # torch: a re-run with nothing to train needs none
            store = CheckpointStore(jd.path)
            ckpt = str(store.latest_path) if store.latest(arrays=False) is not None else None
        ckpt = self.state.abs(self.state.rel(ckpt))
        a = ctl.active.get(name)
        self.db.update(name, samples_done=c.samples_done, checkpoint=self.state.rel(ckpt),
                       **({"node_s": a.node_seconds} if a is not None else {}))
        ctl.progressed(name, c.samples_done)
        if c.samples_done >= self.jobs[name].samples or c.outcome is Outcome.FINISHED:
            if a is not None:
                ctl.job_finished(name, self.clock.monotonic())
            self.db.update(name, status=JobStatus.DONE, size=0)
            self.db.record(events.Done(name, ckpt))
            if not self.futures[name].done():
                self.futures[name].set_result(ckpt)

    def _give_up(self, ctl: Controller, name: str, err: str, refused: bool = False) -> None:
        """A job whose fragments fail on their own (not by reclaims) max_failures times in a row, none saving a
        newer checkpoint than it started from (a crash loop), or whose checkpoint a newer parsl-bft wrote
        (``refused``), stops; its checkpoints stay, the error reaches the scientist through the future."""
        self._inbox.check_owner("Orchestrator._give_up")
        if name in ctl.active:
            ctl.job_finished(name, self.clock.monotonic())
        self.db.update(name, status=JobStatus.FAILED, size=0)
        self.db.record(events.Failed(name, err[-20_000:]))
        n = self.failures.get(name, 0)          # fewer than max_failures when its code cannot load
        if not self.futures[name].done():
            why = "its checkpoint cannot be read here" if refused else \
                f"{n} fragment{'s' * (n != 1)} failed in a row without progress; last"
            self.futures[name].set_exception(JobFailed(f"job {name}: {why}: {err} (checkpoints kept in "
                                                       f"{self.job_dir(name)})"))

    def _reconcile(self, ctl: Controller) -> None:
        """Make the fragments match the plan: stop those whose size changed, start those that should run."""
        self._inbox.check_owner("Orchestrator._reconcile")
        rows = self.db.jobs()
        for a in ctl.active.values():
            want = a.state.size
            r = self.running.get(a.name)
            if r is not None and (r.nodes != want or (want and r.freeze != a.state.freeze)) and not r.stop_requested:
                self.fragments.request_stop(a.name, f"rescale {r.nodes} -> {want}" if r.nodes != want else
                                   f"freeze {r.freeze} -> {a.state.freeze} layers")
                self.db.update(a.name, rescales=rows[a.name].rescales + 1)
            elif r is None and want > 0:
                self._launch(ctl, a.name, a.state.nodes, site_of(a.state.nodes[0]))
            self.db.holds(a.name, want, a.node_seconds)

    # --- reporting -----------------------------------------------------------------------------------
    def live_progress(self) -> dict[str, float]:
        """Samples done per job, including what running fragments have reported since they started."""
        return live_progress(self.db, {n: (j.samples, self.job_dir(n)) for n, j in self._inbox.jobs().items()})

    def last_report(self, name: str) -> Progress | None:
        """The newest progress report of the job's fragments (step, samples, loss, ranks), or None."""
        return JobDir(self.job_dir(name)).progress()

    def summary(self, wall_s: float) -> RunSummary:
        """The run's table (``report.run_summary``)."""
        return run_summary(self.db, self.dir, wall_s=wall_s, warm_up_s=self.warm_up_s, pool_node_s=self.pool_node_s)
