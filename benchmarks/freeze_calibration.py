"""Calibrating the frozen penalty on real data: does a model reach the same test accuracy when its first
layers are frozen early, and what do the per-layer gradient statistics (train/freezing.py's GradRecorder) say at
the time of freezing? Models: ``digits`` (the digits CNN) and ``transformer`` (the made-sequence transformer),
as benchmarks/freezing.py trains them (benchmarks/freeze_training.py), on the seed's train / test split.

One process trains at the benchmark's batch, freezing level L from the start of epoch E (1-based), for every
(L, E) asked; the unfrozen run records, per epoch, each layer's signal and energy share (what ``GradRecorder``
reports) and the penalty curve the planner would read. Prints the final test accuracies next to what the budget
rule would have charged for freezing L from E (the penalty after epoch E-1 times the rest of the run); the LAST
line is JSON: {"model", "final": {"L@E": [accuracy per seed]}, "stats", "penalty", "charged"}. ``--plot``
draws the accuracy lost against the charge, the budget on both axes.
Usage: python benchmarks/freeze_calibration.py [--model digits] [--epochs 10] [--levels 1,2,3] [--from 3,5,7]
[--seeds 0,1] [--plot calibration.png]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def run(level: int, start_epoch: int | None, args, seed: int, record: bool = False) -> dict:
    from freeze_training import workload

    from parsl_bft.planner.freeze import GradStats, penalty_curve
    from parsl_bft.train.freezing import GradRecorder, carry_optimizer_state, freeze_prefix

    wl = workload(args.model, seed)
    data, test = wl.dataset(), wl.dataset("test")
    model = wl.build_model()
    blocks = wl.blocks(model)
    opt = wl.build_optimizer(list(model.parameters()))
    n, B = len(data), args.batch
    per_epoch = n // B
    sched = wl.build_scheduler(opt, total_steps=args.epochs * per_epoch, steps_per_epoch=per_epoch)
    torch.manual_seed(seed)
    rec = GradRecorder(blocks, 0, every=args.every or None, interval=args.interval or per_epoch) if record else None
    acc, stats, pens = [], [], []
    step = 0
    for epoch in range(args.epochs):
        if start_epoch is not None and epoch == start_epoch:
            saved, saved_sched = opt.state_dict(), sched.state_dict()
            opt = wl.build_optimizer(freeze_prefix(model, blocks, level))     # as a fragment at the new level does
            opt.load_state_dict(carry_optimizer_state(saved, model, blocks, 0, opt, wl.build_optimizer))
            sched = wl.build_scheduler(opt, total_steps=args.epochs * per_epoch, steps_per_epoch=per_epoch)
            sched.load_state_dict(saved_sched)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        for s in range(per_epoch):
            x, y = data[perm[s * B:(s + 1) * B]]
            opt.zero_grad(set_to_none=False)
            wl.loss(model, (x, y)).backward()
            if rec is not None:
                rec.record(step)
            opt.step()
            sched.step()
            step += 1
        model.eval()
        with torch.no_grad():
            acc.append(float((model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()))
        model.train()
        for b in blocks[:level if start_epoch is not None and epoch >= start_epoch else 0]:
            b.eval()
        if rec is not None:
            rep = rec.report()
            g = GradStats.from_dict(rep)
            stats.append({"signal": [round(x, 3) for x in g.signal],
                          "energy share": [round(x / sum(g.energy), 3) for x in g.energy]} if g else None)
            pens.append([round(float(x), 4) for x in penalty_curve(g, len(blocks))])
    return {"accuracy": acc, "stats": stats, "penalty": pens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="digits", help="digits or transformer")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--from", dest="starts", default="3,5,7", help="epochs (1-based) freezing starts with")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--every", type=int, default=0, help="steps between gradient samples (0: the recorder's)")
    ap.add_argument("--interval", type=int, default=0, help="steps per statistics interval (0: an epoch's, as "
                    "benchmarks/freezing.py)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=0.005, help="the accuracy budget drawn on the plot")
    ap.add_argument("--plot", default="", help="write the loss-against-charge figure here (PNG)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [int(x) for x in args.levels.split(",") if x]
    starts = [int(x) for x in args.starts.split(",")]
    if any(not 2 <= e <= args.epochs for e in starts):
        raise SystemExit(f"--from: epochs 2..{args.epochs} (statistics exist only after the first), got {starts}")
    seeds = [int(x) for x in args.seeds.split(",")]
    final: dict[str, list[float]] = {}
    out: dict = {}
    t = time.perf_counter()
    for seed in seeds:
        base = run(0, None, args, seed, record=True)
        final.setdefault("off", []).append(base["accuracy"][-1])
        out.setdefault("stats", []).append(base["stats"])
        out.setdefault("penalty", []).append(base["penalty"])
        print(f"seed {seed} unfrozen: accuracy per epoch {[f'{a:.3f}' for a in base['accuracy']]}")
        for e, (c, p) in enumerate(zip(base["stats"], base["penalty"])):
            print(f"  after epoch {e + 1}: {c}  penalty {p}")
        for lv in levels:
            for e in starts:
                r = run(lv, e - 1, args, seed)
                final.setdefault(f"{lv}@{e}", []).append(r["accuracy"][-1])
                print(f"seed {seed} level {lv} from epoch {e}: accuracy per epoch "
                      f"{[f'{a:.3f}' for a in r['accuracy']]}")
    # what the planner would have charged: the penalty of the level at the end of the epoch before, over the
    # rest of the run (train/freezing.py's budget rule), against the accuracy the runs actually lost
    print(f"\n{'frozen':>6} {'from epoch':>10} {'final held-out accuracy (per seed)':>36} {'mean - off':>10} "
          f"{'charged':>8}")
    off = sum(final["off"]) / len(final["off"])
    for k, v in final.items():
        lv, _, e = k.partition("@")
        charged = (sum(p[int(e) - 2][int(lv)] for p in out["penalty"]) / len(seeds)
                   * (1 - (int(e) - 1) / args.epochs) if e else 0.0)
        out.setdefault("charged", {})[k] = charged
        print(f"{lv:>6} {e or '-':>10} {' '.join(f'{a:.4f}' for a in v):>36} "
              f"{sum(v) / len(v) - off:+10.4f} {charged:8.4f}")
    print(f"({time.perf_counter() - t:.0f} s)")
    if args.plot:
        plot(args, final, out["charged"])
        print(f"wrote {args.plot}")
    print(json.dumps({"model": args.model, "final": final, **out}))


def plot(args, final: dict[str, list[float]], charged: dict[str, float]) -> None:
    """Measured accuracy loss (mean over the seeds, and each seed) against the charge, one point per frozen
    (level, epoch); the budget drawn on both axes: the planner admits only what lies left of it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off = final["off"]
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for k, accs in final.items():
        if k == "off":
            continue
        lost = [o - a for o, a in zip(off, accs)]
        x = max(charged[k], 1e-4)
        ax.scatter([x] * len(lost), lost, s=8, color="0.7", zorder=1)
        ax.scatter([x], [sum(lost) / len(lost)], s=30, color="C0", zorder=2)
        ax.annotate(k, (x, sum(lost) / len(lost)), fontsize=7, xytext=(4, 2), textcoords="offset points")
    ax.axvline(args.budget, color="C3", lw=0.8, ls="--", label=f"budget {args.budget:g}")
    ax.axhline(args.budget, color="C3", lw=0.8, ls=":")
    xs = [10 ** (k / 50 - 4) for k in range(201)]          # the diagonal, curved where the y axis turns linear
    ax.plot(xs, xs, color="black", lw=0.6, label="loss = charge")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("charged by the budget rule (penalty x rest of the run)")
    ax.set_ylabel("test accuracy lost (grey: per seed; blue: mean)")
    ax.set_title(f"{args.model}: freezing level@epoch, {len(off)} seeds")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
