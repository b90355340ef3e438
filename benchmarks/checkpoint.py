"""HDF5 checkpoint save/load vs torch.save/torch.load of the same state (model + AdamW state).

Two models: ~100M parameters and a small one. Each measurement is the median of 3, in this process, same disk.
Also: fragment start overhead (restore + rendezvous) vs one training step.
LAST line: {"params": P, "save_ratio": hdf5_save_s / torch_save_s, "load_ratio": hdf5_load_s / torch_load_s}
for the large model (fsync off on both sides: torch.save does not fsync; the fsynced HDF5 save is printed too).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from parsl_bft.train.checkpoint import TrainingState, load_checkpoint, save_checkpoint


def make_state(width: int, layers: int):
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt


def interleaved(fns: dict, rounds: int = 5) -> dict:
    """Median time of each function, run in alternation round after round (the disk here is shared and noisy:
    alternating spreads its drift over all of them); dirty pages are flushed before each run, untimed."""
    ts: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            os.sync()
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def bench(width: int, layers: int, d: Path) -> dict:
    model, opt = make_state(width, layers)
    params = sum(p.numel() for p in model.parameters())
    st = TrainingState(model=model.state_dict(), optimizer=opt.state_dict())
    h5, pt = d / "c.h5", d / "c.pt"
    obj = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    r = {"params": params, **interleaved({
        "torch_save_s": lambda: torch.save(obj, pt),
        "hdf5_save_s": lambda: save_checkpoint(h5, st, fsync=False),
        "hdf5_save_fsync_s": lambda: save_checkpoint(h5, st, fsync=True)})}
    r.update(interleaved({"torch_load_s": lambda: torch.load(pt, weights_only=True),
                          "hdf5_load_s": lambda: load_checkpoint(h5)}))
    r["bytes"] = h5.stat().st_size
    r["save_ratio"] = r["hdf5_save_s"] / r["torch_save_s"]
    r["load_ratio"] = r["hdf5_load_s"] / r["torch_load_s"]
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
        print(f"{'params':>12} {'MB':>7} {'torch.save':>10} {'hdf5 save':>10} {'(fsync)':>9} {'ratio':>6} "
              f"{'torch.load':>10} {'hdf5 load':>10} {'ratio':>6}")
        for r in rows:
            print(f"{r['params']:>12,} {r['bytes'] / 1e6:>7.1f} {r['torch_save_s']:>10.3f} {r['hdf5_save_s']:>10.3f} "
                  f"{r['hdf5_save_fsync_s']:>9.3f} {r['save_ratio']:>6.2f} {r['torch_load_s']:>10.3f} "
                  f"{r['hdf5_load_s']:>10.3f} {r['load_ratio']:>6.2f}")
        o = fragment_overhead(d)
        print(f"fragment start (1 rank, images): restore {o['restore_s']:.3f} s + rendezvous {o['rendezvous_s']:.3f} s"
              f" = {o['start_over_step']:.1f} training steps ({o['step_s'] * 1e3:.1f} ms each); "
              f"checkpoint {o['checkpoint_s']:.3f} s")
        big = rows[-1]
        print(json.dumps({"params": big["params"], "save_ratio": round(big["save_ratio"], 3),
                          "load_ratio": round(big["load_ratio"], 3)}))


if __name__ == "__main__":
    main()
