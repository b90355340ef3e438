"""HDF5 checkpoint save/load vs torch.save/torch.load of the same state (model + AdamW state).

Two models: ~100M parameters and a small one. Every comparison runs its arms in alternation (ABAB...), 6 rounds
in this process, same disk, and reports each arm's median: this 2-core machine is shared, its load varies
within seconds, and alternating spreads that over all arms while the median drops the outliers (the spread of
the per-round ratios is printed too). Loads are measured twice: the restore a fragment makes (the checkpoint
into a built model and its new AdamW, which has no state before its first step: torch.load + load_state_dict
vs load_checkpoint(into=model.state_dict()) + load_state_dict), and the bare read (torch.load vs
load_checkpoint, into fresh memory); the optimizer state's part of the restore is measured alone too. Then the
training pause of a periodic save: a blocking CheckpointStore.save (what a fragment did) vs
BackgroundSave.start (copy into buffers kept between saves; a thread writes while training steps run),
alternating, both fsynced as fragments save. Also: fragment start overhead (restore + rendezvous) vs one
training step.
LAST line: {"params": P, "save_ratio": hdf5_save_s / torch_save_s, "load_ratio": hdf5 restore / torch restore,
"read_ratio": load_checkpoint / torch.load, "stall_ratio": background pause / blocking save} for the large
model, medians (fsync off for the save ratio: torch.save does not fsync; the fsynced HDF5 save is printed too).

``--resnet50`` runs one section only: a ResNet-50's restore on the CPU (its 320 model tensors and 161 SGD momentum
buffers: 481 datasets, the shape of benchmarks/gpu_models.py's), ``load_checkpoint(into=)`` + ``load_state_dict``
against ``torch.load(map_location="cpu")`` + ``load_state_dict``, alternating in this process; and the part of
the restore that is metadata (``load_checkpoint(arrays=False)``). Its last line: {"restore_ratio", ...}.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

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


def interleaved(fns: dict, before: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Times of each function, run in alternation round after round, each round starting one function later
    (which one runs right after another's 1.2 GB write mattered here: each gets every place in turn); dirty pages
    are flushed and ``before(name)`` runs before each run, untimed."""
    ts: dict = {k: [] for k in fns}
    names = list(fns)
    for i in range(ROUNDS):
        for k in names[i % len(names):] + names[:i % len(names)]:
            fn = fns[k]
            if before:
                before(k)
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
    # to 4x slower here. A checkpoint is a new file: neither side pays for truncating an old one.
    files = {"torch_save_s": pt, "hdf5_save_s": h5, "hdf5_save_fsync_s": h5f}
    saves = interleaved({"torch_save_s": lambda: torch.save(obj, pt),
                         "hdf5_save_s": lambda: save_checkpoint(h5, st, fsync=False),
                         "hdf5_save_fsync_s": lambda: save_checkpoint(h5f, st, fsync=True)},
                        before=lambda k: files[k].unlink(missing_ok=True))
    reads = interleaved({"torch_load_s": lambda: torch.load(pt, weights_only=True),
                         "hdf5_load_s": lambda: load_checkpoint(h5)})
    r = {"params": params, "bytes": h5.stat().st_size,
         **{k: statistics.median(v) for k, v in {**saves, **reads}.items()}}
    ratio(r, "save_ratio", saves, "hdf5_save_s", "torch_save_s")
    ratio(r, "read_ratio", reads, "hdf5_load_s", "torch_load_s")
    r.update(restore(width, layers, obj, st, d))
    r.update(stall(model, opt, d / "store"))
    return r


def restore(width: int, layers: int, obj: dict, st: TrainingState, d: Path) -> dict:
    """What a fragment's restore does: the checkpoint into a model built beforehand (its memory set up and
    initialised, as a workload's build_model leaves it) and into a new AdamW (no state before its first step:
    a fresh fragment's). Every arm ends with the same live model and optimizer; the optimizer is made new,
    untimed, before each run. Then the optimizer state's part alone, the same way."""
    target = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    box: dict = {}
    pt, h5 = d / "c.pt", d / "c.h5"

    def new_optimizer(_arm: str) -> None:
        box.clear()                              # the last run's optimizer state goes before the next is loaded
        gc.collect()
        box["opt"] = torch.optim.AdamW(target.parameters(), lr=1e-4)

    def torch_restore(path: Path, model: bool = True) -> None:
        sd = torch.load(path, weights_only=True)
        if model:
            target.load_state_dict(sd["model"])
        box["opt"].load_state_dict(sd["optimizer"])

    def torch_assign() -> None:               # adopts the loaded tensors: no copy, but new parameters, so the
        sd = torch.load(pt, weights_only=True)  # optimizer can only be built after the restore
        target.load_state_dict(sd["model"], assign=True)
        box["opt"] = torch.optim.AdamW(target.parameters(), lr=1e-4)
        box["opt"].load_state_dict(sd["optimizer"])

    def hdf5_restore(path: Path, model: bool = True) -> None:
        got = load_checkpoint(path, into=target.state_dict() if model else None)
        if model:
            target.load_state_dict(got.model)
        box["opt"].load_state_dict(got.optimizer)

    full = interleaved({"torch_restore_s": lambda: torch_restore(pt), "hdf5_restore_s": lambda: hdf5_restore(h5),
                        "torch_assign_s": torch_assign}, before=new_optimizer)
    opt_pt, opt_h5 = d / "o.pt", d / "o.h5"
    torch.save({"optimizer": obj["optimizer"]}, opt_pt)
    save_checkpoint(opt_h5, TrainingState(model={}, optimizer=st.optimizer), fsync=False)
    part = interleaved({"torch_opt_s": lambda: torch_restore(opt_pt, model=False),
                        "hdf5_opt_s": lambda: hdf5_restore(opt_h5, model=False)}, before=new_optimizer)
    for p in (opt_pt, opt_h5):
        p.unlink()
    r = {k: statistics.median(v) for k, v in {**full, **part}.items()}
    ratio(r, "load_ratio", full, "hdf5_restore_s", "torch_restore_s")
    ratio(r, "assign_ratio", full, "hdf5_restore_s", "torch_assign_s")
    ratio(r, "opt_ratio", part, "hdf5_opt_s", "torch_opt_s")
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


def resnet50_restore(d: Path, rounds: int) -> dict:
    """A ResNet-50 with its SGD momentum (as gpu_models builds it) restored from each format into the same live
    model and optimizer, alternating; plus the metadata-only read."""
    from gpu_models import build, step
    cpu = torch.device("cpu")
    run, model, opt = build("resnet50", cpu, channels_last=False, compile_model=False)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 1000, (2,))
    step("resnet50", run, opt, x, y, bf16=False)                 # the momentum buffers exist
    h5, pt = d / "r50.h5", d / "r50.pt"
    save_checkpoint(h5, TrainingState(model=model.state_dict(), optimizer=opt.state_dict()), fsync=False)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, pt)

    def hdf5() -> None:
        got = load_checkpoint(h5, into=model.state_dict())
        model.load_state_dict(got.model)
        opt.load_state_dict(got.optimizer or {})

    def torch_load() -> None:
        got = torch.load(pt, map_location="cpu", weights_only=True)
        model.load_state_dict(got["model"])
        opt.load_state_dict(got["optimizer"])

    global ROUNDS
    ROUNDS, before = rounds, ROUNDS
    try:
        ts = interleaved({"hdf5_restore_s": hdf5, "torch_restore_s": torch_load,
                          "metadata_s": lambda: load_checkpoint(h5, arrays=False)}, before=lambda _: gc.collect())
    finally:
        ROUNDS = before
    r = {"datasets": len(model.state_dict()) + len(opt.state_dict()["state"]), "bytes": h5.stat().st_size,
         **{k: statistics.median(v) for k, v in ts.items()}}
    ratio(r, "restore_ratio", ts, "hdf5_restore_s", "torch_restore_s")
    return r


def main_resnet50(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        r = resnet50_restore(Path(tmp), rounds)
    print(f"ResNet-50 + SGD momentum ({r['datasets']} tensors, {r['bytes'] / 1e6:.0f} MB), medians of {rounds} "
          f"alternating rounds: load_checkpoint(into=) + load_state_dict {r['hdf5_restore_s']:.3f} s (of it "
          f"metadata alone {r['metadata_s']:.3f} s), torch.load(map_location='cpu') + load_state_dict "
          f"{r['torch_restore_s']:.3f} s; ratio {r['restore_ratio']:.2f} [{r['restore_ratio_range'][0]:.2f}-"
          f"{r['restore_ratio_range'][1]:.2f}]")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resnet50", action="store_true", help="only the ResNet-50 restore on the CPU")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    if args.resnet50:
        main_resnet50(args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        rows = [bench(256, 4, d), bench(4096, 6, d)]
        print(f"medians of {ROUNDS} alternating rounds (per-round ratio range in brackets)")
        print(f"{'params':>12} {'MB':>7} {'torch.save':>10} {'hdf5 save':>10} {'(fsync)':>9} {'ratio':>17}")
        span = "{:>6.2f} [{:.2f}-{:.2f}]".format
        for r in rows:
            print(f"{r['params']:>12,} {r['bytes'] / 1e6:>7.1f} {r['torch_save_s']:>10.3f} {r['hdf5_save_s']:>10.3f} "
                  f"{r['hdf5_save_fsync_s']:>9.3f} {span(r['save_ratio'], *r['save_ratio_range'])}")
        for r in rows:
            print(f"{r['params']:>12,} restore into a built model and a new AdamW (load_ratio): torch.load + "
                  f"load_state_dict {r['torch_restore_s']:.3f} s, load_checkpoint(into=) + load_state_dict "
                  f"{r['hdf5_restore_s']:.3f} s, ratio {span(r['load_ratio'], *r['load_ratio_range']).strip()}")
            print(f"{'':>12} vs load_state_dict(assign=True), optimizer built after it {r['torch_assign_s']:.3f} s: "
                  f"ratio {span(r['assign_ratio'], *r['assign_ratio_range']).strip()}; the optimizer state alone: "
                  f"torch {r['torch_opt_s']:.3f} s, hdf5 {r['hdf5_opt_s']:.3f} s, ratio "
                  f"{span(r['opt_ratio'], *r['opt_ratio_range']).strip()}")
            print(f"{'':>12} read into fresh memory (read_ratio): torch.load {r['torch_load_s']:.3f} s, "
                  f"load_checkpoint {r['hdf5_load_s']:.3f} s, "
                  f"ratio {span(r['read_ratio'], *r['read_ratio_range']).strip()}")
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
                          "load_ratio": round(big["load_ratio"], 3), "read_ratio": round(big["read_ratio"], 3),
                          "stall_ratio": round(big["stall_ratio"], 3)}))


if __name__ == "__main__":
    main()
