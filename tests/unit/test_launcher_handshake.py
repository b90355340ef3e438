"""What a launcher needs back from its own ranks comes as files in the job's folder, not through the store: a
local Parsl worker then never imports torch (its warm-up is one torch import, its forkserver's)."""
import subprocess
import sys

from parsl_bft.train.protocol import JobDir


def test_ready_marks_and_the_result_are_files_that_end_with_the_fragment(tmp_path):
    jd = JobDir(tmp_path / "j").ensure()
    assert not jd.all_ready("f1", [0, 1]) and jd.read_result("f1") is None
    jd.mark_ready("f1", 0)
    assert not jd.all_ready("f1", [0, 1]) and jd.all_ready("f1", [0])
    jd.mark_ready("f1", 1)
    jd.write_result("f1", '{"step": 3}')
    assert jd.all_ready("f1", [0, 1]) and jd.read_result("f1") == '{"step": 3}'
    assert not jd.all_ready("f2", [0])                               # another fragment's marks are its own
    jd.end_handshake("f1", [1])                                      # a share without rank 0: its marks only
    assert jd.read_result("f1") is not None and jd.all_ready("f1", [0]) and not jd.all_ready("f1", [1])
    jd.end_handshake("f1", [0])
    assert jd.read_result("f1") is None and not list(jd.path.glob(".ready-*"))


def test_a_fragment_whose_launcher_was_killed_leaves_nothing_once_collected(tmp_path):
    jd = JobDir(tmp_path / "j").ensure()
    jd.mark_ready("f1", 0)
    jd.mark_ready("f1", 1)
    jd.write_result("f1", "{}")
    jd.mark_ready("f2", 0)
    jd.forget_fragment("f1")                                         # the orchestrator, collecting f1
    assert sorted(p.name for p in jd.path.iterdir() if p.name.startswith(".")) == [".ready-f2-0"]


def test_a_local_worker_imports_no_torch_to_launch_or_warm_up():
    code = ("import sys\nimport parsl_bft.execution.apps, parsl_bft.train.launcher\n"
            "from parsl_bft.execution import TrainingJob, training_session\n"
            "import parsl_bft.execution.orchestrator\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["False"], r.stderr


def test_a_gang_worker_starts_its_share_or_sees_it_given_up_without_importing_torch():
    """A pilot's worker says its share started (or finds it given up) through the orchestrator's store, whose
    client needs torch: a child of its rank forkserver does that, so the worker's warm-up imports torch once."""
    import os

    from parsl_bft.train.launcher import serve_store
    server = serve_store()
    server.set("f1/share/1", "abandoned")              # the orchestrator gave share 1 up while it waited
    code = ("import sys\nfrom parsl_bft.train.launcher import claim_share\n"
            "print(claim_share(sys.argv[1], 'f1', 0, 30), claim_share(sys.argv[1], 'f1', 1, 30),"
            " 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, server.address()], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PARSL_BFT_NODE": "n7"})
    assert r.returncode == 0 and r.stdout.split() == ["True", "False", "False"], r.stderr[-3000:]
    assert server.get("f1/share/0") == b"started" and server.get("f1/node/0") == b"n7"
    assert not server.check(["f1/node/1"])
