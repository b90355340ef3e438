"""Training-step throughput per (ranks, freeze level), measured so that two shared cores' load does not decide it:
every level trains in the same processes, one step each in turn (alternating order), so a burst of other work
slows all levels alike; the median step time per level is reported.

Each of ``ranks`` processes (gloo on CPU, one thread, as fragments run) holds one copy of the workload's model
per level, the first f blocks frozen (train/freezing.py's ``freeze_prefix``), in DDP when ranks > 1, and trains
the fragment's step: its shard of a global batch, forward, backward (DDP all-reduces the gradients of the
trainable layers), the optimizer, and the all-reduce of the loss a fragment makes every step. A barrier before
each timed step keeps one level's stragglers out of the next one's time. What a fragment pays once (launch,
restore, save) is not here: the planner charges it per restart.
Usage: python benchmarks/layer_throughput.py [--ranks 1,2] [--levels 0,1,2,3] [--steps 60] [--size 32]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = f"{HERE / 'digits_cnn.py'}:DigitsCNN"


def _rank(rank: int, world: int, workload: str, wargs: dict, levels: list[int], batch: int, steps: int,
          warmup: int, init: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from parsl_bft.train.freezing import freeze_prefix
    from parsl_bft.train.workloads import make_workload

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    wl = make_workload(workload, **wargs)
    x, y = wl.dataset().tensors
    arms = []
    for f in levels:
        model = wl.build_model()
        params = freeze_prefix(model, wl.blocks(model), f)
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        arms.append((f, net, wl.build_optimizer(params)))
    gen = torch.Generator().manual_seed(0)
    times: dict[int, list[float]] = {f: [] for f in levels}
    for step in range(warmup + steps):
        idx = torch.randint(len(x), (batch,), generator=gen)[rank::world]
        for f, net, opt in arms if step % 2 == 0 else arms[::-1]:
            if world > 1:
                dist.barrier()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = wl.loss(net, (x[idx], y[idx]))
            loss.backward()
            opt.step()
            if world > 1:
                dist.all_reduce(loss.detach())
            if step >= warmup:
                times[f].append(time.perf_counter() - t)
    if rank == 0:
        Path(out).write_text(json.dumps({f: batch / statistics.median(ts) for f, ts in times.items()}))
    if world > 1:
        dist.destroy_process_group()


def measure(ranks: int, levels: list[int], *, workload: str = WORKLOAD, workload_args: dict | None = None,
            batch: int = 64, steps: int = 60, warmup: int = 5) -> dict[int, float]:
    """level -> samples/s on ``ranks`` ranks (median step)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="parsl-bft-layers-") as d:
        out, init = os.path.join(d, "out.json"), f"file://{os.path.join(d, 'rendezvous')}"
        mp.start_processes(_rank, (ranks, workload, workload_args or {}, levels, batch, steps, warmup, init, out),
                           nprocs=ranks, start_method="spawn")
        return {int(f): r for f, r in json.loads(Path(out).read_text()).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--levels", default="0,1,2,3")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    for n in (int(x) for x in args.ranks.split(",")):
        r = measure(n, levels, workload_args={"size": args.size}, batch=args.batch, steps=args.steps)
        print(n, {f: round(v, 1) for f, v in r.items()}, {f: round(v / r[levels[0]], 2) for f, v in r.items()})


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
