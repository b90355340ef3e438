"""keep_best: the checkpoint best by a named metric stays as best.h5, written at the step the metric was measured
(a metric belongs to the weights of its step), across fragments and past retention."""
import json

import pytest

from parsl_bft.errors import BadValue
from parsl_bft.execution.training_job import TrainingJob
from parsl_bft.train.best import BEST, BestRule, read_best
from parsl_bft.train.checkpoint import CheckpointStore, load_checkpoint
from parsl_bft.train.fragment import FragmentConfig, train_rank

# evaluate() answers from a list, one value per call: steps 2, 4, 6, 8 (eval_every=2) get these
EVALUATED = '''
import json, os
from parsl_bft.train.workloads import SyntheticImages


class Scored(SyntheticImages):
    def evaluate(self, model):
        path = os.environ["SCORES"]
        scores = json.loads(open(path).read())
        open(path, "w").write(json.dumps(scores[1:]))
        return {"val_loss": scores[0], "other": 1.0}
'''

LOOP = '''
import torch
from torch import nn


def train(ctx):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    for idx in ctx.batches(len(x)):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = {"acc": {2: 0.5, 3: 0.9}[ctx.step + 1]} if ctx.step + 1 in (2, 3) else {}
        ctx.report(loss=loss.item(), **acc)
        if ctx.should_stop():
            break
        ctx.save({"model": model.state_dict()})         # every step: only those with "acc" are candidates
    ctx.save({"model": model.state_dict()})
'''


@pytest.mark.parametrize("spec, rule", [("val_loss", BestRule("val_loss")), ("min:val_loss", BestRule("val_loss")),
                                        ("max:acc", BestRule("acc", higher=True)), ("a:b:max", None),
                                        ("avg:x", None), ("max:", None), ("", None), (" x", None), (3, None)])
def test_a_rule_is_a_metric_with_an_optional_direction(spec, rule):
    if rule is None:
        with pytest.raises(BadValue, match="keep_best"):
            BestRule.parse(spec)
    else:
        assert BestRule.parse(spec) == rule


def test_a_job_with_a_bad_rule_is_refused_at_submit():
    with pytest.raises(BadValue, match="job 'j': keep_best 'avg:loss'"):
        TrainingJob("j", keep_best="avg:loss").check_workload()


def _scored(tmp_path, scores, monkeypatch):
    (tmp_path / "scored.py").write_text(EVALUATED)
    (tmp_path / "scores.json").write_text(json.dumps(scores))
    monkeypatch.setenv("SCORES", str(tmp_path / "scores.json"))
    return f"{tmp_path / 'scored.py'}:Scored"


def _cfg(d, **kw):
    base = dict(job="a", checkpoint_dir=str(d), global_batch=16, fsync=False, keep=1)
    return FragmentConfig(**{**base, **kw})


def test_the_built_in_loop_keeps_the_checkpoint_of_its_best_evaluation(tmp_path, monkeypatch):
    """Evaluations at steps 2, 4, 6, 8 score 0.9, 0.5, 0.7, 0.6: best.h5 is the checkpoint of step 4, though
    retention (keep=1) deleted it, and a second fragment whose evaluations are worse leaves it."""
    wl = _scored(tmp_path, [0.9, 0.5, 0.7, 0.6, 0.8, 0.55], monkeypatch)
    job = tmp_path / "job"
    train_rank(_cfg(job, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=8, keep_best="val_loss"))
    assert read_best(job) == {"metric": "val_loss", "value": 0.5, "step": 4, "higher": False,
                              "from": "ckpt-000000004.h5"}
    assert sorted(p.name for p in job.glob("ckpt-*.h5")) == ["ckpt-000000008.h5"]
    best = load_checkpoint(job / BEST)
    assert best.step == 4 and best.metrics[-1]["step"] == 4 and best.metrics[-1]["val_loss"] == 0.5
    train_rank(_cfg(job, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=4, keep_best="val_loss"))
    assert read_best(job)["step"] == 4 and load_checkpoint(job / BEST).step == 4      # 0.8, 0.55: not better
    assert CheckpointStore(job).newest_step() == 12


def test_without_keep_best_nothing_is_kept_and_no_extra_save_is_made(tmp_path, monkeypatch):
    wl = _scored(tmp_path, [0.9, 0.5, 0.7, 0.6], monkeypatch)
    job = tmp_path / "job"
    res = train_rank(_cfg(job, workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=8))
    assert read_best(job) is None and not (job / BEST).exists() and res.periodic_saves == 0


def test_a_users_loop_keeps_its_best_save_among_those_at_a_step_it_reported_the_metric(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    job = tmp_path / "job"
    train_rank(_cfg(job, workload="images", loop=f"{tmp_path / 'loop.py'}:train", steps=5, keep_best="max:acc"))
    assert read_best(job) == {"metric": "acc", "value": 0.9, "step": 3, "higher": True, "from": "ckpt-000000003.h5"}
    assert load_checkpoint(job / BEST).step == 3


def test_parsl_bft_metrics_names_the_kept_best_checkpoint(tmp_path, monkeypatch, capsys):
    from parsl_bft.cli import main
    from parsl_bft.execution.jobstore import JobStore

    state = tmp_path / "state"
    wl = _scored(tmp_path, [0.9, 0.5], monkeypatch)
    train_rank(_cfg(state / "jobs" / "j", workload=wl, workload_args={"n": 64, "eval_every": 2}, steps=4,
                    keep_best="val_loss"))
    db = JobStore(state / "state.sqlite")
    db.add("j", {"name": "j", "samples": 100})
    db.close()
    assert main(["metrics", str(state)]) == 0
    assert f"best by val_loss (lowest): 0.5 at step 4: {state / 'jobs' / 'j' / BEST}" in capsys.readouterr().out
