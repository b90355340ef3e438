"""One training fragment: restore -> rendezvous on n ranks -> train (saving periodically) -> checkpoint -> report.

Ranks are started by ``launcher.run_fragment`` (local processes from a preloaded forkserver, as a Parsl app
does) or by a site's own launcher (``srun python -m parsl_bft.train.fragment --config cfg.json``); each rank
reads its rank and world size from the launcher's environment and meets its peers through a torch TCPStore
(``PARSL_BFT_STORE``) or, under srun/mpiexec, through MASTER_ADDR/MASTER_PORT (``rank``).

A rank runs one training function through the one loop driver (``context.run_loop``): the user's own
(``FragmentConfig.loop``) or the built-in workload loop (``workload_loop.train``), both against a TrainContext.

Stopping: after ``steps`` steps, at ``deadline_s`` seconds, when the job's ``total_samples`` are done, or on
SIGTERM / SIGUSR1 / the job's STOP file (the reclaim notice; any rank seeing it stops all ranks at the same
step: the flags ride on the per-step loss all-reduce). Then rank 0 writes the checkpoint and the result.
Besides, rank 0 saves every ``checkpoint_every_s`` seconds (``saver``), so a loss WITHOUT notice (a pilot
killed, a node crash) costs at most that much training.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .config import FragmentConfig, FragmentFailed, FragmentResult, StopReason
from .context import run_loop
from .rank import RankSetup, close_rank, join_group, open_rank, rank_store, step_flags
from .saver import Saver
from .workload_loop import train as workload_train

_Saver = Saver          # the name older code and tests import from here

__all__ = ["FragmentConfig", "FragmentFailed", "FragmentResult", "RankSetup", "Saver", "StopReason", "close_rank",
           "join_group", "main", "open_rank", "rank_store", "step_flags", "train_rank"]


def train_rank(cfg: FragmentConfig) -> FragmentResult | None:
    """The body of one rank: the user's training function (``cfg.loop``) or the built-in workload loop, run by
    the one loop driver. Returns the result on rank 0."""
    return run_loop(cfg, None if cfg.loop else workload_train)


def main(argv: list[str] | None = None) -> int:
    """One rank, as a site's own launcher starts it (``--config``: the FragmentConfig as JSON)."""
    ap = argparse.ArgumentParser(prog="python -m parsl_bft.train.fragment",
                                 description="one rank of a training fragment (launch n of them with srun/mpiexec)")
    ap.add_argument("--config", required=True, help="FragmentConfig as JSON")
    args = ap.parse_args(argv)
    cfg = FragmentConfig.from_json(Path(args.config).read_text())
    res = train_rank(cfg)
    if res is not None and "PARSL_BFT_STORE" not in os.environ:
        print(res.to_json())
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)          # no interpreter teardown of the process group (see rank.close_rank)
