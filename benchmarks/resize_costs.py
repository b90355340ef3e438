"""What a resize or a reclaim costs this runtime, end to end, for the shipped workloads on this machine's CPU,
written as a costs file for the simulator (``parsl-bft simulate --costs FILE``; the shipped one is
parsl_bft/data/runtime.costs.csv).

Per workload (images, lm; 2 gloo ranks, the built-in loop, real HDF5 checkpoints), --rounds times:
  restart   a training fragment gets a stop request -> it has saved and exited -> the next fragment is launched,
            restored, has met its peer -> its first finished step: restart_s, and its phases launch_s
            (processes, handshake, exit), restore_s, first_step_s, save_s (the final save at the stop);
  warm-up   a fragment of --warm-steps steps after that: the time beyond its first step and
            (steps - 1) steady steps (the steady step from the stopped fragment's own throughput);
  stall     the training pause of a background save (BackgroundSave.start) of the workload's model and
            optimizer state, against a blocking save of it (CheckpointStore.save, fsync), and its restore.
Medians over the rounds. notice_preemption is 1 when the stop request -> saved and exited time fits in Slurm's
default KillWait (30 s: a preempted job gets SIGTERM that long before SIGKILL), else 0; notice_reservation is 1
(a planned start is read every survey).

Rows for the ImageNet models of the shipped job set are estimates (estimate=1): their save and restore from the
per-byte figures measured here (model + SGD momentum in float32, torchvision's parameter counts), their launch,
first step and warm-up the per-launch figures measured here (medians over the workloads).
The baseline every ratio is against: the blocking save (stall / save), and the restart's phases (shares of it).
Usage: python benchmarks/resize_costs.py [--out runtime.costs.csv] [--rounds 3] [--smoke]
LAST line: one JSON object.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from pathlib import Path

from stop_restart import stop_and_relaunch

from parsl_bft.train.checkpoint import BackgroundSave, CheckpointStore, TrainingState, load_checkpoint
from parsl_bft.train.config import FragmentConfig
from parsl_bft.train.launcher import run_fragment, start_rank_server
from parsl_bft.train.workloads import workload_factory

WORKLOADS = {"images": dict(global_batch=64), "lm": dict(global_batch=32)}
KILL_WAIT_S = 30.0           # Slurm's default KillWait: SIGTERM -> SIGKILL
# torchvision parameter counts of the shipped ImageNet mix's models (the job set's model names)
IMAGENET_PARAMS = {"AlexNet": 61_100_840, "vgg16": 138_357_544, "resnet18": 11_689_512, "DenseNet": 7_978_856,
                   "mnasnet1": 4_383_312, "mobilenet": 3_504_872, "shufflenet": 2_278_604}
STATE_COPIES = 2             # weights + SGD momentum
PROBE_BYTES = 128 * 2**20    # the per-byte figures: saves and restores with this much more state
COLUMNS = ["model", "device", "restart_s", "launch_s", "restore_s", "first_step_s", "warmup_s", "save_s", "stall_s",
           "notice_reservation", "notice_preemption", "estimate"]


def cfg(name: str, job: Path, steps: int | None, total: int | None = None) -> FragmentConfig:
    return FragmentConfig(job=name, workload=name, checkpoint_dir=str(job), world_size=2, steps=steps,
                          total_samples=total, fsync=True, **WORKLOADS[name])


def restart(name: str, warm_steps: int) -> dict[str, float]:
    """One stop request -> next fragment's first finished step, phase by phase, and the warm-up after it."""
    with tempfile.TemporaryDirectory(prefix="bft-costs-") as d:
        r = stop_and_relaunch(Path(d), lambda: run_fragment(cfg(name, Path(d), None, 10**12)),
                              lambda: run_fragment(cfg(name, Path(d), 1)), past_step=5, poll_s=0.02)
        c = run_fragment(cfg(name, Path(d), warm_steps))
    assert c is not None
    a, b = r.stopped, r.next
    steady = WORKLOADS[name]["global_batch"] / a.throughput
    return {"restart_s": r.total_s, "stop_to_saved_s": r.stop_to_exited_s, "save_s": a.checkpoint_s,
            "restore_s": b.restore_s + b.rendezvous_s, "first_step_s": b.train_s,
            "launch_s": r.launch_to_done_s - b.restore_s - b.rendezvous_s - b.train_s - b.checkpoint_s
                        + r.stop_to_exited_s - a.checkpoint_s,
            "warmup_s": max(0.0, c.train_s - b.train_s - (warm_steps - 1) * steady), "steady_step_s": steady}


def saves(name: str, rounds: int) -> dict[str, float]:
    """Blocking save, background-save stall and restore of the workload's model + optimizer state, and the same
    with PROBE_BYTES more (one more tensor): the per-byte figures are the difference over those bytes."""
    import torch

    w = workload_factory(name)()
    model = w.build_model()
    opt = w.build_optimizer(model.parameters())
    w.loss(model, w.collate([w.dataset()[i] for i in range(8)])).backward()
    opt.step()
    probe = {"probe": torch.zeros(PROBE_BYTES // 4)}
    m = {f"{k}{tag}": v for tag, extra in (("", {}), ("_probe", probe))
         for k, v in _time_saves(model.state_dict(), opt.state_dict(), extra, rounds).items()}
    m["bytes"] = float(sum(t.numel() * t.element_size() for t in model.state_dict().values()) * STATE_COPIES)
    return m


def _time_saves(weights: dict, optimizer: dict, extra: dict, rounds: int) -> dict[str, float]:
    def ts(step: int) -> TrainingState:
        return TrainingState(model={**weights, **extra}, optimizer=optimizer, step=step)
    out: dict[str, list[float]] = {"blocking_s": [], "stall_s": [], "load_s": []}
    with tempfile.TemporaryDirectory(prefix="bft-costs-ckpt-") as d:
        store = CheckpointStore(d, keep=2 * rounds + 2)     # (numbered by step: keep every one read back)
        bg = BackgroundSave(lambda st: store.save(st, fsync=True))
        bg.prepare(ts(0))
        bg.wait()
        for i in range(rounds):
            t = time.perf_counter()
            path = store.save(ts(1 + i), fsync=True)
            out["blocking_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            bg.start(ts(100 + i))
            out["stall_s"].append(time.perf_counter() - t)
            bg.wait()
            t = time.perf_counter()
            load_checkpoint(path)
            out["load_s"].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


def measure(name: str, rounds: int, warm_steps: int) -> dict[str, float]:
    rs = [restart(name, warm_steps) for _ in range(rounds)]
    row = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    row.update({f"ckpt_{k}": v for k, v in saves(name, rounds).items()})
    row["stall_s"] = row["ckpt_stall_s"]
    print(f"{name}: restart {row['restart_s']:.2f} s (launch {row['launch_s']:.2f}, restore {row['restore_s']:.2f}, "
          f"first step {row['first_step_s']:.3f}, save {row['save_s']:.3f}), warm-up {row['warmup_s']:.3f} s, "
          f"stall x{row['ckpt_stall_s'] / row['ckpt_blocking_s']:.3f} of a blocking save", flush=True)
    return row


def estimates(rows: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """ImageNet models from the per-byte and per-launch figures measured on the workloads (medians)."""
    def med(f):
        return statistics.median(f(r) for r in rows.values())
    save_spb = med(lambda r: max(0.0, r["ckpt_blocking_s_probe"] - r["ckpt_blocking_s"]) / PROBE_BYTES)
    load_spb = med(lambda r: max(0.0, r["ckpt_load_s_probe"] - r["ckpt_load_s"]) / PROBE_BYTES)
    stall_spb = med(lambda r: max(0.0, r["ckpt_stall_s_probe"] - r["ckpt_stall_s"]) / PROBE_BYTES)
    out = {}
    for model, n in IMAGENET_PARAMS.items():
        b = n * 4 * STATE_COPIES
        e = {"save_s": med(lambda r: r["save_s"]) + b * save_spb,
             "stall_s": med(lambda r: r["stall_s"]) + b * stall_spb,
             "restore_s": med(lambda r: r["restore_s"]) + b * load_spb, "launch_s": med(lambda r: r["launch_s"]),
             "first_step_s": med(lambda r: r["first_step_s"]), "warmup_s": med(lambda r: r["warmup_s"])}
        e["stop_to_saved_s"] = med(lambda r: r["stop_to_saved_s"] - r["save_s"]) + e["save_s"]
        e["restart_s"] = e["save_s"] + e["restore_s"] + e["launch_s"] + e["first_step_s"]
        out[model] = e
    return out


def write(path: Path, measured: dict[str, dict[str, float]], est: dict[str, dict[str, float]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for rows, flag in ((measured, 0), (est, 1)):
            for model, r in rows.items():
                w.writerow([model, "cpu", *(f"{r[k]:.3f}" for k in COLUMNS[2:8]), f"{r['stall_s']:.4f}", "1",
                            "1" if r["stop_to_saved_s"] <= KILL_WAIT_S else "0", flag])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runtime.costs.csv")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-steps", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="one round, 2 warm-up steps, the images workload only")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.warm_steps = 1, 2
    start_rank_server()
    t0 = time.perf_counter()
    names = ["images"] if args.smoke else list(WORKLOADS)
    rows = {n: measure(n, args.rounds, args.warm_steps) for n in names}
    est = estimates(rows)
    write(Path(args.out), rows, est)
    print(f"wrote {args.out}: {len(rows)} measured rows, {len(est)} estimates")
    summary = {"wall_s": time.perf_counter() - t0, "rounds": args.rounds,
               **{f"{n}_restart_s": r["restart_s"] for n, r in rows.items()},
               **{f"{n}_save_s": r["save_s"] for n, r in rows.items()},
               **{f"{n}_stall_ratio": r["ckpt_stall_s"] / r["ckpt_blocking_s"] for n, r in rows.items()},
               **{f"{n}_restore_share": r["restore_s"] / r["restart_s"] for n, r in rows.items()},
               "resnet18_restart_s_estimate": est["resnet18"]["restart_s"],
               "vgg16_restart_s_estimate": est["vgg16"]["restart_s"]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
