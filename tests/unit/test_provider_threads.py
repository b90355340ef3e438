"""A pilot provider is called from two threads: the pool's (the orchestrator's loop: submissions in
``pilots(shape)``, cancels) and Parsl's JobStatusPoller (``status``). Each pilot gets the shape of its own
submission, and the book-keeping stays whole, however the calls interleave (pilot.py's lock)."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

from parsl_bft.execution.pbs import PBSCommands, PBSPilotProvider
from parsl_bft.execution.pilot import PilotShape

from harness import RanOutOfTime

DATA = Path(__file__).resolve().parents[1] / "data" / "pbs"
SUBMITTERS, PILOTS_EACH, POLLERS = 4, 15, 2
BUDGET_S = 120.0


def test_pilots_submitted_while_parsl_polls_each_get_their_own_shape(tmp_path):
    ids = itertools.count(2000)
    scripts: dict[str, str] = {}
    nodes, qstat = (DATA / "pbsnodes.json").read_text(), (DATA / "qstat.json").read_text()

    def run(argv: list[str]) -> tuple[int, str, str]:
        time.sleep(0.001)                       # a scheduler command takes time: the other thread runs meanwhile
        if argv[0] == "qsub":
            jid = f"{next(ids)}.polaris-pbs-01"
            scripts[jid] = Path(argv[1]).read_text()
            return 0, jid + "\n", ""
        return 0, {"pbsnodes": nodes, "qstat": qstat}.get(argv[0], ""), ""
    prov = PBSPilotProvider("preemptable", select="1:ncpus=64", commands=PBSCommands(run), script_dir=str(tmp_path),
                            poll_s=1)
    prov.clock = lambda: 1795291000.0 + time.monotonic()   # surveys age: some polls survey again
    mine: dict[str, str] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def submitter(i: int) -> None:
        for _ in range(PILOTS_EACH):
            with prov.pilots(PilotShape(target=(f"node{i}",))):
                mine[prov.submit("worker", 1, f"parsl.pilots.block-{i}")] = f"node{i}"

    def poller() -> None:
        while not done.is_set():
            known = list(mine)
            prov.status(known)
            prov.cancel(known[:1])

    def guarded(f, *a):
        def body() -> None:
            try:
                f(*a)
            except BaseException as e:
                errors.append(e)
        return threading.Thread(target=body, daemon=True)
    pollers = [guarded(poller) for _ in range(POLLERS)]
    submitters = [guarded(submitter, i) for i in range(SUBMITTERS)]
    for t in pollers + submitters:
        t.start()
    for t in submitters:
        t.join(BUDGET_S)
        if t.is_alive():
            raise RanOutOfTime("ran out of time at step: submitting pilots while Parsl polls")
    done.set()
    for t in pollers:
        t.join(BUDGET_S)
    assert not errors, errors
    assert len(mine) == SUBMITTERS * PILOTS_EACH
    assert prov.targets == {j: (node,) for j, node in mine.items()}          # each pilot its own shape ...
    assert all(f":host={node}" in scripts[j] for j, node in mine.items())   # ... in its own script
    assert prov.sizes == dict.fromkeys(mine, 1) and set(prov.submitted) == set(mine)
    assert not prov._next                                                   # nothing left for a later submit
