"""The emulated accelerator: a built-in workload whose scaling curve is exact, with real all-reduces and real
checkpoints of a set size."""
import pytest
import torch

from parsl_bft.execution import TrainingJob
from parsl_bft.train.emulated import dedicated_rate
from parsl_bft.train.workloads import make_workload, workload_factory


def test_its_curve_is_exact_and_linear_where_the_batch_divides():
    assert dedicated_rate(1, 840, 3.0) == pytest.approx(840 / (0.003 * 840))
    assert all(dedicated_rate(n, 840, 3.0) == pytest.approx(n * dedicated_rate(1, 840, 3.0)) for n in range(1, 9))
    # 7 ranks of a 100-sample batch: the slowest rank computes 15 samples
    assert dedicated_rate(7, 100, 2.0) == pytest.approx(100 / (0.002 * 15))
    assert dedicated_rate(2, 100, 2.0, ranks_per_node=2) == dedicated_rate(4, 100, 2.0)


def test_it_is_a_built_in_workload_with_state_of_the_size_asked():
    assert workload_factory("emulated").__name__ == "EmulatedAccelerator"
    TrainingJob("e", workload="emulated").check_workload()
    wl = make_workload("emulated", params_mb=0.5, sample_ms=0.01, n=16)
    model = wl.build_model()
    assert sum(p.numel() for p in model.parameters()) * 4 == 2**19          # 0.5 MB of float32 to all-reduce
    x, y = next(iter(torch.utils.data.DataLoader(wl.dataset(), batch_size=4)))
    loss = wl.loss(model, (x, y))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())   # all of it moves


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="sample_ms and params_mb must be > 0"):
        make_workload("emulated", sample_ms=0)
