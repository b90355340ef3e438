"""The rank forkserver runs the parent's main script once, not every rank (train/rank_preload.py)."""
import subprocess
import sys

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


def test_ranks_find_the_main_script_run_once_in_their_forkserver(tmp_path):
    script, runs = tmp_path / "workflow.py", tmp_path / "runs.txt"
    script.write_text(MAIN)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "job")], capture_output=True, text=True,
                         env={**__import__("os").environ, "RUNS_FILE": str(runs)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]            # both fragments trained, the second from the first's save
    names = [line.split()[0] for line in runs.read_text().splitlines()]
    # the script itself, then its one re-run as __mp_main__ in the forkserver; four ranks ran it before
    assert names == ["__main__", "__mp_main__"]
