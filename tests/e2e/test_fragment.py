"""Training fragments on real torch.distributed (gloo on CPU), real HDF5 checkpoints, real signals."""
import contextlib
import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch

from parsl_bft.train.checkpoint import CheckpointStore, load_checkpoint
from parsl_bft.train.fragment import FragmentConfig, FragmentFailed, train_rank
from parsl_bft.train.launcher import run_fragment, run_gang_task, serve_store
from parsl_bft.train.protocol import JobDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import alive, wait_for


def cfg(d, **kw):
    base = dict(job="a", workload="images", checkpoint_dir=str(d), global_batch=32, workload_args={"n": 512},
                fsync=False)
    base.update(kw)
    return FragmentConfig(**base)


def model_of(d):
    return CheckpointStore(d).latest().model


@pytest.mark.slow
def test_two_fragments_equal_one_bit_for_bit_in_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train_rank(cfg(one, steps=12))
    train_rank(cfg(two, steps=6))
    r = train_rank(cfg(two, steps=6))
    assert (r.start_step, r.end_step) == (6, 12)
    a, b = model_of(one), model_of(two)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_fragments_equal_one_bit_for_bit_on_two_ranks(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    run_fragment(cfg(one, steps=8, world_size=2))
    run_fragment(cfg(two, steps=4, world_size=2))
    r = run_fragment(cfg(two, steps=4, world_size=2))
    assert (r.world_size, r.start_step, r.end_step, r.samples_done) == (2, 4, 8, 8 * 32)
    a, b = model_of(one), model_of(two)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_gang_of_node_tasks_trains_exactly_like_one_launcher(tmp_path, monkeypatch):
    """Shares of a fragment placed by an executor (2 ranks on each of 2 'nodes') meet through the caller's
    TCPStore, say where they landed, and train the same steps as one launcher running all 4 ranks."""
    one, gang = tmp_path / "one", tmp_path / "gang"
    run_fragment(cfg(one, steps=6, world_size=4))
    monkeypatch.setenv("PARSL_BFT_NODE", "n7")
    server = serve_store()
    addr = server.address()
    c = cfg(gang, steps=6, world_size=4, ranks_per_node=2, timeout_s=60)
    out = {}

    def share(i):
        try:
            out[i] = run_gang_task(c, i, addr)
        except FragmentFailed as e:
            out[i] = e
    ts = [threading.Thread(target=share, args=(i,)) for i in (1, 0)]      # node 1 first: it waits for node 0
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(isinstance(r, Exception) for r in out.values()), out
    assert out[1] is None and (out[0].world_size, out[0].end_step) == (4, 6)
    assert server.get(f"{c.fragment_id}/node/0") == b"n7"
    a, b = model_of(one), model_of(gang)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_threads_starting_ranks_at_once_each_read_their_own_childs_exit_status():
    """CPython reaps other threads' forkserver children as it starts one; unguarded, a share's claim in a gang
    of two in one process read 255 for a child that exited 0 (CI, stop 45). Each thread's children exit with
    the thread's own status, and each reads exactly that."""
    from parsl_bft.train import launcher
    got: dict[int, list[int]] = {}

    def child_statuses(code):
        got[code] = [launcher._run_child(sys.exit, code) for _ in range(10)]
    ts = [threading.Thread(target=child_statuses, args=(code,)) for code in (0, 3, 5, 7)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == {code: [code] * 10 for code in (0, 3, 5, 7)}


@pytest.mark.slow
def test_a_gang_share_without_its_peers_gives_up_with_a_clear_error(tmp_path):
    server = serve_store()
    with pytest.raises(FragmentFailed, match=r"rank 1 on .* failed first: .*(Timeout|timed out|timeout)"):
        run_gang_task(cfg(tmp_path, steps=1, world_size=2, timeout_s=3), 1, server.address())


@pytest.mark.slow
def test_the_rank_that_failed_first_is_named_with_its_traceback(tmp_path):
    """A rank raising (a user's bug) is reported with its exception and traceback, not a peer's lost connection."""
    f = tmp_path / "bad.py"
    f.write_text("import os\nfrom parsl_bft.train.workloads import SyntheticImages\n"
                 "class Bad(SyntheticImages):\n"
                 "    def loss(self, model, batch):\n"
                 "        if os.environ['RANK'] == '1':\n"
                 "            raise ValueError('broken loss on rank one')\n"
                 "        return super().loss(model, batch)\n")
    with pytest.raises(FragmentFailed) as e:
        run_fragment(cfg(tmp_path / "d", steps=3, world_size=2, workload=f"{f}:Bad", timeout_s=20))
    msg = str(e.value)
    assert "rank 1 on" in msg and "ValueError: broken loss on rank one" in msg and "bad.py" in msg


@pytest.mark.slow
def test_periodic_checkpoints_bound_the_work_a_kill_without_notice_loses(tmp_path):
    """Saves every checkpoint_every_s while training; a rank SIGKILLed mid-fragment (no notice) loses only the
    steps since the newest periodic save, which the next fragment resumes from."""
    d = tmp_path / "d"
    with pytest.raises(FragmentFailed, match="exited with -9"):
        run_fragment(cfg(d, steps=10_000, world_size=2, checkpoint_every_s=0.2, timeout_s=20, keep=1000),
                     env={"PARSL_BFT_FAULT": "rank1:step1000"})
    saved = [int(p.stem.split("-")[1]) for p in CheckpointStore(d).paths()]
    assert len(saved) >= 2 and max(saved) < 1000, saved          # periodic saves, none after the kill
    p = JobDir(d).progress()
    assert p.saved_step == max(saved) and p.step >= p.saved_step
    r = run_fragment(cfg(d, steps=5, world_size=2))
    assert r.start_step == max(saved)


@pytest.mark.slow
def test_world_size_change_continues_the_same_training(tmp_path):
    """2 ranks then 1 rank == 1 rank throughout, up to float summation order (stated tolerance 1e-5)."""
    ref, mixed = tmp_path / "ref", tmp_path / "mixed"
    train_rank(cfg(ref, steps=10))
    run_fragment(cfg(mixed, steps=5, world_size=2))
    train_rank(cfg(mixed, steps=5))
    a, b = model_of(ref), model_of(mixed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    la = [m["loss"] for m in load_checkpoint(CheckpointStore(ref).paths()[0]).metrics]
    lb = [m["loss"] for m in load_checkpoint(CheckpointStore(mixed).paths()[0]).metrics]
    assert [m["world"] for m in load_checkpoint(CheckpointStore(mixed).paths()[0]).metrics] == [2] * 5 + [1] * 5
    assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


@pytest.mark.slow
def test_training_learns(tmp_path):
    r = train_rank(cfg(tmp_path, steps=100, workload_args={"n": 1024}))
    losses = [m["loss"] for m in CheckpointStore(tmp_path).latest().metrics]
    assert r.stopped_by == "steps" and sum(losses[-10:]) / 10 < 0.4 * losses[0]


@pytest.mark.slow
def test_killed_rank_fails_cleanly_and_next_fragment_resumes(tmp_path):
    run_fragment(cfg(tmp_path, steps=3, world_size=2))
    with pytest.raises(FragmentFailed, match="rank 1 exited with -9"):     # the dead rank, not a peer timing out
        run_fragment(cfg(tmp_path, steps=50, world_size=2, timeout_s=20), env={"PARSL_BFT_FAULT": "rank1:step5"})
    assert [p.name for p in CheckpointStore(tmp_path).paths()] == ["ckpt-000000003.h5"]  # nothing half-done
    r = run_fragment(cfg(tmp_path, steps=2, world_size=2))
    assert (r.start_step, r.end_step) == (3, 5)                  # resumed from the last good checkpoint


@pytest.mark.slow
def test_sigusr1_notice_checkpoints_promptly(tmp_path):
    """The launcher forwards a notice (Slurm's --signal) to its ranks; they stop at the same step and save it."""
    sent = {}

    def notice():
        p = wait_for(lambda: (q := JobDir(tmp_path).progress()) and q.step >= 20 and q, 120, what="20 steps trained")
        sent["step"] = p.step
        os.kill(os.getpid(), signal.SIGUSR1)
    threading.Thread(target=notice, daemon=True).start()
    r = run_fragment(cfg(tmp_path, steps=100_000, world_size=2))
    assert r.stopped_by == "signal"            # stopped by the notice, not by its 100,000-step bound
    assert sent["step"] <= r.end_step < 100_000
    assert CheckpointStore(tmp_path).latest().step == r.end_step


@pytest.mark.slow
def test_deadline_and_total_samples_bounds(tmp_path):
    r = train_rank(cfg(tmp_path, total_samples=5 * 32))
    assert r.stopped_by == "done" and r.end_step == 5
    r = train_rank(cfg(tmp_path / "d", deadline_s=3.0))
    assert r.stopped_by == "deadline" and r.end_step > 0


def test_layer_freezing_has_no_gradients_or_optimizer_state(tmp_path):
    train_rank(cfg(tmp_path, steps=3, freeze_layers=2))
    st = CheckpointStore(tmp_path).latest()
    import parsl_bft.train.workloads as w
    fresh = w.SyntheticImages(n=512).build_model().state_dict()
    frozen = [k for k in fresh if k.startswith(("0.", "1."))]
    assert frozen and all(torch.equal(st.model[k], fresh[k]) for k in frozen)     # untouched
    assert any(not torch.equal(st.model[k], fresh[k]) for k in fresh if k.startswith("3."))
    n_trainable = sum(1 for k in fresh if not k.startswith(("0.", "1.")))
    assert len(st.optimizer["state"]) == n_trainable                               # no state for frozen ones


@pytest.mark.slow
def test_language_model_workload(tmp_path):
    r = train_rank(cfg(tmp_path, workload="lm", workload_args={"n_chars": 20_000}, steps=30, global_batch=16))
    losses = [m["loss"] for m in CheckpointStore(tmp_path).latest().metrics]
    assert r.end_step == 30 and losses[-1] < losses[0]


def test_bad_fragment_configs():
    with pytest.raises(ValueError, match="needs a bound"):
        FragmentConfig(job="a", workload="images", checkpoint_dir="/tmp/x")
    with pytest.raises(ValueError, match="global_batch 2 < world_size 4"):
        FragmentConfig(job="a", workload="images", checkpoint_dir="/tmp/x", steps=1, world_size=4, global_batch=2)


def test_workloads_by_name_module_path_and_file(tmp_path):
    from parsl_bft.train.workloads import SyntheticImages, make_workload
    assert isinstance(make_workload("parsl_bft.train.workloads:SyntheticImages", n=8), SyntheticImages)
    f = tmp_path / "mine.py"
    f.write_text("from parsl_bft.train.workloads import TinyLM\nclass Mine(TinyLM):\n    name = 'mine'\n")
    assert make_workload(f"{f}:Mine", n_chars=500).name == "mine"
    with pytest.raises(ValueError, match="cannot load workload"):
        make_workload("no_such_module_xyz:Thing")
    with pytest.raises(ValueError, match="unknown workload 'cnn'"):
        make_workload("cnn")


USER_WORKLOAD = '''
import torch
from torch.utils.data import Dataset
from parsl_bft.train.workloads import SyntheticImages


class Items(Dataset):                      # what a scientist writes: one (x, y) per integer index
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


class MapStyle(SyntheticImages):
    def dataset(self):
        return Items(*super().dataset().tensors)
'''


@pytest.mark.slow
def test_an_ordinary_map_style_dataset_and_a_stated_schedule_train_like_the_built_in(tmp_path):
    """A plain map-style Dataset (``__getitem__(int) -> (x, y)``, collated item by item) trains exactly like the
    same data as a TensorDataset, across two fragments on two ranks; a cosine schedule with warm-up, stated in
    fractions of the run, is resumed where it was and ends at zero."""
    (tmp_path / "user.py").write_text(USER_WORKLOAD)
    args = {"n": 256, "schedule": "cosine", "warmup": 0.25}
    ref, mine = tmp_path / "ref", tmp_path / "mine"
    run_fragment(cfg(ref, steps=8, world_size=2, total_samples=8 * 32, workload_args=args))
    for _ in range(2):
        run_fragment(cfg(mine, steps=4, world_size=2, total_samples=8 * 32, workload="/".join(
            [str(tmp_path), "user.py:MapStyle"]), workload_args=args))
    a, b = model_of(ref), model_of(mine)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sched = CheckpointStore(mine).latest().scheduler
    assert sched["last_epoch"] == 8 and sched["_last_lr"] == [0.0]          # cosine: zero at the end of the run


def test_lr_schedules_are_stated_in_fractions_of_the_run():
    from parsl_bft.train.workloads import lr_schedule

    def lrs(schedule, warmup=0.0, steps=10):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        s = lr_schedule(opt, schedule, steps, warmup)
        if s is None:
            return None
        out = []
        for _ in range(steps):
            out.append(round(opt.param_groups[0]["lr"], 6))
            opt.step()
            s.step()
        return out
    assert lrs(None) is None and lrs("constant") is None                 # no hidden schedule by default
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    by_epochs = lr_schedule(opt, "step:0.1@2e", 10, "1e", steps_per_epoch=3)   # epochs of 3 steps
    seen = []
    for _ in range(10):
        seen.append(round(opt.param_groups[0]["lr"], 6))
        opt.step()
        by_epochs.step()
    assert seen == [round(1 / 3, 6), round(2 / 3, 6), 1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1]
    with pytest.raises(ValueError, match="in epochs"):
        lr_schedule(opt, "step:0.1@2e", 10)
    assert lrs("step:0.1@0.5") == [1.0] * 5 + [0.1] * 5
    assert lrs("linear") == [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    assert lrs("constant", warmup=0.2)[:3] == [0.5, 1.0, 1.0]
    for bad, match in (("cosine:3", "unknown schedule"), ("warm", "unknown schedule"), ("step:x", "step:GAMMA")):
        with pytest.raises(ValueError, match=match):
            lrs(bad)
    with pytest.raises(ValueError, match="give the job its samples"):
        lr_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), "cosine", None)


LOOP = str(Path(__file__).resolve().parents[2] / "workflows" / "digits_loop.py") + ":train"


def loop_cfg(d, **kw):
    return cfg(d, workload="unused", loop=LOOP, global_batch=64, workload_args={}, **kw)


@pytest.mark.slow
def test_a_users_own_training_loop_resumes_exactly_across_fragments_and_world_sizes(tmp_path):
    """workflows/digits_loop.py's train(ctx) (an ordinary PyTorch loop plus ctx calls, a map-style Dataset):
    three fragments on 1, 2 and 1 ranks, stopped by step bounds and by a notice, give the model of one
    uninterrupted run (SGD; world sizes only reorder float additions); the budget ends it as "done"."""
    ref, mine = tmp_path / "ref", tmp_path / "mine"
    total = 30 * 64
    r = run_fragment(loop_cfg(ref, total_samples=total))
    assert (r.end_step, r.stopped_by) == (30, "done")
    r = run_fragment(loop_cfg(mine, steps=10, total_samples=total, checkpoint_every_s=1e-6))   # saves in background
    assert r.periodic_saves >= 1 and load_checkpoint(r.checkpoint).step == 10
    JobDir(mine).request_stop()                              # a notice: stops at its first step
    r = run_fragment(loop_cfg(mine, world_size=2, total_samples=total))
    assert (r.start_step, r.end_step, r.stopped_by) == (10, 11, "signal")
    JobDir(mine).clear_stop()
    run_fragment(loop_cfg(mine, steps=9, world_size=2, total_samples=total))
    r = run_fragment(loop_cfg(mine, total_samples=total))
    assert (r.start_step, r.end_step, r.samples_done, r.stopped_by) == (20, 30, total, "done")
    assert load_checkpoint(r.checkpoint).step == 30
    a, b = CheckpointStore(ref).latest(), CheckpointStore(mine).latest()
    assert (a.step, a.epoch, a.data_position) == (b.step, b.epoch, b.data_position) == (30, 1, 8 * 64)  # 22 a epoch
    diff = max(float((a.model["model"][k] - b.model["model"][k]).abs().max()) for k in a.model["model"])
    assert diff < 1e-4, diff
    assert [m["step"] for m in b.metrics] == list(range(1, 31)) and {m["world"] for m in b.metrics} == {1, 2}


@pytest.mark.slow
def test_a_training_loop_that_forgets_to_save_fails_with_what_to_do(tmp_path):
    (tmp_path / "bad.py").write_text(
        "def train(ctx):\n"
        "    for idx in ctx.batches(256):\n"
        "        if ctx.should_stop():\n"
        "            break\n")
    with pytest.raises(FragmentFailed, match=r"call ctx.save\(state\) before returning"):
        run_fragment(cfg(tmp_path / "j", loop=f"{tmp_path / 'bad.py'}:train", steps=3))
    with pytest.raises(ValueError, match="cannot load training function"):
        train_rank(cfg(tmp_path / "k", loop=f"{tmp_path / 'bad.py'}:nope", steps=3))


@pytest.mark.slow
def test_a_loop_may_let_go_of_what_was_restored(tmp_path):
    """``ctx.restored = None`` frees the restored state (on a GPU rank it sits in GPU memory); a save at the
    restored step still writes nothing, and the next one is written as usual."""
    (tmp_path / "loop.py").write_text(
        "import torch\n"
        "def train(ctx):\n"
        "    w = ctx.restored['w'] if ctx.restored is not None else torch.zeros(3)\n"
        "    ctx.restored = None\n"
        "    ctx.save({'w': w})\n"
        "    for _ in ctx.batches(256):\n"
        "        w = w + 1\n"
        "        if ctx.should_stop():\n"
        "            break\n"
        "    ctx.save({'w': w})\n")
    c = cfg(tmp_path / "j", workload="unused", loop=f"{tmp_path / 'loop.py'}:train", steps=2, workload_args={})
    train_rank(c)
    first = CheckpointStore(tmp_path / "j").paths()[0]               # step 2
    before = first.stat().st_mtime_ns, first.stat().st_ino
    r = train_rank(c)
    assert (r.start_step, r.end_step) == (2, 4)
    assert (first.stat().st_mtime_ns, first.stat().st_ino) == before, "the restored checkpoint was written again"
    assert torch.equal(CheckpointStore(tmp_path / "j").latest().model["w"], torch.full((3,), 4.0))


@pytest.mark.slow
def test_a_failed_ranks_whole_traceback_and_output_reach_the_error_and_stay_on_disk(tmp_path):
    (tmp_path / "user.py").write_text(
        "def check(lr):\n"
        "    raise ValueError(f'lr {lr} is too large')\n"
        "def train(ctx):\n"
        "    print(f'hello from rank {ctx.rank}', flush=True)\n"
        "    if ctx.rank == 1:\n"
        "        check(10.0)\n"
        "    for idx in ctx.batches(256):\n"
        "        if ctx.should_stop():\n"
        "            break\n"
        "    ctx.save({'w': idx})\n")
    d = tmp_path / "j"
    with pytest.raises(FragmentFailed) as e:
        run_fragment(cfg(d, loop=f"{tmp_path / 'user.py'}:train", steps=3, world_size=2, timeout_s=10))
    msg = str(e.value)
    assert "ValueError: lr 10.0 is too large" in msg and "in check" in msg and "in train" in msg   # whole traceback
    log = Path(msg.rsplit("output: ", 1)[1].rstrip(")"))
    assert log.parent == d / "logs" and "hello from rank 1" in log.read_text()
    # each line the rank printed begins with its time
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d hello from rank 1$", log.read_text(), re.M), log.read_text()
    run_fragment(cfg(d, loop=f"{tmp_path / 'user.py'}:train", steps=3))      # a good fragment's output stays too
    assert any("hello from rank 0" in f.read_text() for f in (d / "logs").glob("*-rank0.log"))


HOOKED = """
import torch
from parsl_bft.train.workloads import SyntheticImages

class Hooked(SyntheticImages):
    def evaluate(self, model):
        assert not model.training and not torch.is_grad_enabled()
        x, y = self.dataset()[:64]
        return {"accuracy": (model(x).argmax(1) == y).float().mean()}

    def log(self, metrics):
        print("metrics", metrics, flush=True)
"""


@pytest.mark.slow
def test_a_workloads_evaluate_and_log_hooks_run_on_rank_0_and_their_metrics_are_kept(tmp_path):
    (tmp_path / "hooked.py").write_text(HOOKED)
    d = tmp_path / "j"
    r = run_fragment(cfg(d, workload=f"{tmp_path / 'hooked.py'}:Hooked", steps=4, world_size=2,
                         workload_args={"n": 256, "eval_every": 2}))
    metrics = load_checkpoint(r.checkpoint).metrics
    assert [("accuracy" in m) for m in metrics] == [False, True, False, True]
    assert all(0 <= m["accuracy"] <= 1 for m in metrics if "accuracy" in m)
    log = next((d / "logs").glob("*-rank0.log")).read_text()
    assert log.count("metrics {") == 4 and "'accuracy'" in log
    assert "metrics" not in next((d / "logs").glob("*-rank1.log")).read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_die_with_the_worker_that_launched_them(tmp_path):
    """A pilot's worker pool that exits (its interchange gone) or is SIGKILLed takes its ranks along: the
    forkserver exits with the worker and the kernel kills what it forked (no orphan trains on, unseen)."""
    import subprocess

    from harness import live_ranks
    d = tmp_path / "d"
    code = ("import sys; from parsl_bft.train.fragment import FragmentConfig; "
            "from parsl_bft.train.launcher import run_fragment; "
            f"run_fragment(FragmentConfig(job='a', workload='images', checkpoint_dir={str(d)!r}, global_batch=32, "
            "workload_args={'n': 512}, fsync=False, steps=10_000_000, world_size=2, timeout_s=20))")
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        ranks = wait_for(lambda: len(live_ranks(tmp_path)) == 2 and JobDir(d).progress() and live_ranks(tmp_path),
                         120, what="two ranks training")
        worker.kill()
        worker.wait()
        assert wait_for(lambda: not live_ranks(tmp_path), 60, or_none=True) is not None, \
            f"ranks {ranks} outlived their worker"
    finally:
        worker.kill()
        for p in live_ranks(tmp_path):
            os.kill(p, signal.SIGKILL)


@pytest.mark.slow
def test_a_fragment_given_up_for_lost_may_not_save_once_the_job_runs_as_another(tmp_path):
    """The orchestrator names the fragment that runs the job (JobDir.run_fragment) before it launches it: an
    older one of the same orchestrator life - given up for lost while a rank of it still ran - saves nothing."""
    d = tmp_path / "d"
    run_fragment(cfg(d, steps=2, world_size=1, generation="g1", fragment_id="a-old"))
    JobDir(d).run_fragment("a-new")
    with pytest.raises(FragmentFailed, match="fragment a-old of a is stale \\(the job runs as a-new now\\)"):
        run_fragment(cfg(d, steps=2, world_size=1, generation="g1", fragment_id="a-old"))
    assert [p.name for p in CheckpointStore(d).paths()] == ["ckpt-000000002.h5"]
    assert run_fragment(cfg(d, steps=2, world_size=1, generation="g1", fragment_id="a-new")).end_step == 4


@pytest.mark.slow
@pytest.mark.timeout(300)      # a fence that fails would train 10,000,000 steps
def test_a_fenced_off_fragment_stops_training_at_its_next_progress_report(tmp_path):
    """Given up for lost while its ranks still ran (a network split from its worker pool), a fragment learns at
    its next progress report that the job runs as another one, and stops instead of training on for nobody."""
    d = tmp_path / "d"
    JobDir(d).ensure().run_fragment("a-old")

    def give_up():
        wait_for(lambda: (q := JobDir(d).progress()) and q.step >= 5, 120, what="5 steps trained")
        JobDir(d).run_fragment("a-new")
    threading.Thread(target=give_up, daemon=True).start()
    with pytest.raises(FragmentFailed, match="fragment a-old of a is stale \\(the job runs as a-new now\\): stopping"):
        run_fragment(cfg(d, steps=10_000_000, world_size=2, generation="g1", fragment_id="a-old", timeout_s=20))


DATALOADER_LOOP = '''
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):                 # defined in the loop file: the workers must import it by name
    def __len__(self):
        return 512

    def __getitem__(self, i):
        x = torch.tensor([float(i) / 512])
        return x, x * x


def train(ctx):
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if ctx.restored is not None:
        model.load_state_dict(ctx.restored["model"])
        opt.load_state_dict(ctx.restored["optimizer"])
    data = Squares()
    loader = DataLoader(data, batch_sampler=ctx.batches(len(data)), num_workers=2, prefetch_factor=4)
    for x, y in loader:                 # the workers fetch up to 8 batches ahead of the steps
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss.item())
        if ctx.should_stop():
            break
    ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})
'''


@pytest.mark.slow
def test_a_dataloader_with_workers_in_your_own_loop_resumes_exactly(tmp_path):
    """DataLoader(num_workers=2) over ctx.batches(), its Dataset defined in the loop file: the workers find the
    class (the file is imported under its own name), and the batches they prefetched but the loop never trained
    are not skipped on resume: two fragments of 20 steps equal one of 40, bit for bit (over an epoch boundary:
    512 items, 16 a step)."""
    (tmp_path / "dl_loop.py").write_text(DATALOADER_LOOP)

    def frag(d, steps):
        run_fragment(FragmentConfig(job="dl", workload="unused", loop=f"{tmp_path / 'dl_loop.py'}:train", steps=steps,
                                    checkpoint_dir=str(tmp_path / d), global_batch=16, fsync=False, timeout_s=300))
    frag("two", 20)
    frag("two", 20)
    frag("one", 40)
    a, b = CheckpointStore(tmp_path / "two").latest(), CheckpointStore(tmp_path / "one").latest()
    assert a.step == b.step == 40 and a.data_position == b.data_position and a.epoch == b.epoch == 1
    for k in b.model["model"]:
        assert torch.equal(a.model["model"][k], b.model["model"][k]), k


@pytest.mark.slow
def test_a_rank_printing_without_end_does_not_fill_the_disk(tmp_path, monkeypatch):
    """A loop printing 2 MB a step (20 MB in all), each step waiting until its log is cut back: the cap
    (PARSL_BFT_RANK_LOG_MAX, 64 MiB by default) cuts it once a second, under a note, and the training is not
    disturbed (a loop the cap never reached would wait out its deadline and fail the size check)."""
    monkeypatch.setenv("PARSL_BFT_RANK_LOG_MAX", "100000")
    (tmp_path / "chatty.py").write_text(
        "import os, sys, time\n"
        "def train(ctx):\n"
        "    for idx in ctx.batches(256):\n"
        "        sys.stdout.write(('x' * 99 + '\\n') * 20_000)\n"
        "        sys.stdout.flush()\n"
        "        deadline = time.monotonic() + 120\n"           # the cap cuts the log back (a condition, not a pause)
        "        while os.fstat(1).st_size > 200_000 and time.monotonic() < deadline:\n"
        "            time.sleep(0.05)\n"
        "        if ctx.should_stop():\n"
        "            break\n"
        "    ctx.save({'step': ctx.step})\n")
    run_fragment(FragmentConfig(job="c", workload="unused", loop=f"{tmp_path / 'chatty.py'}:train", steps=10,
                                checkpoint_dir=str(tmp_path / "j"), global_batch=32, fsync=False, timeout_s=300))
    (log,) = (tmp_path / "j" / "logs").glob("*")
    text = log.read_text()
    assert "output beyond 100,000 bytes dropped" in text and log.stat().st_size < 8_000_000
    assert CheckpointStore(tmp_path / "j").latest().step == 10


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds processes through /proc")
def test_what_a_loop_starts_in_a_session_of_its_own_ends_with_its_fragment(tmp_path):
    """A loop that starts a helper in a session of its own (setsid) and a daemon whose parent exits at once:
    neither outlives the fragment (each carries the mark every process a rank starts inherits). Nor does such a
    daemon started with an environment of its own (no mark; it outlived the run): the rank adopts orphans."""
    (tmp_path / "spawner.py").write_text(
        "import subprocess, sys\n"
        "def train(ctx):\n"
        "    sleeper = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "    helper = subprocess.Popen(sleeper, start_new_session=True)\n"
        "    quiet = 'stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL'\n"
        "    daemon = subprocess.run([sys.executable, '-c', 'import os, subprocess, sys; os.setsid(); '\n"
        "                             f'print(subprocess.Popen(sys.argv[1:], {quiet}).pid)', *sleeper],\n"
        "                            capture_output=True, text=True, check=True).stdout\n"
        "    bare = subprocess.run([sys.executable, '-c', 'import os, subprocess, sys; os.setsid(); '\n"
        "                           f'print(subprocess.Popen(sys.argv[1:], {quiet}).pid)', *sleeper],\n"
        "                          capture_output=True, text=True, check=True, env={}).stdout\n"
        "    open(ctx.args['pids'], 'w').write(f'{helper.pid} {daemon} {bare}')\n"
        "    for idx in ctx.batches(256):\n"
        "        if ctx.should_stop():\n"
        "            break\n"
        "    ctx.save({'step': ctx.step})\n")
    pids_file = tmp_path / "pids"
    run_fragment(cfg(tmp_path / "j", loop=f"{tmp_path / 'spawner.py'}:train", steps=3,
                     workload_args={"pids": str(pids_file)}))
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        assert len(pids) == 3
        wait_for(lambda: not any(map(alive, pids)), timeout=30, what="the loop's helpers end with the fragment")
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
