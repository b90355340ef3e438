from pathlib import Path

import pytest

from parsl_bft.sites import SiteError, build_config, load_site, show_config

ROOT = Path(__file__).resolve().parent.parent
SITES = sorted((ROOT / "site_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.name)
def test_every_shipped_site_file_validates_and_builds(path):
    site = load_site(path)
    code = show_config(site)
    cfg = build_config(site)
    assert cfg.executors and cfg.retries == 0
    assert f"label='bft_{site.name.replace('-', '_')}'" in code and "object at 0x" not in code


def test_shipped_sites_cover_the_facilities():
    names = {load_site(p).name: load_site(p).scheduler for p in SITES}
    assert names == {"local": "local", "local-slurm": "slurm", "polaris": "pbs", "perlmutter": "slurm",
                     "frontier": "slurm"}


GOOD = """
name: x
scheduler: slurm
partition: debug
node: {cores: 4}
checkpoint_dir: /tmp/ck
"""


@pytest.mark.parametrize("edit,field,words", [
    ("scheduler: lsf", "scheduler", "'local', 'slurm' or 'pbs'"),
    ("partition: null", "(site)", "needs 'partition'"),
    ("node: {cores: 0}", "node.cores", "greater than or equal to 1"),
    ("node: {cores: 4, tpus: 2}", "node.tpus", "unknown field; allowed here: cores, gpus, ranks_per_node"),
    ("pilot_walltime: {min_minutes: 10, max_minutes: 5}", "pilot_walltime", "max_minutes 5 < min_minutes 10"),
    ("worker_init: 'export GLOBUS_COMPUTE_CLIENT_SECRET=abc'", "worker_init", "looks like a secret"),
    ("globus_compute_endpoint: not-a-uuid", "globus_compute_endpoint", "UUID"),
    ("objective: {name: happiness}", "objective.name", "'throughput'"),
    ("unverified: [colour]", "(site)", "unknown fields: colour"),
    ("emulation: {speedup: 10}", "(site)", "only for scheduler 'local'"),
])
def test_broken_site_files_fail_with_the_right_message(tmp_path, edit, field, words):
    key = edit.split(":")[0]
    body = "\n".join(line for line in GOOD.strip().splitlines() if not line.startswith(key + ":"))
    p = tmp_path / "bad.yaml"
    p.write_text(body + "\n" + edit + "\n")
    with pytest.raises(SiteError) as e:
        load_site(p)
    assert f"{p}: field '{field}'" in str(e.value) and words in str(e.value)


def test_cli_validate_exit_codes(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscheduler: slurm\n")
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "sites", "validate", str(SITES[0]), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "ok" in r.stdout and "field 'node': Field required" in r.stderr
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "sites", "show", str(ROOT / "site_configs" /
                                                                                   "local-slurm.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "provider=SlurmPilotProvider(" in r.stdout and "partition='backfill'" in r.stdout


def test_globus_compute_site_builds_the_executor_code(tmp_path):
    p = tmp_path / "gc.yaml"
    p.write_text(GOOD + "globus_compute_endpoint: 2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11\n")
    code = show_config(load_site(p))            # no login: the SDK Executor is not constructed to show it
    assert "GlobusComputeExecutor(" in code and "Executor(endpoint_id='2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11')" in code
    assert "from globus_compute_sdk import Executor" in code
    assert all(line.startswith("#") for line in code.splitlines() if "SECRET" in line)   # only named, in a comment
    # the run builds it through the real SDK Executor (here a factory standing in for it)
    from parsl.executors import GlobusComputeExecutor

    from parsl_bft.execution.globus import LocalEndpointExecutor
    made = []
    cfg = build_config(load_site(p), endpoint=lambda eid: made.append(eid) or LocalEndpointExecutor(eid))
    assert made == ["2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11"]
    assert isinstance(cfg.executors[0], GlobusComputeExecutor) and cfg.retries == 0
    cfg.executors[0].executor.shutdown()


def test_fragment_through_globus_compute_executor(tmp_path):
    """Parsl's GlobusComputeExecutor + the SDK's serialiser; the cloud service is a local process pool."""
    import parsl
    from parsl.config import Config
    from parsl.executors import GlobusComputeExecutor

    from parsl_bft.execution.apps import fragment_task
    from parsl_bft.execution.globus import LocalEndpointExecutor

    gce = LocalEndpointExecutor()
    with parsl.load(Config(executors=[GlobusComputeExecutor(executor=gce, label="remote")], retries=0,
                           run_dir=str(tmp_path / "runinfo"))):
        app = parsl.python_app(fragment_task, executors=["remote"])
        cfg = dict(job="gc", workload="images", checkpoint_dir=str(tmp_path), world_size=1, global_batch=32,
                   steps=3, workload_args={"n": 256}, fsync=False)
        res = app(cfg, parsl_resource_specification={"num_nodes": 1}).result(timeout=120)
    assert res["end_step"] == 3 and Path(res["checkpoint"]).exists()
    assert gce.submitted_specs == [{"num_nodes": 1}]          # resource spec passed through to the endpoint


def test_a_globus_compute_site_cannot_be_orchestrated_from_outside(tmp_path):
    from parsl_bft.execution.session import make_pool
    from parsl_bft.sites import SiteError
    p = tmp_path / "gc.yaml"
    p.write_text(GOOD + "globus_compute_endpoint: 2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11\n")
    with pytest.raises(SiteError, match="reached through Globus Compute"):
        make_pool(load_site(p), executor=None)


def test_every_accelerator_and_the_checkpoint_dir_reach_the_runtime(tmp_path, monkeypatch):
    """ranks_per_node defaults to the GPUs of a node (4 on Polaris/Perlmutter), checkpoint_dir is where
    checkpoints go; removed fields fail naming the field."""
    from parsl_bft.execution.session import checkpoint_dir as _checkpoints
    root = Path(__file__).resolve().parent.parent / "site_configs"
    assert load_site(root / "polaris.yaml").node.ranks_per_node == 4
    assert load_site(root / "perlmutter.yaml").node.ranks_per_node == 4
    assert load_site(root / "local-slurm.yaml").node.ranks_per_node == 2
    polaris = load_site(root / "polaris.yaml")
    assert _checkpoints(polaris) == Path(polaris.checkpoint_dir)
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(GOOD.replace("/tmp/ck", "ck"))
    assert _checkpoints(load_site(p)) == tmp_path / "ck"          # relative: from where parsl-bft runs
    p.write_text(GOOD.replace("node: {cores: 4}", "node: {cores: 4, gpus: 2, ranks_per_node: 3}"))
    with pytest.raises(SiteError, match="ranks_per_node 3 > gpus 2"):
        load_site(p)
    p.write_text(GOOD.replace("node: {cores: 4}", "node: {cores: 4, memory_gb: 8}") + "launcher: srun\n")
    with pytest.raises(SiteError) as e:
        load_site(p)
    assert "field 'launcher' was removed" in str(e.value) and "field 'node.memory_gb' was removed" in str(e.value)


def test_the_embedded_default_ships_inside_the_package():
    from importlib.resources import files

    from parsl_bft.execution.session import DEFAULT_SITE, current_site
    assert DEFAULT_SITE == Path(str(files("parsl_bft") / "data" / "sites" / "local.yaml"))
    assert "data/sites/*.yaml" in (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert current_site().name == "local" and current_site().checkpoint_dir is None


def test_pilot_configs_use_the_pilot_block_error_policy():
    from parsl_bft.execution.block_errors import pilot_block_error_handler
    root = Path(__file__).resolve().parent.parent / "site_configs"
    ex = build_config(load_site(root / "local-slurm.yaml")).executors[0]
    assert ex.block_error_handler is pilot_block_error_handler
