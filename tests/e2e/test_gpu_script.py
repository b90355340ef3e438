"""benchmarks/gpu.py, the one prepared GPU run, kept runnable where there is no GPU: --smoke runs every part
(plain loop vs fragment, checkpoint costs, a resize phase by phase) with tiny models on the CPU, and writes its
JSON and its costs file. The numbers mean nothing here; that the script runs to its end does."""
import csv
import json
import subprocess
import sys

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow          # real Parsl, ranks or a whole benchmark: not in the inner loop


@pytest.mark.timeout(900)
def test_the_gpu_benchmark_runs_every_part_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--only", "resnet-tiny",
                        "--out", str(tmp_path / "gpu.json")], capture_output=True, text=True, timeout=850,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["smoke"] and last["device"] == "cpu"
    assert {"resnet-tiny_throughput_ratio", "resnet-tiny_stall_ratio", "resnet-tiny_restore_ratio",
            "resnet-tiny_resize_s"} <= set(last)
    (row,) = json.loads((tmp_path / "gpu.json").read_text())["models"]
    phases = row["resize"]
    assert phases["total_s"] > 0 and phases["restore_s"] > 0 and phases["first_step_s"] > 0
    (cost,) = list(csv.DictReader((tmp_path / "gpu.costs.csv").read_text().splitlines()))
    assert cost["model"] == "resnet-tiny" and float(cost["restart_s"]) == pytest.approx(phases["total_s"], abs=1e-3)
