"""Real training with and without auto-freezing, in one process (benchmarks/freezing.py's section 1; its
docstring says what is measured). The models: ``digits`` (benchmarks/digits_cnn.py, five layers, compute in the
convolutions) and ``transformer`` (benchmarks/seq_transformer.py, an embedding, four encoder layers, a head)."""
from __future__ import annotations

import statistics
import time

import torch
from digits_cnn import DigitsCNN
from seq_transformer import SeqTransformer

# model -> (workload class, its arguments, epochs)
MODELS = {"digits": (DigitsCNN, {"size": 16, "width": 16, "schedule": "cosine"}, 10),
          "transformer": (SeqTransformer, {"schedule": "cosine"}, 10)}


def workload(name: str, seed: int):
    cls, kw, _ = MODELS[name]
    return cls(seed=seed, **kw)


def set_level(model, blocks, old: int, new: int) -> list:
    """Freeze the first ``new`` blocks (unfreezing those between when going down); the trainable parameters."""
    from parsl_bft.train.freezing import freeze_prefix

    for b in blocks[new:old]:
        b.train()
        b.requires_grad_(True)
    return freeze_prefix(model, blocks, new)


def profile(name: str, args):
    """The layer-aware throughput model of ``name`` on one rank: every level's step timed in turn (median)."""
    from parsl_bft.planner.freeze import LayerThroughput
    from parsl_bft.scaling import LayerProfile, ScalingCurve
    from parsl_bft.train.freezing import layer_shares

    wl = workload(name, 0)
    x, y = wl.dataset().tensors
    ref = wl.build_model()
    blocks = wl.blocks(ref)
    shares = layer_shares(ref, blocks, (x[:args.batch], y[:args.batch]), wl.loss)
    levels = sorted(shares)
    arms = []
    for f in levels:
        m = wl.build_model()
        arms.append((f, m, wl.build_optimizer(set_level(m, wl.blocks(m), 0, f))))
    times: dict[int, list[float]] = {f: [] for f in levels}
    gen = torch.Generator().manual_seed(0)
    for step in range(args.profile_steps + 3):
        idx = torch.randint(len(x), (args.batch,), generator=gen)
        for f, m, opt in arms if step % 2 == 0 else arms[::-1]:
            t = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            wl.loss(m, (x[idx], y[idx])).backward()
            opt.step()
            if step >= 3:
                times[f].append(time.perf_counter() - t)
    rate = {f: args.batch / statistics.median(ts) for f, ts in times.items()}
    lt = LayerThroughput(ScalingCurve(name, {1: rate[0]}),
                         LayerProfile(name, len(blocks), {f: shares[f] for f in levels if f},
                                      {(1, f): r for f, r in rate.items() if f}))
    print(f"\n{name}: {len(blocks)} layers; samples/s per frozen level "
          + ", ".join(f"{f}: {r:.0f} ({r / rate[0]:.2f}x)" for f, r in rate.items())
          + f"; throughput model's held-out error {lt.heldout_mape() or 0:.1%}")
    return lt


class Arm:
    """One training run; with ``lt`` (auto) the planner sets each epoch's freeze level within the budget."""

    def __init__(self, name: str, seed: int, args, lt=None) -> None:
        from parsl_bft.jobs import JobSpec
        from parsl_bft.planner import JobState, Planner
        from parsl_bft.train.freezing import GradRecorder

        self.wl, self.args, self.seed = workload(name, seed), args, seed
        self.data, self.val, self.test = (self.wl.dataset(s) for s in ("train", "val", "test"))
        self.epochs = args.epochs or MODELS[name][2]
        self.per = len(self.data) // args.batch
        self.model = self.wl.build_model()
        self.blocks = self.wl.blocks(self.model)
        self.opt = self.wl.build_optimizer(list(self.model.parameters()))
        self.sched = self.wl.build_scheduler(self.opt, self.epochs * self.per, self.per)
        self.level, self.wall, self.step, self.curve = 0, 0.0, 0, []
        self.state = self.rec = None
        if lt is not None:
            total = float(self.epochs * self.per * args.batch)
            spec = JobSpec(name, name, 1, 1, args.t_restart, args.t_restart, total, freeze="auto",
                           accuracy_budget=args.budget)
            self.state = JobState(spec, lt.curve, ("n0",), layers=lt)
            self.planner = Planner(method="dp", t_fwd=args.tfwd)
            self.rec = GradRecorder(self.blocks, 0, interval=self.per)

    def accuracy(self, split) -> float:
        self.model.eval()
        with torch.no_grad():
            acc = float((self.model(split.tensors[0]).argmax(1) == split.tensors[1]).float().mean())
        self.model.train()
        for b in self.blocks[:self.level]:
            b.eval()
        return acc

    def epoch(self, e: int) -> None:
        from parsl_bft.planner.freeze import charge_budget

        B = self.args.batch
        perm = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed * 1_000_003 + e))
        t = time.perf_counter()
        for s in range(self.per):
            x, y = self.data[perm[s * B:(s + 1) * B]]
            self.opt.zero_grad(set_to_none=False)
            self.wl.loss(self.model, (x, y)).backward()
            if self.rec is not None:
                self.rec.record(self.step)
            self.opt.step()
            self.sched.step()
            self.step += 1
        if self.state is not None:      # as a fragment's report: charge the epoch at its level, then re-plan
            st = self.state
            charge_budget(st, self.per * B / st.spec.samples)
            st.grad_stats = self.rec.report() or st.grad_stats
            st.samples_done += self.per * B
            self.relevel(self.planner.plan([st], ["n0"]).freeze[st.name])
        self.wall += time.perf_counter() - t
        self.curve.append({"wall_s": self.wall, "val": self.accuracy(self.val), "level": self.level})

    def relevel(self, new: int) -> None:
        """Run the next epoch at level ``new``: the optimizer rebuilt, its state and the schedule carried."""
        from parsl_bft.train.freezing import GradRecorder, carry_optimizer_state

        if new == self.level:
            return
        saved, saved_sched = self.opt.state_dict(), self.sched.state_dict()
        self.opt = self.wl.build_optimizer(set_level(self.model, self.blocks, self.level, new))
        self.opt.load_state_dict(carry_optimizer_state(saved, self.model, self.blocks, self.level, self.opt,
                                                       self.wl.build_optimizer))
        self.sched = self.wl.build_scheduler(self.opt, self.epochs * self.per, self.per)
        self.sched.load_state_dict(saved_sched)
        self.rec = GradRecorder(self.blocks, new, restored=self.rec.state(), interval=self.per)
        self.level = self.state.freeze = new


def pair(name: str, seed: int, lt, args) -> dict:
    """Both arms of one seed, epochs alternating (the order flips with the seed)."""
    arms = [Arm(name, seed, args), Arm(name, seed, args, lt)]
    for e in range(arms[0].epochs):
        for arm in arms if (seed + e) % 2 == 0 else arms[::-1]:
            arm.epoch(e)
    off, auto = arms
    target = off.curve[-1]["val"] - args.target_gap

    def reach(arm) -> float:
        return next((r["wall_s"] for r in arm.curve if r["val"] >= target), float("inf"))

    return {"seed": seed, "target": target, "t_off": reach(off), "t_auto": reach(auto),
            "time_to_target_ratio": reach(auto) / reach(off),
            "test_off": off.accuracy(off.test), "test_auto": auto.accuracy(auto.test),
            "accuracy_delta": auto.accuracy(auto.test) - off.accuracy(off.test),
            "levels": [r["level"] for r in auto.curve], "spent": auto.state.accuracy_spent,
            "wall_ratio": auto.wall / off.wall}


def train_model(name: str, args) -> dict:
    """Profile, then ``args.seeds`` pairs; prints a row per seed. Returns the pairs and their summary."""
    torch.set_num_threads(1)
    lt = profile(name, args)
    print(f"{'seed':>4} {'val target':>10} {'off: s to target':>16} {'auto':>6} {'ratio':>6} | "
          f"{'test acc off':>12} {'auto':>6} {'delta':>7} | {'budget spent':>12}  levels per epoch")
    pairs = []
    for seed in range(args.seeds):
        p = pair(name, seed, lt, args)
        pairs.append(p)
        print(f"{seed:4d} {p['target']:10.3f} {p['t_off']:16.2f} {p['t_auto']:6.2f} {p['time_to_target_ratio']:6.3f} | "
              f"{p['test_off']:12.4f} {p['test_auto']:6.4f} {p['accuracy_delta']:+7.4f} | {p['spent']:12.4f}  "
              f"{' '.join(map(str, p['levels']))}", flush=True)
    return {"pairs": pairs, "throughput_mape": lt.heldout_mape(),
            "time_to_target_median": statistics.median(p["time_to_target_ratio"] for p in pairs),
            "accuracy_delta_mean": statistics.fmean(p["accuracy_delta"] for p in pairs)}
