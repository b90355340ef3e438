"""The built-in loop at other precisions, compiled, channels-last and in micro-batches, on CPU (the code paths a
GPU takes): bf16 and fp16 autocast resume bit for bit across fragments, fp16's GradScaler state goes on across
them, a compiled model's checkpoints are the plain model's, and micro-batches accumulate to the same step."""
import pytest
import torch

from parsl_bft.train.checkpoint import CheckpointStore
from parsl_bft.train.config import FragmentConfig, Precision
from parsl_bft.train.fragment import train_rank


def cfg(d, **kw):
    base = dict(job="a", workload="images", checkpoint_dir=str(d), global_batch=16, workload_args={"n": 256},
                fsync=False)
    base.update(kw)
    return FragmentConfig(**base)


def latest(d):
    return CheckpointStore(d).latest()


def same_weights(a, b):
    assert sorted(a) == sorted(b)
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP16])
def test_autocast_fragments_resume_bit_for_bit(tmp_path, precision):
    one, two = tmp_path / "one", tmp_path / "two"
    train_rank(cfg(one, steps=8, precision=precision))
    train_rank(cfg(two, steps=4, precision=precision))
    r = train_rank(cfg(two, steps=4, precision=precision))
    assert (r.start_step, r.end_step) == (4, 8)
    a, b = latest(one), latest(two)
    assert same_weights(a.model, b.model)
    assert all(v.dtype == torch.float32 for v in b.model.values() if v.is_floating_point())  # weights stay fp32
    # autocast really ran: the fp32 run takes other values
    fp32 = tmp_path / "fp32"
    train_rank(cfg(fp32, steps=8))
    assert not same_weights(a.model, latest(fp32).model)


def test_the_grad_scaler_state_goes_on_across_fragments(tmp_path):
    train_rank(cfg(tmp_path, steps=3, precision="fp16"))         # the plain value, as JSON carries it
    first = latest(tmp_path).extra["grad_scaler"]
    train_rank(cfg(tmp_path, steps=3, precision="fp16"))
    second = latest(tmp_path).extra["grad_scaler"]
    # a fresh scaler would count steps without overflow from 0 again: 3, not 6
    assert (first["_growth_tracker"], second["_growth_tracker"]) == (3, 6)
    assert second["scale"] == first["scale"] > 1
    # a bf16 or fp32 run has no scaler and saves none
    train_rank(cfg(tmp_path / "bf16", steps=2, precision="bf16"))
    assert "grad_scaler" not in latest(tmp_path / "bf16").extra


def test_a_precision_that_does_not_exist_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, got 'fp8'"):
        cfg(tmp_path, steps=1, precision="fp8")
    assert FragmentConfig.from_json(cfg(tmp_path, steps=1, precision="bf16").to_json()).precision is Precision.BF16


def test_channels_last_trains_and_resumes_from_a_contiguous_checkpoint(tmp_path):
    train_rank(cfg(tmp_path, steps=3))
    r = train_rank(cfg(tmp_path, steps=3, channels_last=True))
    assert (r.start_step, r.end_step) == (3, 6)
    plain = tmp_path / "plain"
    train_rank(cfg(plain, steps=6))
    a, b = latest(plain).model, latest(tmp_path).model
    assert sorted(a) == sorted(b)
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)   # the same training; kernels sum in another order


@pytest.mark.slow
def test_a_compiled_model_checkpoints_like_the_plain_one(tmp_path):
    """Compiled (aot_eager: dynamo's graph capture without a C++ toolchain; inductor is the default) for half the
    steps, plain for the rest: the same keys and, here, the same weights as a plain run."""
    train_rank(cfg(tmp_path, steps=4, compile="aot_eager"))
    assert not any("_orig_mod" in k for k in latest(tmp_path).model)
    r = train_rank(cfg(tmp_path, steps=4))
    assert (r.start_step, r.end_step) == (4, 8)
    plain = tmp_path / "plain"
    train_rank(cfg(plain, steps=8))
    assert same_weights(latest(plain).model, latest(tmp_path).model)


def test_micro_batches_accumulate_to_the_same_step(tmp_path):
    """A batch that does not fit is computed in micro-batches, gradients accumulated: the same training, up to
    the order of floating-point additions."""
    whole, micro = tmp_path / "whole", tmp_path / "micro"
    train_rank(cfg(whole, steps=4))
    train_rank(cfg(micro, steps=4, micro_batch=4))
    a, b = latest(whole).model, latest(micro).model
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
