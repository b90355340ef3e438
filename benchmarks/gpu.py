"""Every GPU measurement in one run (~8 minutes on one H100; --parts splits it), each against plain PyTorch timed
in the same run on the same device, for a ResNet-50 (224x224, bf16 autocast, channels-last) and a GPT-2-medium-size
decoder (1024 tokens, bf16 autocast) on synthetic data (benchmarks/gpu_models.py):

  throughput   samples/s of the same training step in a plain loop and inside a parsl-bft fragment (a
               scientist's own train(ctx) on one rank: its per-step stop check and progress, periodic saves off),
               both after the same warm-up steps: ratio fragment / plain;
  checkpoint   the model + optimizer state: HDF5 save (CheckpointStore) vs torch.save; the training pause of a
               background save (BackgroundSave.start) vs a blocking save; restore onto the device
               (load_checkpoint(into=, device=) + load_state_dict) vs torch.load(map_location=) + load_state_dict;
  resize       what a resize costs this runtime, phase by phase: a stop request to a training fragment -> it has
               saved and exited -> the next fragment launched, restored, met its peers -> its first finished
               step (warm-up included), and the total;
  compile      the same resize with torch.compile (compile time is part of a restart), then again with the
               inductor cache of the first (TORCHINDUCTOR_CACHE_DIR kept): what a cache across fragments saves.

Also writes the measured costs as rows of a costs file (gpu.costs.csv beside the JSON: model, restart phases,
save, stall), for the simulator; a part that fails is reported and the others run. Results on one H100:
docs/explanation/measurements.md ("On a GPU"). --smoke runs every part with tiny models on whatever device there is (CI
runs it on CPU: tests/e2e/test_gpu_script.py); its numbers mean nothing.
Usage: python benchmarks/gpu.py [--smoke] [--out gpu.json] [--only resnet50,gpt2-medium]
       [--parts throughput,checkpoint,resize,compile]
LAST line: one JSON object (also written to --out).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_models  # noqa: E402
from stop_restart import stop_and_relaunch  # noqa: E402

from parsl_bft.train.checkpoint import (  # noqa: E402
    BackgroundSave,
    CheckpointStore,
    TrainingState,
    load_checkpoint,
)
from parsl_bft.train.config import FragmentFailed  # noqa: E402
from parsl_bft.train.fragment import FragmentConfig  # noqa: E402
from parsl_bft.train.launcher import run_fragment  # noqa: E402

FULL = {"resnet50": dict(batch=256, steps=60, rounds=3), "gpt2-medium": dict(batch=8, steps=30, rounds=2)}
SMOKE = {"resnet-tiny": dict(batch=16, steps=6, rounds=2), "gpt-tiny": dict(batch=8, steps=6, rounds=2)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain(name: str, batch: int, steps: int, device: torch.device, compile_model: bool) -> float:
    """Samples/s of the plain loop (after 5 warm-up steps), the same step and per-step loss read as the fragment."""
    bf16 = device.type == "cuda"
    run, _model, opt = gpu_models.build(name, device, channels_last=True, compile_model=compile_model)
    x, y = gpu_models.SPECS[name].batch(batch, device, channels_last=True)
    for _ in range(gpu_models.WARMUP):
        gpu_models.step(name, run, opt, x, y, bf16).item()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        gpu_models.step(name, run, opt, x, y, bf16).item()
    sync(device)
    return batch * steps / (time.perf_counter() - t)


def release(device: torch.device) -> None:
    """Give this process's cached GPU memory back: the fragments run in other processes on the same GPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fragment_cfg(name: str, batch: int, steps: int, job: Path, device: torch.device, compile_model: bool,
                 total: int | None = None) -> FragmentConfig:
    args = {"model": name, "bf16": device.type == "cuda", "channels_last": True, "compile": compile_model}
    return FragmentConfig(job=name, workload="unused", loop=f"{HERE / 'gpu_models.py'}:train", steps=steps,
                          checkpoint_dir=str(job), global_batch=batch, fsync=False, deterministic=False,
                          workload_args=args, timeout_s=900, total_samples=total)


def in_fragment(name: str, batch: int, steps: int, device: torch.device, compile_model: bool) -> tuple[float, float]:
    """Samples/s inside a fragment: steady (after the warm-up steps, as the plain arm times it) and over its whole
    training time (model build and warm-up included)."""
    with tempfile.TemporaryDirectory(prefix="bft-gpu-") as d:
        res = run_fragment(fragment_cfg(name, batch, steps + gpu_models.WARMUP, Path(d), device, compile_model))
        assert res is not None
        steady = CheckpointStore(d).latest(arrays=False).metrics[-1]["steady_samples_s"]
        return steady, res.throughput


def checkpoint_costs(name: str, device: torch.device, rounds: int) -> dict[str, float]:
    """Save, background-save stall and restore of the model + optimizer state, against torch's (medians)."""
    run, model, opt = gpu_models.build(name, device, channels_last=True, compile_model=False)
    x, y = gpu_models.SPECS[name].batch(2, device, channels_last=True)
    gpu_models.step(name, run, opt, x, y, device.type == "cuda")       # the optimizer has its state
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def ts(step: int) -> TrainingState:           # as the built-in loop saves: the model, and its optimizer apart
        return TrainingState(model=state["model"], optimizer=state["optimizer"], step=step)
    out: dict[str, list[float]] = {k: [] for k in ("hdf5_save_s", "torch_save_s", "stall_s", "blocking_s",
                                                   "hdf5_restore_s", "torch_restore_s")}
    with tempfile.TemporaryDirectory(prefix="bft-gpu-ckpt-") as d:
        store, tpath = CheckpointStore(Path(d) / "h5", keep=2), Path(d) / "t.pt"
        bg = BackgroundSave(lambda st: store.save(st, fsync=True))
        bg.prepare(ts(0))          # its buffers, as a fragment's first save has
        bg.wait()
        for i in range(rounds):
            sync(device)
            # steps only grow, as in training: a save reads and verifies any newer-numbered file it finds
            t = time.perf_counter()
            store.save(ts(3 * i + 1), fsync=False)
            out["hdf5_save_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            torch.save(state, tpath)
            out["torch_save_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            store.save(ts(3 * i + 2), fsync=True)
            out["blocking_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            bg.start(ts(3 * i + 3))
            out["stall_s"].append(time.perf_counter() - t)
            path = bg.wait()                                     # (the write itself overlaps training)
            assert path is not None
            t = time.perf_counter()
            got = load_checkpoint(path, into=model.state_dict(), device=device)    # onto the device, as torch.load
            model.load_state_dict(got.model)
            opt.load_state_dict(got.optimizer or {})
            sync(device)
            out["hdf5_restore_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            loaded = torch.load(tpath, map_location=device)
            model.load_state_dict(loaded["model"])
            opt.load_state_dict(loaded["optimizer"])
            sync(device)
            out["torch_restore_s"].append(time.perf_counter() - t)
            del loaded, got
    m = {k: statistics.median(v) for k, v in out.items()}
    m.update(save_ratio=m["hdf5_save_s"] / m["torch_save_s"], stall_ratio=m["stall_s"] / m["blocking_s"],
             restore_ratio=m["hdf5_restore_s"] / m["torch_restore_s"])
    return m


@contextlib.contextmanager
def ranks_logs_on_failure(job: Path) -> Iterator[None]:
    """A failed fragment's rank logs live in its temporary job directory: print their ends before it goes, and
    what else may say why (exit 255 with no output, seen on an H100 run, is multiprocessing's word for a rank
    whose forkserver stopped answering: is it alive, did the kernel kill something?)."""
    try:
        yield
    except FragmentFailed:
        for log in sorted(job.glob("logs/*.log")):
            print(f"--- {log.name} (last 3000 characters)\n{log.read_text(errors='replace')[-3000:]}", flush=True)
        from multiprocessing import forkserver
        pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
        alive = pid is not None and Path(f"/proc/{pid}").exists()
        memory = [ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith(("MemT", "MemA"))]
        print(f"--- forkserver pid {pid}: {'alive' if alive else 'gone'}; {'; '.join(memory)}", flush=True)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            kernel = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
            print("--- the kernel's last words\n" + "\n".join(kernel.splitlines()[-15:]), flush=True)
        raise


def resize(name: str, batch: int, device: torch.device, compile_model: bool, cache: Path | None) -> dict[str, float]:
    """A stop request to a training fragment, then the next fragment's first finished step, phase by phase."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)} if cache is not None else {}
    with tempfile.TemporaryDirectory(prefix="bft-gpu-resize-") as d, ranks_logs_on_failure(Path(d)):
        r = stop_and_relaunch(
            Path(d), lambda: run_fragment(fragment_cfg(name, batch, None, Path(d), device, compile_model,
                                                       total=batch * 10**9), env=env),
            lambda: run_fragment(fragment_cfg(name, batch, 1, Path(d), device, compile_model), env=env),
            past_step=3, poll_s=0.05)                           # training, past its warm-up
        step_s = CheckpointStore(d).latest(arrays=False).metrics[-1].get("first_step_s", 0.0)
    b = r.next
    launch = r.launch_to_done_s - b.restore_s - b.rendezvous_s - step_s - b.checkpoint_s
    return {"stop_to_saved_and_exited_s": r.stop_to_exited_s, "final_save_s": r.stopped.checkpoint_s,
            "launch_and_exit_s": launch, "restore_s": b.restore_s, "rendezvous_s": b.rendezvous_s,
            "first_step_s": step_s, "total_s": r.total_s}


PARTS = ("throughput", "checkpoint", "resize", "compile")
SUMMARY = {"throughput_ratio": ("throughput_ratio", None), "stall_ratio": ("checkpoint", "stall_ratio"),
           "restore_ratio": ("checkpoint", "restore_ratio"), "resize_s": ("resize", "total_s"),
           "compiled_resize_s": ("resize_compiled", "total_s"),
           "compiled_cached_resize_s": ("resize_compiled_cached", "total_s")}


def measure(name: str, batch: int, steps: int, device: torch.device, parts: set[str], rounds: int) -> dict:
    row: dict = {"model": name, "batch": batch}

    def throughput() -> None:
        row["plain_samples_s"] = plain(name, batch, steps, device, False)
        release(device)                 # its cache would crowd the fragment's process on the same GPU
        row["fragment_samples_s"], row["fragment_whole_samples_s"] = in_fragment(name, batch, steps, device, False)
        row["throughput_ratio"] = row["fragment_samples_s"] / row["plain_samples_s"]
        print(f"{name}: plain {row['plain_samples_s']:.1f}/s, fragment {row['fragment_samples_s']:.1f}/s "
              f"(x{row['throughput_ratio']:.3f}; {row['fragment_whole_samples_s']:.1f}/s over its whole training "
              "time, build and warm-up included)", flush=True)

    def checkpoint() -> None:
        row["checkpoint"] = c = checkpoint_costs(name, device, rounds)
        print(f"{name}: save x{c['save_ratio']:.2f} of torch.save, stall x{c['stall_ratio']:.3f} of a blocking "
              f"save, restore x{c['restore_ratio']:.2f} of torch.load", flush=True)

    def resized() -> None:
        row["resize"] = resize(name, batch, device, False, None)
        print(f"{name}: resize {json.dumps({k: round(v, 3) for k, v in row['resize'].items()})}", flush=True)

    def compiled() -> None:
        with tempfile.TemporaryDirectory(prefix="bft-inductor-") as cache:
            for key in ("resize_compiled", "resize_compiled_cached"):      # the second finds the first's cache
                row[key] = resize(name, batch, device, True, Path(cache))
                print(f"{name}: {key} {json.dumps({k: round(v, 3) for k, v in row[key].items()})}", flush=True)

    for part, run in (("throughput", throughput), ("checkpoint", checkpoint), ("resize", resized),
                      ("compile", compiled)):
        if part in parts:
            try:                # one GPU run is all there may be: a part that fails must not lose the others
                run()
            except Exception as e:
                row[f"{part}_error"] = f"{type(e).__name__}: {e}"
                print(f"{name}: {part} FAILED: {row[f'{part}_error']}", flush=True)
            release(device)             # what the part's models cached, before the next part's processes
    return row


def write_costs(rows: list[dict], path: Path, device: str) -> None:
    """The measured costs, one row per model, for the simulator (what a restart and a save cost here)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "device", "restart_s", "launch_s", "restore_s", "first_step_s", "save_s", "stall_s"])
        for r in rows:
            z = r["resize"]
            w.writerow([r["model"], device, f"{z['total_s']:.3f}", f"{z['launch_and_exit_s']:.3f}",
                        f"{z['restore_s']:.3f}", f"{z['first_step_s']:.3f}", f"{z['final_save_s']:.3f}",
                        f"{r['checkpoint']['stall_s']:.4f}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny models on any device: every part runs, the numbers "
                    "mean nothing")
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--only", help="comma-separated models")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default: all of {','.join(PARTS)}; compile needs a GPU)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        raise SystemExit("gpu.py: no CUDA device here; --smoke runs every part with tiny models on the CPU")
    plan = SMOKE if args.smoke else FULL
    names = args.only.split(",") if args.only else list(plan)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {card}; torch {torch.__version__}; models {names}", flush=True)
    t0 = time.perf_counter()
    parts = set(args.parts.split(","))
    if parts - set(PARTS) or not parts:
        raise SystemExit(f"gpu.py: --parts takes a comma-separated subset of {','.join(PARTS)}, got {args.parts!r}")
    if device.type != "cuda":
        parts.discard("compile")                    # inductor on the CPU needs a C++ toolchain; the GPU's is Triton
    rows = [measure(n, plan[n]["batch"], plan[n]["steps"], device, parts, plan[n]["rounds"]) for n in names]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    costed = [r for r in rows if "checkpoint" in r and "resize" in r]
    if costed:
        write_costs(costed, out.with_name(out.stem + ".costs.csv"), card)
    summary = {"device": card, "torch": torch.__version__, "smoke": args.smoke, "parts": sorted(parts),
               "wall_s": time.perf_counter() - t0}
    for r in rows:                      # the headline figures of the parts that ran
        for key, (part, field) in SUMMARY.items():
            if part in r:
                summary[f"{r['model']}_{key}"] = r[part][field] if field else r[part]
    summary["models"] = rows
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "models"}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
