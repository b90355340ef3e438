"""A job's metrics.csv: what the loop records per step (loss, ctx.report(), evaluate()) is appended by rank 0
beside the checkpoints, one row per step across fragments and resumes, and `parsl-bft metrics` shows it."""
import csv

import pytest

from parsl_bft.train.fragment import FragmentConfig, train_rank
from parsl_bft.train.metrics import MetricsLog, read_metrics

EVAL_MODEL = '''
from parsl_bft.train.workloads import SyntheticImages


class Evaluated(SyntheticImages):
    def evaluate(self, model):
        return {"held_out": 0.5}
'''

LOOP = '''
import torch
from torch import nn


def train(ctx):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if ctx.restored is not None:
        model.load_state_dict(ctx.restored["model"])
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    for idx in ctx.batches(len(x)):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        extra = {"accuracy": 0.25} if (ctx.step + 1) % 3 == 0 else {}      # an evaluation every third step
        ctx.report(loss=loss.item(), **extra)
        if ctx.should_stop():
            break
    ctx.save({"model": model.state_dict()})
'''


def _cfg(d, **kw):
    base = dict(job="a", workload="images", checkpoint_dir=str(d), global_batch=16, workload_args={"n": 64},
                fsync=False)
    return FragmentConfig(**{**base, **kw})


def _rows(d):
    with open(d / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_built_in_loop_writes_one_row_per_step_across_fragments_with_its_evaluations(tmp_path):
    (tmp_path / "evaluated.py").write_text(EVAL_MODEL)
    wl = f"{tmp_path / 'evaluated.py'}:Evaluated"
    one, two = tmp_path / "one", tmp_path / "two"
    train_rank(_cfg(one, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=6))
    train_rank(_cfg(two, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=3))
    train_rank(_cfg(two, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=3))
    rows = _rows(two)
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert list(rows[0]) == ["step", "loss", "world", "held_out"]
    assert [r["held_out"] for r in rows] == ["", "0.5", "", "0.5", "", "0.5"]
    assert rows == _rows(one)                     # two fragments: the same history, to the digit, as one


def test_a_resumed_fragment_drops_the_rows_its_predecessor_wrote_past_the_last_save(tmp_path):
    """A fragment trained past its last save and died: those steps are trained again from the save, and the
    file keeps each step once, with the rows of the steps as they were trained again."""
    ref, d = tmp_path / "ref", tmp_path / "d"
    train_rank(_cfg(ref, steps=6))
    train_rank(_cfg(d, steps=3))
    with open(d / "metrics.csv", "a", newline="") as f:              # the dead fragment's steps 4 and 5
        csv.writer(f).writerows([["4", "99", "1"], ["5", "99", "1"]])
    train_rank(_cfg(d, steps=3))
    assert [r["step"] for r in _rows(d)] == ["1", "2", "3", "4", "5", "6"]
    assert _rows(d) == _rows(ref)


def test_a_lost_file_is_rebuilt_from_the_checkpoint_s_history(tmp_path):
    train_rank(_cfg(tmp_path, steps=3))
    first = _rows(tmp_path)
    (tmp_path / "metrics.csv").unlink()
    train_rank(_cfg(tmp_path, steps=2))
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5"] and rows[:3] == first


def test_a_users_own_loop_gets_its_reported_metrics_in_the_file(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    d = tmp_path / "job"
    loop = f"{tmp_path / 'loop.py'}:train"
    train_rank(_cfg(d, loop=loop, workload_args={}, steps=4))
    train_rank(_cfg(d, loop=loop, workload_args={}, steps=4))
    rows = _rows(d)
    assert [r["step"] for r in rows] == [str(s) for s in range(1, 9)]
    assert list(rows[0]) == ["step", "loss", "world", "accuracy"]      # a key first reported later widens it
    assert [r["step"] for r in rows if r["accuracy"]] == ["3", "6"]
    assert all(float(r["loss"]) > 0 for r in rows)


def test_the_log_keeps_each_step_once_and_widens_its_header(tmp_path):
    log = MetricsLog(tmp_path / "metrics.csv")
    log.resume(0, [])
    log.append([{"step": 1, "loss": 0.5, "world": 2}])
    log.append([{"step": 2, "loss": 0.25, "world": 2, "acc": 0.75}])
    again = MetricsLog(tmp_path / "metrics.csv")
    again.resume(1, [{"step": 1, "loss": 9.0, "world": 2}])          # the file's own row wins over history
    again.append([{"step": 2, "loss": 0.125, "world": 1}])
    columns, rows = read_metrics(tmp_path / "metrics.csv")
    assert columns == ["step", "loss", "world", "acc"]
    assert rows == [{"step": 1, "loss": 0.5, "world": 2}, {"step": 2, "loss": 0.125, "world": 1}]


def test_parsl_bft_metrics_prints_a_table_csv_and_a_plot(tmp_path, capsys):
    from parsl_bft.cli import main
    from parsl_bft.execution.jobstore import JobStore

    state = tmp_path / "state"
    jobdir = state / "jobs" / "j"
    jobdir.mkdir(parents=True)
    db = JobStore(state / "state.sqlite")
    db.add("j", {"name": "j", "samples": 100})
    db.close()
    assert main(["metrics", str(state)]) == 2
    assert "job 'j' has no metrics yet" in capsys.readouterr().err
    log = MetricsLog(jobdir / "metrics.csv")
    log.resume(0, [])
    log.append([{"step": s, "loss": 1.0 / s, "world": 1, **({"acc": s / 10} if s % 5 == 0 else {})}
                for s in range(1, 31)])
    assert main(["metrics", str(state), "j", "--last", "3"]) == 0
    out = capsys.readouterr().out
    assert "metrics of job j" in out and "the last 3 of 30 steps" in out and "0.033333" in out and "3" in out
    assert main(["metrics", str(state), "--csv"]) == 0
    assert capsys.readouterr().out == (jobdir / "metrics.csv").read_text()
    assert main(["metrics", str(state), "--plot", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["metrics", str(state), "other"]) == 2
    assert "has no job 'other'; its jobs: j" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["-1"])
def test_metrics_refuses_a_negative_last(tmp_path, bad, capsys):
    from parsl_bft.cli import main
    assert main(["metrics", str(tmp_path), "--last", bad]) == 2
    assert "--last must be >= 0" in capsys.readouterr().err


def test_metrics_export_to_tensorboard_each_step_once(tmp_path, capsys):
    """`--tensorboard DIR`: TensorBoard event files in DIR/<job>, from metrics.csv (each step once, resumed
    fragments included); a second export replaces the first, it does not add to it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from parsl_bft.cli import main
    from parsl_bft.execution.jobstore import JobStore

    state = tmp_path / "state"
    (state / "jobs" / "j").mkdir(parents=True)
    db = JobStore(state / "state.sqlite")
    db.add("j", {"name": "j", "samples": 100})
    db.close()
    log = MetricsLog(state / "jobs" / "j" / "metrics.csv")
    log.resume(0, [])
    log.append([{"step": s, "loss": 1.0 / s, "world": 2, **({"acc": s / 10} if s % 2 == 0 else {})}
                for s in range(1, 5)])
    for _ in range(2):
        assert main(["metrics", str(state), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert f"wrote {tmp_path / 'tb' / 'j'}" in capsys.readouterr().err
    assert len(list((tmp_path / "tb" / "j").glob("events.out.tfevents.*"))) == 1
    ea = EventAccumulator(str(tmp_path / "tb" / "j"))
    ea.Reload()
    assert sorted(ea.Tags()["scalars"]) == ["acc", "loss", "world"]
    assert [(e.step, round(e.value, 6)) for e in ea.Scalars("loss")] == [(1, 1.0), (2, 0.5), (3, 0.333333),
                                                                         (4, 0.25)]
    assert [(e.step, round(e.value, 6)) for e in ea.Scalars("acc")] == [(2, 0.2), (4, 0.4)]
