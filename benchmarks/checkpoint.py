"""HDF5 checkpoint save/load vs torch.save/torch.load of the same state (model + AdamW state).

Two models: ~100M parameters and a small one. Every comparison runs its arms in alternation (ABAB...), 6 rounds
in this process, same disk, and reports each arm's median: this 2-core machine is shared, its load varies
within seconds, and alternating spreads that over all arms while the median drops the outliers (the spread of
the per-round ratios is printed too). Then the training pause of a periodic save: a blocking CheckpointStore.save
(what a fragment did) vs BackgroundSave.start (copy into buffers kept between saves; a thread writes while
training steps run), alternating, both fsynced as fragments save. Also: fragment start overhead (restore +
rendezvous) vs one training step.
LAST line: {"params": P, "save_ratio": hdf5_save_s / torch_save_s, "load_ratio": hdf5_load_s / torch_load_s,
"stall_ratio": background pause / blocking save} for the large model, medians (fsync off for the save ratio:
torch.save does not fsync; the fsynced HDF5 save is printed too).
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from parsl_bft.train.checkpoint import (BackgroundSave, CheckpointStore, TrainingState, load_checkpoint,
                                        save_checkpoint)


def make_state(width: int, layers: int):
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt


ROUNDS = 6                   # a multiple of 2 and 3: every arm gets every place in the order equally often


def interleaved(fns: dict, fresh: dict | None = None) -> dict[str, list[float]]:
    """Times of each function, run in alternation round after round, each round starting one function later
    (which one runs right after another's 1.2 GB write mattered here: each gets every place in turn); dirty pages
    are flushed and the function's ``fresh`` file removed before each run, untimed (a checkpoint is a new file:
    neither side pays for truncating an old one)."""
    ts: dict = {k: [] for k in fns}
    names = list(fns)
    for i in range(ROUNDS):
        for k in names[i % len(names):] + names[:i % len(names)]:
            fn = fns[k]
            if fresh:
                fresh[k].unlink(missing_ok=True)
            os.sync()
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
    return ts


def ratio(r: dict, name: str, ts: dict, a: str, b: str) -> None:
    """Median of arm ``a`` over median of arm ``b``, and the range of the per-round ratios."""
    per_round = [x / y for x, y in zip(ts[a], ts[b])]
    r[name] = statistics.median(ts[a]) / statistics.median(ts[b])
    r[f"{name}_range"] = (min(per_round), max(per_round))


def bench(width: int, layers: int, d: Path) -> dict:
    model, opt = make_state(width, layers)
    params = sum(p.numel() for p in model.parameters())
    st = TrainingState(model=model.state_dict(), optimizer=opt.state_dict())
    h5, h5f, pt = d / "c.h5", d / "f.h5", d / "c.pt"
    obj = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    # a file per arm: when two shared one, one arm removed the other's unwritten pages (nothing left to flush
    # before it ran) and the other came after a 1.2 GB flush, and page-cache writes right after a flush were up
    # to 4x slower here
    saves = interleaved({"torch_save_s": lambda: torch.save(obj, pt),
                         "hdf5_save_s": lambda: save_checkpoint(h5, st, fsync=False),
                         "hdf5_save_fsync_s": lambda: save_checkpoint(h5f, st, fsync=True)},
                        fresh={"torch_save_s": pt, "hdf5_save_s": h5, "hdf5_save_fsync_s": h5f})
    loads = interleaved({"torch_load_s": lambda: torch.load(pt, weights_only=True),
                         "hdf5_load_s": lambda: load_checkpoint(h5)})
    r = {"params": params, "bytes": h5.stat().st_size,
         **{k: statistics.median(v) for k, v in {**saves, **loads}.items()}}
    ratio(r, "save_ratio", saves, "hdf5_save_s", "torch_save_s")
    ratio(r, "load_ratio", loads, "hdf5_load_s", "torch_load_s")
    r.update(stall(model, opt, d / "store"))
    return r


def stall(model, opt, d: Path) -> dict:
    """Training pause of a periodic save, blocking vs background, alternating, with training steps while the
    thread writes."""
    store = CheckpointStore(d, keep=2)
    x = torch.randn(2, model[0].in_features)

    def train_step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    def state(step: int) -> TrainingState:
        return TrainingState(model=model.state_dict(), optimizer=opt.state_dict(), step=step)

    bg = BackgroundSave(lambda st: store.save(st, fsync=True))
    bg.prepare(state(0))
    bg.wait()
    ts: dict[str, list[float]] = {"blocking": [], "pause": [], "write": []}
    steps, overlapped = itertools.count(1), 0

    def blocking() -> None:
        t = time.perf_counter()
        store.save(state(next(steps)), fsync=True)
        ts["blocking"].append(time.perf_counter() - t)

    def background() -> None:
        nonlocal overlapped
        t = time.perf_counter()
        bg.start(state(next(steps)))
        ts["pause"].append(time.perf_counter() - t)
        while bg.busy():                       # training goes on while the thread writes
            train_step()
            overlapped += 1
        bg.wait()
        ts["write"].append(time.perf_counter() - t)

    for i in range(ROUNDS):
        for arm in (blocking, background) if i % 2 == 0 else (background, blocking):
            os.sync()
            arm()
    r = {"blocking_save_s": statistics.median(ts["blocking"]), "background_pause_s": statistics.median(ts["pause"]),
         "background_write_s": statistics.median(ts["write"]), "steps_during_writes": overlapped}
    ratio(r, "stall_ratio", ts, "pause", "blocking")
    return r


def fragment_overhead(d: Path) -> dict:
    from parsl_bft.train.fragment import FragmentConfig, train_rank
    cfg = dict(job="b", workload="images", checkpoint_dir=str(d / "frag"), global_batch=64, fsync=False)
    train_rank(FragmentConfig(**cfg, steps=2))
    r = train_rank(FragmentConfig(**cfg, steps=20))
    step_s = r.train_s / 20
    return {"restore_s": r.restore_s, "rendezvous_s": r.rendezvous_s, "checkpoint_s": r.checkpoint_s,
            "step_s": step_s, "start_over_step": (r.restore_s + r.rendezvous_s) / step_s}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        rows = [bench(256, 4, d), bench(4096, 6, d)]
        print(f"medians of {ROUNDS} alternating rounds (per-round ratio range in brackets)")
        print(f"{'params':>12} {'MB':>7} {'torch.save':>10} {'hdf5 save':>10} {'(fsync)':>9} {'ratio':>17} "
              f"{'torch.load':>10} {'hdf5 load':>10} {'ratio':>17}")
        span = "{:>6.2f} [{:.2f}-{:.2f}]".format
        for r in rows:
            print(f"{r['params']:>12,} {r['bytes'] / 1e6:>7.1f} {r['torch_save_s']:>10.3f} {r['hdf5_save_s']:>10.3f} "
                  f"{r['hdf5_save_fsync_s']:>9.3f} {span(r['save_ratio'], *r['save_ratio_range'])} "
                  f"{r['torch_load_s']:>10.3f} {r['hdf5_load_s']:>10.3f} {span(r['load_ratio'], *r['load_ratio_range'])}")
        for r in rows:
            print(f"{r['params']:>12,} periodic save: blocking {r['blocking_save_s']:.3f} s, background pause "
                  f"{r['background_pause_s']:.3f} s (written in {r['background_write_s']:.3f} s; "
                  f"{r['steps_during_writes']} training steps ran during the writes), stall ratio "
                  f"{span(r['stall_ratio'], *r['stall_ratio_range']).strip()}")
        o = fragment_overhead(d)
        print(f"fragment start (1 rank, images): restore {o['restore_s']:.3f} s + rendezvous {o['rendezvous_s']:.3f} s"
              f" = {o['start_over_step']:.1f} training steps ({o['step_s'] * 1e3:.1f} ms each); "
              f"checkpoint {o['checkpoint_s']:.3f} s")
        big = rows[-1]
        print(json.dumps({"params": big["params"], "save_ratio": round(big["save_ratio"], 3),
                          "load_ratio": round(big["load_ratio"], 3), "stall_ratio": round(big["stall_ratio"], 3)}))


if __name__ == "__main__":
    main()
