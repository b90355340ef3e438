"""A site the scheduler would not take stops a run before it starts, with the reason, and `parsl-bft sites check`
asks the same on demand: on canned scheduler output (a partition with no node, an sbatch --test-only refusal,
an unknown or disabled PBS queue), and through the CLI with stand-in scheduler commands on PATH."""
import json
import os
import stat
import sys
import time

import pytest
from fakes import Canned

from parsl_bft.cli import main
from parsl_bft.execution.pbs import PBSCommands, PBSPilotProvider
from parsl_bft.execution.site_runtime import SiteRuntime
from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider
from parsl_bft.sites import SiteError, load_site

SINFO = "n1|alloc\nn2|idle\nn3|plnd\n"
TEST_ONLY = "sbatch: Job 3 to start at 1795417921 using 4 processors on nodes n2 in partition debug\n"
# what the local Slurm 22.05 (tools/local-slurm.sh) says to `sbatch --test-only --mem=99999999`, exit 1
NO_MEM = ("", "allocation failure: Requested node configuration is not available\n")


def _canned(answers, calls):
    """fakes.Canned logging into ``calls``."""
    runner = Canned(answers)
    runner.calls = calls
    return runner


def _slurm(answers, **kw):
    calls = []
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(_canned(answers, calls)), script_dir="/tmp/h37", **kw)
    return prov, calls


def test_a_partition_with_no_node_is_refused_before_any_test_submission():
    prov, calls = _slurm({"sinfo": (0, "", "")})          # sinfo -p nosuch: no rows, exit 0
    with pytest.raises(SiteError, match=r"partition 'debug' matches no node \(sinfo -p debug lists none\): "
                                        r"check the site file's 'partition'"):
        prov.preflight()
    assert [c[0] for c in calls] == ["sinfo"]


def test_a_pilot_sbatch_test_only_refuses_stops_with_its_words():
    prov, calls = _slurm({"sinfo": (0, SINFO, ""), "sbatch --test-only": (1, *NO_MEM)}, account="p1",
                         walltime_max_min=45, scheduler_options=["--mem=99999999"])
    with pytest.raises(SiteError) as e:
        prov.preflight()
    assert ("sbatch --test-only refuses a pilot: allocation failure: Requested node configuration is not "
            "available (check the site file's partition, account") in str(e.value)
    (probe,) = [c for c in calls if c[:2] == ["sbatch", "--test-only"]]
    # the job a pilot of the longest walltime would be: what a submission would be refused for
    assert {"--partition=debug", "--time=45", "--account=p1", "--mem=99999999", "--exclusive"} <= set(probe)


def test_a_site_slurm_takes_says_what_slurm_said():
    prov, _ = _slurm({"sinfo": (0, SINFO, ""), "sbatch --test-only": (0, "", TEST_ONLY)})
    said = prov.preflight()
    assert said.startswith("partition 'debug': 3 nodes, 2 idle now; sbatch --test-only would start at ")
    assert said.endswith(" on n2")


# `scontrol show config` lines as Slurm 22.05 prints them
@pytest.mark.parametrize("config, hidden", [("PrivateData             = jobs,usage\n", True),
                                            ("PrivateData             = none\n", False),
                                            ("PrivateData             = usage\n", False)])
def test_private_jobs_are_said_at_start_up(config, hidden):
    """Under PrivateData=jobs squeue shows only our own jobs: holes then come from sinfo and reservations alone,
    blind to other users' planned starts; the run says so before it starts, not silently."""
    prov, _ = _slurm({"sinfo": (0, SINFO, ""), "sbatch --test-only": (0, "", TEST_ONLY),
                      "scontrol show config": (0, "Configuration data as of now\n" + config, "")})
    said = prov.preflight()
    assert ("PrivateData=jobs: other users' queued jobs are hidden, so holes come from sinfo and reservations "
            "alone" in said) is hidden, said


@pytest.mark.parametrize("answer, words", [
    ((170, "", "qstat: Unknown queue nosuch\n"), "queue 'nosuch' is unknown to PBS (qstat -Q nosuch: qstat: "
                                                  "Unknown queue nosuch): check the site file's 'queue'"),
    ((0, json.dumps({"Queue": {"nosuch": {"enabled": "False", "started": "True"}}}), ""),
     "queue 'nosuch' takes no jobs now (enabled = False)"),
])
def test_an_unknown_or_disabled_pbs_queue_is_refused(answer, words):
    calls = []
    prov = PBSPilotProvider("nosuch", commands=PBSCommands(_canned({"qstat -Q": answer}, calls)))
    with pytest.raises(SiteError) as e:
        prov.preflight()
    assert words in str(e.value)
    ok = PBSPilotProvider("prod", commands=PBSCommands(_canned(
        {"qstat -Q": (0, json.dumps({"Queue": {"prod": {"enabled": "True", "started": "True"}}}), "")}, calls)))
    assert ok.preflight() == "queue 'prod': known to PBS, enabled and started"


def _stand_in_slurm(bin_dir, sinfo_out, sbatch_rc=0, sbatch_err=TEST_ONLY):
    """sinfo / sbatch / squeue on PATH that answer as a Slurm would, and log that they ran."""
    bin_dir.mkdir()
    for name, body in {"sinfo": f"printf '%b' {json.dumps(sinfo_out)}",
                       "sbatch": f"case \"$1\" in --test-only) printf '%b' {json.dumps(sbatch_err)} >&2; "
                                 f"exit {sbatch_rc};; *) echo submitted >> {bin_dir}/submitted; "
                                 "echo 'Submitted batch job 9';; esac",
                       "squeue": "true", "scontrol": "true", "sacctmgr": "true"}.items():
        f = bin_dir / name
        f.write_text(f"#!/bin/sh\necho {name} >> {bin_dir}/ran\n{body}\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)


SITE = "name: s\nscheduler: slurm\npartition: nosuch\nnode: {cores: 2}\ninterchange_address: 127.0.0.1\n"
WORKFLOW = """from parsl_bft.execution import TrainingJob, training_session
with training_session("state") as trainer:
    trainer.submit(TrainingJob("a", workload="images", samples=320, global_batch=32))
    trainer.run(timeout_s=60)
"""


@pytest.mark.parametrize("sinfo, rc, words", [
    ("", 0, "site 's': partition 'nosuch' matches no node"),
    (SINFO, 1, "site 's': sbatch --test-only refuses a pilot: allocation failure: Requested node configuration"),
])
def test_a_run_on_a_site_the_scheduler_would_not_take_stops_at_once(tmp_path, monkeypatch, capsys, sinfo, rc, words):
    """`parsl-bft run`: exit 2 with the reason before any executor or pilot starts (no interchange, no sbatch),
    and the state directory is not left locked; `sites check` says the same, exit 1."""
    _stand_in_slurm(tmp_path / "bin", sinfo, rc, NO_MEM[1] if rc else TEST_ONLY)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text(SITE)
    (tmp_path / "w.py").write_text(WORKFLOW)
    t0 = time.monotonic()
    assert main(["run", "--quiet", "w.py", "--site", "site.yaml"]) == 2
    err = capsys.readouterr().err
    assert f"parsl-bft run: error: {words}" in err, err
    assert time.monotonic() - t0 < 30 and not (tmp_path / "bin" / "submitted").exists()
    assert not list(tmp_path.glob("state/runinfo/*"))                 # Parsl never started
    assert main(["sites", "check", "site.yaml"]) == 1
    assert f"parsl-bft sites: error: site.yaml: {words}" not in err   # (the run's line, above)
    assert words in capsys.readouterr().err
    from parsl_bft.execution.orchestrator import lock_state_dir
    lock_state_dir(tmp_path / "state").close()                        # the run let go of its state directory


def test_sites_check_on_a_site_the_scheduler_takes(tmp_path, monkeypatch, capsys):
    _stand_in_slurm(tmp_path / "bin", SINFO)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "site.yaml").write_text(SITE.replace("nosuch", "debug"))
    local = os.path.join(os.path.dirname(sys.modules["parsl_bft"].__file__), "data", "sites", "local.yaml")
    assert main(["sites", "check", str(tmp_path / "site.yaml"), local]) == 0
    out = capsys.readouterr().out
    assert ("site.yaml: ok, slurm site 's': partition 'debug': 3 nodes, 2 idle now; sbatch --test-only would "
            "start") in out
    assert "local.yaml: ok, local site 'local': nothing to ask: the embedded default runs on this machine" in out
    assert not (tmp_path / "bin" / "submitted").exists()


def test_the_shipped_local_slurm_site_is_checked_through_its_provider():
    """check_scheduler asks the provider the Config would run (its partition, account, options)."""
    from pathlib import Path
    site = load_site(Path(__file__).resolve().parents[2] / "site_configs" / "local-slurm.yaml")
    calls = []
    prov = SiteRuntime.of(site).pilot_provider()
    prov.cmd = SlurmCommands(_canned({"sinfo": (0, "", "")}, calls))
    with pytest.raises(SiteError, match=f"site '{site.name}': partition '{site.partition}' matches no node"):
        SiteRuntime.of(site).check_scheduler(prov)
