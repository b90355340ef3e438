"""Joined nodes enter the plan once their worker is warm (execution/warming.py): on fakes for the runner's
warm-up tasks, and the orchestrator on simulated time, where a job keeps training on its nodes while a new
pilot's worker imports torch."""
from __future__ import annotations

from concurrent.futures import Future

from simulated import RATE, ScriptedPool, SimulatedFragments, _orchestrator

from parsl_bft.execution.clock import SimulatedClock
from parsl_bft.execution.orchestrator import TrainingJob
from parsl_bft.execution.warming import WarmingNodes


class Primed:
    """A runner whose warm-ups are futures the test answers (with the node a warm-up ran on)."""

    def __init__(self, gang: bool = True):
        self.gang = gang
        self.sent: list[tuple[str, Future]] = []

    def prime(self, nodes):
        if not self.gang:
            return []
        futs = [Future() for _ in nodes]
        self.sent += list(zip(nodes, futs))
        return futs

    def answer(self, i: int, node: str | None = None, error: bool = False) -> None:
        node_asked, fut = self.sent[i]
        fut.set_exception(RuntimeError("worker lost")) if error else fut.set_result(node or node_asked)


def test_nodes_of_workers_that_need_no_warm_up_are_ready_at_once():
    w = WarmingNodes({"": Primed(gang=False)})
    w.add(["a", "b"], [50.0, 60.0], now=0.0)
    assert w.warmed(0.0) == [("a", 50.0), ("b", 60.0)]
    assert w.warmed(1.0) == []


def test_a_node_is_ready_when_its_worker_answers_and_not_before():
    r = Primed()
    w = WarmingNodes({"": r}, wait_s=30)
    w.add(["a", "b"], [], now=0.0)
    assert w.warmed(5.0) == [] and "a" in w
    r.answer(1)
    assert w.warmed(6.0) == [("b", float("inf"))]
    assert not w.drained, "b was ready while a still warmed up: more was about to come"
    r.answer(0)
    assert w.warmed(7.0) == [("a", float("inf"))] and "a" not in w
    assert w.drained, "the last warming node was ready: nothing else was about to come"


def test_nodes_that_needed_no_warm_up_do_not_end_the_wait_for_more_joins():
    w = WarmingNodes({"": Primed(gang=False)})
    w.add(["a"], [], now=0.0)
    assert w.warmed(0.0) and not w.drained


def test_a_warm_up_that_ran_on_another_worker_is_sent_again_for_the_cold_node():
    r = Primed()
    w = WarmingNodes({"": r}, wait_s=30)
    w.add(["c"], [], now=0.0)
    r.answer(0, node="old")            # the lane's idle, warm worker took it
    assert w.warmed(1.0) == [] and [n for n, _ in r.sent] == ["c", "c"]
    r.answer(1)
    assert w.warmed(2.0) == [("c", float("inf"))]


def test_a_node_whose_worker_never_answers_is_planned_after_the_wait_and_a_failure_is_not_resent():
    r = Primed()
    w = WarmingNodes({"": r}, wait_s=30)
    w.add(["a"], [90.0], now=10.0)
    r.answer(0, error=True)
    assert w.warmed(39.0) == [] and len(r.sent) == 1
    assert w.warmed(40.0) == [("a", 90.0)]


def test_a_node_that_leaves_before_it_is_warm_never_joins():
    r, local = Primed(), Primed(gang=False)
    w = WarmingNodes({"s": r, "t": local}, wait_s=30)
    w.add(["s:a", "s:b", "t:x"], [1.0, 2.0, 3.0], now=0.0)
    w.drop(["s:a", "t:x"])
    r.answer(0)
    r.answer(1)
    assert w.warmed(100.0) == [("s:b", 2.0)]


class WarmingFragments(SimulatedFragments):
    """Simulated fragments on pilots whose workers are warm ``warm_s`` after they join; launches are recorded
    with their simulated time."""

    def __init__(self, clock: SimulatedClock, warm_s: float, **kw):
        super().__init__(clock, **kw)
        self.warm_s, self.warming, self.at = warm_s, [], []
        clock.on_sleep.append(lambda _: self._answer())

    def prime(self, nodes):
        futs = []
        for n in nodes:
            f: Future = Future()
            self.warming.append((self.clock.monotonic() + self.warm_s, n, f))
            futs.append(f)
        return futs

    def _answer(self):
        for item in [w for w in self.warming if w[0] <= self.clock.monotonic()]:
            self.warming.remove(item)
            item[2].set_result(item[1])

    def launch(self, cfg, nodes):
        self.at.append((self.clock.monotonic(), len(nodes)))
        return super().launch(cfg, nodes)


def _launch_sizes(tmp_path, clock: SimulatedClock, joins, frags: WarmingFragments, samples: int,
                  max_nodes: int) -> tuple[list[tuple[int, int]], float]:
    """One job ``x`` run to the end on nodes that join as ``joins`` says: its fragments' launches as (simulated
    s from the start, nodes), and the orchestrator's settle_s."""
    orch = _orchestrator(tmp_path, clock, ScriptedPool(clock, joins), frags)
    orch.submit(TrainingJob("x", samples=samples, min_nodes=1, max_nodes=max_nodes, global_batch=12,
                            rate_guess=RATE))
    t0 = clock.monotonic()
    summary = orch.run(timeout_s=10_000)
    orch.close()
    assert summary.jobs[0].status == "done"
    return [(round(t - t0), n) for t, n in frags.at], orch.settle_s


def test_a_job_trains_on_while_a_new_pilots_worker_warms_up_and_grows_once_it_is_warm(tmp_path):
    clock = SimulatedClock()
    sizes, settle_s = _launch_sizes(tmp_path, clock, [(0, "join", ("a",)), (100, "join", ("b", "c"))],
                                    WarmingFragments(clock, warm_s=20), samples=120_000, max_nodes=3)
    assert [n for _, n in sizes][:2] == [1, 3], sizes
    first, grown = sizes[0][0], sizes[1][0]
    assert first >= 20, f"the first fragment started before its nodes were warm: {sizes}"
    assert grown >= 120, f"the job stopped for nodes b, c before their workers were warm: {sizes}"
    assert grown < 120 + settle_s, f"the job waited for more joins though no node was warming: {sizes}"


class StrayFragments(WarmingFragments):
    """A gang on pilots sharing one executor: the first fragment's rank lands on ``stray`` (a joined node whose
    worker was idle, still warming up) instead of the node it was planned on; that node's warm-up then waits
    behind the rank and never answers while it runs."""

    gang = True

    def __init__(self, clock: SimulatedClock, warm_s: float, stray: str, **kw):
        super().__init__(clock, warm_s, **kw)
        self.stray, self.landed = stray, {}

    def _answer(self):
        self.warming = [w for w in self.warming if w[1] != self.stray]
        super()._answer()

    def launch(self, cfg, nodes):
        self.landed[cfg.fragment_id] = dict(enumerate(nodes)) if self.landed else {0: self.stray}
        return super().launch(cfg, nodes)

    def placed(self, fragment, nodes):
        return self.landed.get(fragment, {})


def test_a_rank_that_lands_on_a_node_still_warming_makes_it_ready_and_frees_the_node_it_was_meant_for(tmp_path):
    """Node b joins while a's fragment is about to launch; the fragment's one rank lands on b, whose warm-up
    then cannot run. The books follow at once (b is the job's), and a, free, is planned again: the job grows
    to both nodes long before b's warm-up would have timed out (30 s after it joined)."""
    clock = SimulatedClock()
    sizes, _ = _launch_sizes(tmp_path, clock, [(0, "join", ("a",)), (10, "join", ("b",))],
                             StrayFragments(clock, warm_s=20, stray="b"), samples=60_000, max_nodes=2)
    assert [n for _, n in sizes][:2] == [1, 2], sizes
    assert sizes[1][0] < 10 + 30, f"node a stayed idle until b's warm-up timed out: {sizes}"
