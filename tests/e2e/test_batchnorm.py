"""BatchNorm under data parallelism: per-rank statistics by default, without the FutureWarning DDP's deprecated
broadcast_buffers=False printed in every rank's log; batch_norm="sync" (SyncBatchNorm) refused on CPU ranks with
a line that says so, and refused at submit when misspelled."""
import pytest

from parsl_bft.execution.training_job import TrainingJob
from parsl_bft.train.fragment import FragmentConfig, FragmentFailed
from parsl_bft.train.launcher import run_fragment

LOOP = '''
import torch
from torch import nn


def train(ctx):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if ctx.restored is not None:
        model.load_state_dict(ctx.restored["model"])
    net = ctx.distributed(model)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
    for idx in ctx.batches(len(x)):
        loss = nn.functional.cross_entropy(net(x[idx]), (x[idx, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss.item())
        if ctx.should_stop():
            break
    ctx.save({"model": model.state_dict()})
'''


def _cfg(tmp_path, **kw):
    (tmp_path / "bn_loop.py").write_text(LOOP)
    return FragmentConfig(job="bn", workload="images", loop=f"{tmp_path / 'bn_loop.py'}:train",
                          checkpoint_dir=str(tmp_path / "job"), world_size=2, global_batch=32, steps=4, fsync=False,
                          timeout_s=60, **kw)


@pytest.mark.slow
def test_per_rank_batchnorm_trains_on_two_ranks_without_a_future_warning(tmp_path):
    r = run_fragment(_cfg(tmp_path))
    assert (r.world_size, r.end_step) == (2, 4)
    logs = list((tmp_path / "job" / "logs").glob("*.log"))
    assert len(logs) == 2
    assert not any("FutureWarning" in f.read_text() or "broadcast_buffers" in f.read_text() for f in logs)


@pytest.mark.slow
def test_sync_batchnorm_on_cpu_ranks_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(FragmentFailed, match=r"WorkloadError: job bn: batch_norm='sync' needs GPU ranks .* use "
                                             r"batch_norm='per-rank'"):
        run_fragment(_cfg(tmp_path, sync_batchnorm=True))


def test_a_misspelled_batch_norm_is_refused_at_submit():
    with pytest.raises(ValueError, match=r"batch_norm is 'per-rank' .* or 'sync' .*got 'synced'"):
        TrainingJob("j", batch_norm="synced").check_workload()
