"""Private names of other projects that the runtime relies on still exist.

Each is a name an upstream release may rename without notice; the runtime reads it directly (no
``getattr(..., None)``), so a rename would fail there at run time - or, where a fallback hid it, silently drop a
guarantee (a rank no longer dies with its worker). These checks fail first, naming the upstream name and the
module of parsl_bft that needs it. Found by grepping parsl_bft/ for ``._`` on parsl, torch, multiprocessing,
globus_compute_sdk and h5py objects (h5py: none).
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Contract:
    name: str                          # the upstream name, spelled as its module path
    used_by: str                       # where parsl_bft relies on it, and for what
    holds: Callable[[], bool]          # True while the name exists (imports inside: a missing module is a miss)


def _attr(module: str, *path: str) -> Callable[[], bool]:
    def holds() -> bool:
        obj: object = importlib.import_module(module)
        for p in path:
            if not hasattr(obj, p):
                return False
            obj = getattr(obj, p)
        return True
    return holds


def _htex_instance_attrs() -> bool:
    from parsl.executors import HighThroughputExecutor
    ex = HighThroughputExecutor(label="contract")        # set in BlockProviderExecutor.__init__; nothing starts
    return hasattr(ex, "_executor_bad_state") and hasattr(ex, "_executor_exception")


def _forkserver_alive_fd() -> bool:
    from multiprocessing import forkserver
    return hasattr(forkserver, "_forkserver") and hasattr(forkserver.ForkServer(), "_forkserver_alive_fd")


def _spawn_reads_inheriting() -> bool:
    from multiprocessing import spawn
    return "_inheriting" in inspect.getsource(spawn)


CONTRACTS = [
    Contract("parsl.executors.HighThroughputExecutor._hold_block",
             "parsl_bft/execution/pilot_pool.py (hold_block: no new tasks for a leaving pilot's worker pools)",
             _attr("parsl.executors", "HighThroughputExecutor", "_hold_block")),
    Contract("parsl.executors.HighThroughputExecutor()._executor_bad_state, ._executor_exception",
             "parsl_bft/execution/htex.py (release_dead_interchanges: mark an executor with a dead interchange bad)",
             _htex_instance_attrs),
    Contract("multiprocessing.forkserver._forkserver._forkserver_alive_fd",
             "parsl_bft/train/launcher.py (_die_with_forkserver: a rank dies with its worker)",
             _forkserver_alive_fd),
    Contract("multiprocessing.process.BaseProcess._inheriting (read by multiprocessing.spawn)",
             "parsl_bft/train/rank_preload.py (_prepare_main: preload the main module as a child does)",
             _spawn_reads_inheriting),
    *(Contract(f"torch._C._distributed_c10d.{n}",
               "parsl_bft/train/launcher.py, rank.py, workload_loop.py (typed rendezvous stores, DDP hook)",
               _attr("torch._C._distributed_c10d", n)) for n in ("Store", "TCPStore", "PrefixStore", "GradBucket")),
    *(Contract(f"torch.{n}", "parsl_bft/train/freezing.py (gradient norms and sums in one kernel per list)",
               _attr("torch", n)) for n in ("_foreach_norm", "_foreach_add_")),
    Contract("globus_compute_sdk.Executor._get_result_watcher",
             "parsl_bft/execution/globus.py (LocalEndpointExecutor: no result watcher for a local endpoint)",
             _attr("globus_compute_sdk", "Executor", "_get_result_watcher")),
]


def missing(contracts: list[Contract] = CONTRACTS) -> list[str]:
    """One line per private upstream name that is gone: the name and who needs it."""
    out = []
    for c in contracts:
        try:
            ok = c.holds()
        except ImportError as e:
            ok, why = False, f" ({e})"
        else:
            why = ""
        if not ok:
            out.append(f"upstream private name {c.name} is gone{why}: {c.used_by} relies on it")
    return out


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name.split(" ")[0])
def test_private_upstream_name_still_exists(contract):
    gone = missing([contract])
    if gone:
        pytest.fail(gone[0], pytrace=False)


def test_a_missing_name_is_reported_by_name_and_user(monkeypatch):
    from parsl.executors import HighThroughputExecutor
    monkeypatch.delattr(HighThroughputExecutor, "_hold_block")
    assert missing() == ["upstream private name parsl.executors.HighThroughputExecutor._hold_block is gone: "
                         "parsl_bft/execution/pilot_pool.py (hold_block: no new tasks for a leaving pilot's worker "
                         "pools) relies on it"]


def test_a_missing_module_is_reported_by_name(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", None)     # import of it raises ImportError
    gone = missing()
    assert len(gone) == 4 and all("torch._C._distributed_c10d." in g and "relies on it" in g for g in gone), gone


def test_the_contract_test_fails_loudly_when_a_name_is_gone(monkeypatch):
    from parsl.executors import HighThroughputExecutor
    monkeypatch.delattr(HighThroughputExecutor, "_hold_block")
    with pytest.raises(pytest.fail.Exception, match=r"HighThroughputExecutor\._hold_block is gone: "
                       r"parsl_bft/execution/pilot_pool\.py"):
        test_private_upstream_name_still_exists(CONTRACTS[0])
