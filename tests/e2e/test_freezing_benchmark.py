"""benchmarks/freezing.py kept runnable: --smoke runs every section (real training of both models with the
planner choosing levels, the Philly replays with freezing on and off, both baseline schedulers, the
sensitivity) in seconds. The numbers mean little at that size; that every section runs and reports does, and
no job, replayed or trained, may end over its accuracy budget."""
import json
import subprocess
import sys

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow          # real Parsl, ranks or a whole benchmark: not in the inner loop


@pytest.mark.timeout(600)
def test_the_freezing_benchmark_runs_every_section(tmp_path, shared_data):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "freezing.py"), "--smoke",
                        "--data", str(shared_data)], capture_output=True, text=True, timeout=550, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["budget_violations"] == 0 and last["training_budget_violations"] == 0
    for key in ("jct_ratio_median", "nonfreezable_ratio", "jct_vs_best_baseline", "time_to_target_median",
                "accuracy_delta_mean", "time_to_target_median_digits", "time_to_target_median_transformer"):
        assert isinstance(last[key], float), key
    assert set(last["sensitivity"]) == {"0@0.8", "1@0.8"} and last["sensitivity"]["0@0.8"] == 1.0
    assert "Tiresias-like 2D-LAS" in r.stdout and "FIFO+EASY backfill" in r.stdout
