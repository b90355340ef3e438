"""`parsl-bft export CKPT model.pt`: a checkpoint's model as a plain torch.save file that loads without
parsl-bft (torch.load, weights only)."""
import torch

from parsl_bft.cli import main
from parsl_bft.train.checkpoint import CheckpointStore
from parsl_bft.train.fragment import FragmentConfig, train_rank
from parsl_bft.train.workloads import SyntheticImages


def test_a_workload_job_exports_its_state_dict_that_loads_into_the_model(tmp_path, capsys):
    d = tmp_path / "job"
    train_rank(FragmentConfig(job="a", workload="images", checkpoint_dir=str(d), global_batch=16,
                              workload_args={"n": 64}, steps=2, fsync=False))
    assert main(["export", str(d), str(tmp_path / "model.pt")]) == 0
    assert "step 2 of job a" in capsys.readouterr().out
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    model = SyntheticImages(n=64).build_model()
    model.load_state_dict(exported)                          # a plain state_dict, as the docs promise
    saved = CheckpointStore(d).latest().model
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    ckpt = CheckpointStore(d).paths()[0]                     # a checkpoint file itself
    assert main(["export", str(ckpt), str(tmp_path / "again.pt")]) == 0


def test_a_loop_s_saved_entry_is_chosen_with_key_and_a_wrong_key_is_named(tmp_path, capsys):
    d = tmp_path / "job"
    (tmp_path / "loop.py").write_text(
        "import torch\n"
        "def train(ctx):\n"
        "    for _ in ctx.batches(64):\n"
        "        if ctx.should_stop():\n"
        "            break\n"
        "    ctx.save({'model': {'w': torch.ones(3)}, 'optimizer': {'lr': 0.1}})\n")
    train_rank(FragmentConfig(job="a", workload="images", loop=f"{tmp_path / 'loop.py'}:train",
                              checkpoint_dir=str(d), global_batch=16, steps=2, fsync=False))
    assert main(["export", str(d), str(tmp_path / "m.pt"), "--key", "model"]) == 0
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["w"], torch.ones(3))
    assert main(["export", str(d), str(tmp_path / "m.pt"), "--key", "modle"]) == 2
    assert "--key 'modle': the saved state has model, optimizer" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "m.pt")]) == 2
    assert "no good checkpoint in this directory" in capsys.readouterr().err
