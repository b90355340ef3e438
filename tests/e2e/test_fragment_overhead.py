"""What every fragment pays besides training (benchmarks/fragment_overhead.py measures it): ranks start without
re-running the parent's main script, a checkpoint's RNG states are a few datasets, not hundreds of attributes."""
import os
import random
import subprocess
import sys

import h5py
import pytest

from parsl_bft.train.checkpoint import TrainingState, capture_rng, load_checkpoint, restore_rng, save_checkpoint
from parsl_bft.train.rank_preload import _gpu_node

MAIN = '''
import os
import sys

with open(os.environ["RUNS_FILE"], "a") as f:       # every run of this module body: as what, in which process
    f.write(f"{__name__} {os.getpid()}\\n")

if __name__ == "__main__":
    from parsl_bft.train.fragment import FragmentConfig
    from parsl_bft.train.launcher import run_fragment

    for _ in range(2):
        res = run_fragment(FragmentConfig(job="j", workload="images", checkpoint_dir=sys.argv[1], world_size=2,
                                          global_batch=8, steps=1, fsync=False,
                                          workload_args={"n": 32, "size": 8, "width": 4}))
    print(res.start_step, res.end_step)
'''


@pytest.mark.slow
def test_ranks_find_the_main_script_run_once_in_their_forkserver(tmp_path):
    script, runs = tmp_path / "workflow.py", tmp_path / "runs.txt"
    script.write_text(MAIN)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "job")], capture_output=True, text=True,
                         env={**os.environ, "RUNS_FILE": str(runs)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]            # both fragments trained, the second from the first's save
    names = [line.split()[0] for line in runs.read_text().splitlines()]
    # the script itself, then its one re-run as __mp_main__ in the forkserver (four ranks ran it before); on a
    # GPU node each rank still runs it itself (rank_preload: CUDA must not be initialised in the forkserver)
    assert names == ["__main__"] + ["__mp_main__"] * (4 if _gpu_node() else 1)


@pytest.mark.slow
def test_ranks_of_a_parsl_worker_never_run_its_main_script(tmp_path):
    """A Parsl worker's main is process_worker_pool.py: all of Parsl, which the forkserver imported (1.5 s of a
    warm-up on two cores) and every rank ran again on a GPU node, though no rank uses a name of it."""
    script, runs = tmp_path / "process_worker_pool.py", tmp_path / "runs.txt"
    script.write_text(MAIN)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "job")], capture_output=True, text=True,
                         env={**os.environ, "RUNS_FILE": str(runs)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]
    assert [line.split()[0] for line in runs.read_text().splitlines()] == ["__main__"]


def test_the_python_rng_state_is_one_array_and_older_checkpoints_still_restore(tmp_path):
    random.seed(5)
    rng = capture_rng()
    expected = random.random()
    listed = {**rng, "python": [rng["python"][0], [int(x) for x in rng["python"][1]], rng["python"][2]]}
    save_checkpoint(tmp_path / "new.h5", TrainingState(model={}, rng=rng))
    save_checkpoint(tmp_path / "old.h5", TrainingState(model={}, rng=listed))     # as written before
    attrs = {}
    for name in ("new.h5", "old.h5"):
        with h5py.File(tmp_path / name) as f:
            attrs[name] = len(f.attrs) + sum(len(o.attrs) for o in _objects(f))
        random.seed(99)
        restore_rng(load_checkpoint(tmp_path / name).rng)
        assert random.random() == expected
    assert attrs["old.h5"] > 625 > 50 > attrs["new.h5"]       # each of the 625 ints was an attribute


def _objects(f: h5py.File) -> list:
    out: list = []
    f.visititems(lambda _name, obj: out.append(obj))
    return out
