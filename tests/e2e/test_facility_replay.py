"""The facility replay (benchmarks/facility_replay.py --smoke): 90 s of ALCF Theta's 2022 job stream as real
sbatch jobs on a local Slurm, alone and with `parsl-bft run` training beside it, with and without preemption.
What must hold whatever the machine's load: every facility job is matched across the runs, pilots soak holes and
train in them, nothing trains beyond what dedicated nodes would, no facility job starts later than the
scheduler planned when pilots must fit its plan, and preempted pilots give way within the grace time. The smoke
stretch (2022-09-27T11:00) has idle nodes from its first second, so even where pilots take a minute to start
(load 7 on 2 cores) they train: a stretch whose holes open late trained nothing in CI."""
import json
import os
import subprocess
import sys

import pytest

from paths import ROOT

GRACE_S = 10                     # tools/local-slurm.sh: GraceTime of the preemptable partition
KEYS = {"facility_delay_median_s", "facility_delay_p95_s", "facility_delay_max_s", "planned_start_violations",
        "bounded_slowdown_ratio", "idle_share_held", "held_training_share", "e_used_vs_dedicated", "sim_e_idle",
        "real_e_idle", "sim_gap", "swf", "window", "nodes", "compression", "mode", "wall_s"}


@pytest.mark.slurm
@pytest.mark.timeout(1500)
def test_the_facility_replay_smoke_run(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the facility replay needs root to start a local Slurm (CI runs as root)")
    try:
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "facility_replay.py"), "--smoke", "--out",
                            str(tmp_path), "--slurm-base", "/tmp/local-slurm-replay-test", "--slurm-port", "20817"],
                           cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=1400)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ran out of time in the smoke replay (1400 s): {str(e.stderr)[-3000:]}")
    assert r.returncode == 0, r.stderr[-4000:]
    modes = {m["mode"]: m for m in (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))}
    assert set(modes) == {"preempt", "no-preempt"}, r.stdout[-2000:]
    for m in modes.values():
        assert set(m) >= KEYS, KEYS - set(m)
        # the stretch starts 5 of its 16 jobs within the 90 s (the others wait for nodes): a stream to measure
        assert m["facility_jobs"] >= 3 and m["facility_unmatched"] == 0, m
        assert m["pilots"] >= 1 and m["held_node_s"] > 0 and m["fragments"] >= 1, m     # pilots soaked holes
        assert m["samples"] > 0 and 0 < m["e_used_vs_dedicated"] <= 1.0, m            # ... and trained in them
        assert 0 < m["real_e_idle"] <= m["idle_share_held"] + 1e-9, m
        parts = m["held_node_s_by_part"]      # every held node-second is in one part, training among them
        assert abs(sum(parts.values()) - m["held_node_s"]) <= 1.0 + 0.01 * m["held_node_s"], m
        assert abs(parts["training"] - m["train_node_s"]) <= 1.0 + 0.02 * m["train_node_s"], m
    assert modes["no-preempt"]["planned_start_violations"] == 0, modes["no-preempt"]
    assert modes["preempt"]["facility_delay_max_s"] <= GRACE_S + 10, modes["preempt"]
    assert (tmp_path / "facility_replay.png").stat().st_size > 10_000
    assert len(json.loads((tmp_path / "result.json").read_text())) == 2
    # the figures again from the records the run left (nothing replayed): the same, to the last digit
    again = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "facility_replay.py"), "--smoke", "--out",
                            str(tmp_path), "--figures-only"], cwd=ROOT / "benchmarks", capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")] == list(modes.values())
