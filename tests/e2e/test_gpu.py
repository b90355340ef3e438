"""On a CUDA GPU, through the real launcher (ranks are fresh processes, as on a node): a fragment resumes bit for
bit at every precision with deterministic settings the runtime makes itself (CUBLAS_WORKSPACE_CONFIG included),
`backend="auto"` picks the GPU, a torch.compile'd (inductor) fragment resumes a plain one's checkpoint, a
checkpoint restores into a model that lives on the GPU, and the main-script preload is skipped on a GPU node.

CI has no GPU: every test here is skipped there, loudly. Run them on a GPU node with
``pytest -m "" tests/e2e/test_gpu.py tests/unit/test_checkpoint.py -k "gpu or GPU"``."""
import os

import h5py
import pytest
import torch

from parsl_bft.train.checkpoint import CheckpointError, CheckpointStore, TrainingState, load_checkpoint, save_checkpoint
from parsl_bft.train.config import FragmentConfig, Precision
from parsl_bft.train.launcher import run_fragment
from parsl_bft.train.rank_preload import _gpu_node
from parsl_bft.train.workloads import SyntheticImages

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="NOT RUN: needs a CUDA GPU (CI has none; run on a GPU node)")]


def cfg(d, **kw) -> FragmentConfig:
    base = dict(job="g", workload="images", checkpoint_dir=str(d), global_batch=32, workload_args={"n": 512},
                fsync=False, timeout_s=300)
    base.update(kw)
    return FragmentConfig(**base)


def weights(d) -> dict[str, torch.Tensor]:
    return CheckpointStore(d).latest().model


def same(a, b) -> bool:
    assert sorted(a) == sorted(b)
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("precision,channels_last", [(Precision.FP32, False), (Precision.BF16, True),
                                                      (Precision.FP16, False)])
def test_a_gpu_fragment_resumes_bit_for_bit(tmp_path, monkeypatch, precision, channels_last):
    """8 steps on the GPU in one fragment (backend nccl: the rank must take the GPU) equal 4 + 4 in two fragments
    with backend auto; deterministic cuBLAS would refuse to run without a workspace setting, which the user
    did not give here: the runtime sets it."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    one, two = tmp_path / "one", tmp_path / "two"
    kw = dict(precision=precision, channels_last=channels_last)
    assert run_fragment(cfg(one, steps=8, backend="nccl", **kw)).end_step == 8
    run_fragment(cfg(two, steps=4, **kw))
    r = run_fragment(cfg(two, steps=4, **kw))
    assert (r.start_step, r.end_step) == (4, 8)
    assert same(weights(one), weights(two)), "a resumed GPU fragment diverged from the uninterrupted one"
    if precision is Precision.FP16:          # the GradScaler's state went on across the two fragments
        assert CheckpointStore(two).latest().extra["grad_scaler"]["_growth_tracker"] == 8
    cpu = tmp_path / "cpu"
    run_fragment(cfg(cpu, steps=8, backend="gloo", **kw))
    assert not same(weights(one), weights(cpu)), "auto and nccl ran on the CPU, not the GPU"


def test_a_compiled_gpu_fragment_resumes_a_plain_checkpoint(tmp_path):
    """Plain for 4 steps, torch.compile (inductor, Triton kernels) for 4: the plain model's keys, and close to a
    plain 8-step run (the compiled kernels sum in another order)."""
    run_fragment(cfg(tmp_path, steps=4))
    r = run_fragment(cfg(tmp_path, steps=4, compile="inductor"))
    assert (r.start_step, r.end_step) == (4, 8)
    got = weights(tmp_path)
    assert not any("_orig_mod" in k for k in got)
    plain = tmp_path / "plain"
    run_fragment(cfg(plain, steps=8))
    want = weights(plain)
    assert all(torch.allclose(got[k], want[k], atol=1e-3, rtol=1e-3) for k in want)


def test_a_checkpoint_restores_into_a_model_on_the_gpu(tmp_path):
    run_fragment(cfg(tmp_path, steps=2))
    model = SyntheticImages(n=512).build_model().cuda()
    got = CheckpointStore(tmp_path).latest(into=model.state_dict())
    model.load_state_dict(got.model)
    saved = weights(tmp_path)
    assert all(v.is_cuda and torch.equal(v.cpu(), saved[k]) for k, v in model.state_dict().items())


def test_this_node_counts_as_a_gpu_node_so_ranks_run_their_main_script_themselves():
    """The forkserver must not initialise CUDA for the ranks it forks: on a GPU node it skips the preload."""
    assert _gpu_node(), f"a CUDA GPU is here but no /dev/nvidia* or /dev/kfd: {sorted(os.listdir('/dev'))[:40]}"


def test_a_checkpoint_read_onto_the_gpu_is_the_one_written_and_damage_is_named(tmp_path):
    """``device=``: tensors of 1 MiB or more land on the GPU through the pinned staging buffers (bf16 too), the
    small ones (an optimizer's step) and the RNG state stay in host memory; a damaged byte is still found."""
    model = {"w": torch.randn(1024, 1024), "h": torch.randn(700, 1024).to(torch.bfloat16), "b": torch.randn(8)}
    opt = {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(1024, 1024)}}, "param_groups": []}
    path = save_checkpoint(tmp_path / "c.h5", TrainingState(model=model, optimizer=opt,
                                                            rng={"torch": torch.get_rng_state()}), fsync=False)
    got = load_checkpoint(path, device="cuda")
    assert got.model["w"].is_cuda and got.model["h"].is_cuda and got.model["h"].dtype == torch.bfloat16
    assert not got.model["b"].is_cuda and not got.optimizer["state"][0]["step"].is_cuda
    assert got.optimizer["state"][0]["exp_avg"].is_cuda and not got.rng["torch"].is_cuda
    assert all(torch.equal(got.model[k].cpu(), v) for k, v in model.items())
    assert torch.equal(got.optimizer["state"][0]["exp_avg"].cpu(), opt["state"][0]["exp_avg"])
    with h5py.File(path, "r") as f:
        name = next(n for n in ("model/k0", "model/k1") if f[n].shape == (1024, 1024))
        at = f[name].id.get_offset() + 3_000_000 % (1024 * 1024 * 4)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="checksum mismatch") as e:
        load_checkpoint(path, device="cuda")
    assert e.value.dataset == f"/{name}"
