import json
from pathlib import Path

import pytest

from parsl_bft.execution.site_runtime import build_config, show_config
from parsl_bft.sites import SiteError, load_site

ROOT = Path(__file__).resolve().parents[2]
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
    ("node: {cores: 4, tpus: 2}", "node.tpus", "unknown field; did you mean 'gpus'? allowed here: cores, gpus, "
                                               "ranks_per_node"),
    ("pilot_walltime: {min_minutes: 10, max_minutes: 5}", "pilot_walltime", "max_minutes 5 < min_minutes 10"),
    ("worker_init: 'export GLOBUS_COMPUTE_CLIENT_SECRET=abc'", "worker_init", "looks like a secret"),
    ("globus_compute_endpoint: not-a-uuid", "globus_compute_endpoint", "UUID"),
    ("objective: {name: happiness}", "objective.name", "'throughput'"),
    ("unverified: [colour]", "(site)", "unknown fields: colour"),
    ("emulation: {speedup: 10}", "(site)", "only for scheduler 'local'"),
    # a lone quote validated, then sbatch refused every pilot
    ("scheduler_options: [\"--comment='it is mine\"]", "scheduler_options",
     "item [0] \"--comment='it is mine\": no closing quotation (sbatch / qsub would refuse every pilot)"),
])
def test_broken_site_files_fail_with_the_right_message(tmp_path, edit, field, words):
    key = edit.split(":")[0]
    body = "\n".join(line for line in GOOD.strip().splitlines() if not line.startswith(key + ":"))
    p = tmp_path / "bad.yaml"
    p.write_text(body + "\n" + edit + "\n")
    with pytest.raises(SiteError) as e:
        load_site(p)
    assert f"{p}: field '{field}'" in str(e.value) and words in str(e.value)


@pytest.mark.slow
def test_cli_validate_exit_codes(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscheduler: slurm\n")
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "sites", "validate", str(SITES[0]), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "ok" in r.stdout and "field '(site)': scheduler 'slurm' needs 'node'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "sites", "show", str(ROOT / "site_configs" /
                                                                                   "local-slurm.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "provider=SlurmPilotProvider(" in r.stdout and "partition='backfill'" in r.stdout


GC_SITE = "name: x\nscheduler: slurm\nglobus_compute_endpoint: 2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11\n"   # no node:


def test_globus_compute_site_builds_the_executor_code(tmp_path):
    p = tmp_path / "gc.yaml"
    p.write_text(GC_SITE)
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


@pytest.mark.slow
def test_fragment_through_globus_compute_executor(tmp_path):
    """Parsl's GlobusComputeExecutor + the SDK's serialiser; the cloud service is a local process pool."""
    import parsl
    from parsl.config import Config
    from parsl.executors import GlobusComputeExecutor

    from parsl_bft.execution.apps import fragment_task
    from parsl_bft.execution.globus import LocalEndpointExecutor
    from parsl_bft.train.config import FragmentConfig

    gce = LocalEndpointExecutor()
    with parsl.load(Config(executors=[GlobusComputeExecutor(executor=gce, label="remote")], retries=0,
                           run_dir=str(tmp_path / "runinfo"))):
        app = parsl.python_app(fragment_task, executors=["remote"])
        cfg = FragmentConfig(job="gc", workload="images", checkpoint_dir=str(tmp_path), world_size=1, global_batch=32,
                             steps=3, workload_args={"n": 256}, fsync=False)
        res = app(cfg, parsl_resource_specification={"num_nodes": 1}).result(timeout=120)
    assert res.end_step == 3 and Path(res.checkpoint).exists()
    assert gce.submitted_specs == [{"num_nodes": 1}]          # resource spec passed through to the endpoint


def test_a_globus_compute_site_cannot_be_orchestrated_from_outside(tmp_path):
    from parsl_bft.execution.site_runtime import make_pool
    p = tmp_path / "gc.yaml"
    p.write_text(GC_SITE)
    with pytest.raises(SiteError, match="reached through Globus Compute"):
        make_pool(load_site(p), executor=None)
    from parsl_bft.execution.session import training_session
    with pytest.raises(SiteError, match="reached through Globus Compute"), \
            training_session(tmp_path / "state", site=p):             # fails before any login is tried
        pass


def test_every_accelerator_and_the_checkpoint_dir_reach_the_runtime(tmp_path, monkeypatch):
    """ranks_per_node defaults to the GPUs of a node (4 on Polaris/Perlmutter), checkpoint_dir is where
    checkpoints go; removed fields fail naming the field."""
    from parsl_bft.execution.site_runtime import checkpoint_dir as _checkpoints
    root = Path(__file__).resolve().parents[2] / "site_configs"
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

    from parsl_bft.execution.session import current_site
    from parsl_bft.sites import DEFAULT_SITE
    assert Path(str(files("parsl_bft") / "data" / "sites" / "local.yaml")) == DEFAULT_SITE
    assert "data/sites/*.yaml" in (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert current_site().name == "local" and current_site().checkpoint_dir is None


def test_pilot_configs_use_the_pilot_block_error_policy():
    from parsl_bft.execution.block_errors import pilot_block_error_handler
    root = Path(__file__).resolve().parents[2] / "site_configs"
    ex = build_config(load_site(root / "local-slurm.yaml")).executors[0]
    assert ex.block_error_handler is pilot_block_error_handler


# --- every field a shipped site file sets reaches the runtime ----------------------------------------------

def _runtime(site):
    """What a run builds from a site: the Config's executor and provider, the pool, the planner, and what the
    orchestrator is given (checkpoint_dir, ranks_per_node)."""
    from types import SimpleNamespace

    from parsl_bft.execution.site_runtime import SiteRuntime
    rt = SiteRuntime.of(site)
    ex = rt.config().executors[0]
    return SimpleNamespace(site=site, ex=ex, prov=ex.provider, pool=rt.pool(ex), planner=rt.planner(), rt=rt)


_PROVIDER = {"local": "LocalProvider", "slurm": "SlurmPilotProvider", "pbs": "PBSPilotProvider"}
CONSUMED = {
    "name": lambda r: r.ex.label == "bft_" + r.site.name.replace("-", "_"),
    "scheduler": lambda r: type(r.prov).__name__ == _PROVIDER[r.site.scheduler],
    "partition": lambda r: r.prov.partition == r.site.partition,
    "queue": lambda r: r.prov.queue == r.site.queue,
    "account": lambda r: r.prov.account == r.site.account,
    "preemptable_qos": lambda r: r.prov.qos == r.site.preemptable_qos,
    "constraint": lambda r: f"--constraint={r.site.constraint}" in r.prov.job_options(5),
    "mem": lambda r: (f"--mem={r.site.mem}" in r.prov.job_options(5) if r.site.scheduler == "slurm"
                      else f":mem={r.site.mem.lower()}b" in r.prov.select),
    "reservation": lambda r: f"--reservation={r.site.reservation}" in r.prov.job_options(5),
    "node.cores": lambda r: {"local": r.ex.max_workers_per_node == r.site.node.cores,
                             "pbs": f"ncpus={r.site.node.cores}" in getattr(r.prov, "select", ""),
                             # Slurm pilots take whole nodes (--exclusive): cores only describes the node there
                             "slurm": True}[r.site.scheduler],
    "node.gpus": lambda r: {"pbs": lambda: f"ngpus={r.site.node.gpus}" in r.prov.select,
                            "slurm": lambda: (f"--gpus-per-node={r.site.node.gpus}" in r.prov.job_options(5))
                            == (r.site.node.gpus > 0),
                            "local": lambda: r.rt.ranks_per_node <= max(r.site.node.gpus, 1)}[r.site.scheduler](),
    "node.ranks_per_node": lambda r: r.rt.ranks_per_node == r.site.node.ranks_per_node,
    "pilot_walltime.min_minutes": lambda r: r.prov.walltime_min_min == r.site.pilot_walltime.min_minutes,
    "pilot_walltime.max_minutes": lambda r: r.prov.walltime_max_min == r.site.pilot_walltime.max_minutes,
    "worker_init": lambda r: r.prov.worker_init == r.site.worker_init,
    "scheduler_options": lambda r: r.prov.scheduler_options == r.site.scheduler_options,
    "interchange_address": lambda r: r.ex.address == r.site.interchange_address,
    "checkpoint_dir": lambda r: r.rt.checkpoint_dir == Path(r.site.checkpoint_dir).resolve(),
    "holes.poll_seconds": lambda r: (r.pool.probe_s == r.site.holes.poll_seconds
                                     and r.prov.status_polling_interval == round(r.site.holes.poll_seconds)),
    "holes.max_pending_seconds": lambda r: r.prov.max_pending_s == r.site.holes.max_pending_seconds,
    "holes.notice_seconds": lambda r: r.prov.notice_s == r.pool.notice_s == r.site.holes.notice_seconds,
    "holes.max_pilots": lambda r: r.pool.max_nodes == r.site.holes.max_pilots,
    "holes.grace_seconds": lambda r: r.prov.grace() == r.site.holes.grace_seconds,
    "objective.name": lambda r: r.planner.objective.name == r.site.objective.name,
    "objective.t_fwd_seconds": lambda r: r.planner.t_fwd == r.site.objective.t_fwd_seconds,
    "emulation.trace": lambda r: r.site.emulation.trace == "demo" and r.pool.duration > 0,
    "emulation.speedup": lambda r: r.pool.speedup == r.site.emulation.speedup,
    "emulation.notice_seconds": lambda r: r.pool.notice_s == r.site.emulation.notice_seconds,
    "unverified": lambda r: True,                 # read by `parsl-bft sites validate`, checked against the fields
}


def _leaves(doc: dict, prefix: str = "") -> list[str]:
    subs = {"node", "pilot_walltime", "holes", "objective", "emulation"}
    out = []
    for k, v in doc.items():
        if isinstance(v, dict) and not prefix and k in subs:
            out += _leaves(v, k + ".")
        else:
            out.append(prefix + k)
    return out


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.name)
def test_every_field_of_every_shipped_site_file_is_consumed(path):
    import yaml
    site, fields = load_site(path), _leaves(yaml.safe_load(path.read_text()))
    r = _runtime(site)
    unknown = [f for f in fields if f not in CONSUMED]
    assert not unknown, f"{path.name}: no consumer known for {unknown}: use the field or remove it"
    assert [f for f in fields if not CONSUMED[f](r)] == []


def test_checkpoint_dir_and_ranks_per_node_reach_the_orchestrator():
    """The multi-accelerator sites run a rank per GPU; the local Slurm site two CPU ranks per node; the
    embedded default keeps checkpoints under the state directory."""
    import inspect

    from parsl_bft.execution.orchestrator import Orchestrator
    want = {"polaris": 4, "perlmutter": 4, "frontier": 8, "local-slurm": 2, "local": 1}
    keywords = inspect.signature(Orchestrator).parameters
    for p in SITES:
        site = load_site(p)
        rt = _runtime(site).rt
        assert rt.ranks_per_node == want[site.name]
        assert rt.checkpoint_dir == (Path(site.checkpoint_dir) if site.checkpoint_dir else None)
        assert all(keywords[k].kind is inspect.Parameter.KEYWORD_ONLY            # one site
                   for k in ("executor", "checkpoint_dir", "ranks_per_node"))
        several = rt.site_pool(None)                                              # several sites
        assert (several.executor, several.checkpoint_dir, several.ranks_per_node) == (
            rt.label, rt.checkpoint_dir, want[site.name])


@pytest.mark.parametrize("edit,words", [
    ("worker_init: 'module load x'", "scheduler 'local' does not use worker_init: delete it"),
    ("holes: {poll_seconds: 1}\npartition: debug", "does not use holes, partition: delete them"),
])
def test_a_field_the_scheduler_would_ignore_is_an_error(tmp_path, edit, words):
    p = tmp_path / "s.yaml"
    p.write_text("name: l\nscheduler: local\nnode: {cores: 2}\n" + edit + "\n")
    with pytest.raises(SiteError, match=words):
        load_site(p)
    p.write_text(GOOD + "queue: debug\n")
    with pytest.raises(SiteError, match="scheduler 'slurm' does not use queue"):
        load_site(p)


# --- `sites show` is the Config's own repr, and it is code ----------------------------------------------------

def _state(obj, depth=0):
    """A comparable picture of a Config: constructor arguments of RepresentationMixin objects, the attributes
    of others (the pilot providers until they are RepresentationMixin), functions by name."""
    import inspect

    from parsl.utils import RepresentationMixin
    assert depth < 8
    if isinstance(obj, (list, tuple)):
        return [_state(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {k: _state(v, depth + 1) for k, v in obj.items()}
    if callable(obj) and hasattr(obj, "__qualname__"):
        return obj.__module__ + "." + obj.__qualname__
    if isinstance(obj, RepresentationMixin):
        spec = inspect.getfullargspec(type(obj).__init__)
        return type(obj), {a: _state(getattr(obj, a, None), depth + 1) for a in spec.args[1:] + spec.kwonlyargs}
    if hasattr(obj, "__dict__"):
        return type(obj), {k: (type(v) if k == "cmd" else _state(v, depth + 1)) for k, v in vars(obj).items()}
    return obj


def test_sites_show_evaluates_back_to_an_equivalent_config():
    site = load_site(ROOT / "site_configs" / "local-slurm.yaml")
    code = show_config(site)
    assert code.splitlines()[0].startswith("from ") and "\nconfig = Config(" in code
    ns: dict = {}
    exec(compile(code, "<sites show>", "exec"), ns)                 # the printed imports are all it needs
    again, built = ns["config"], build_config(site)
    assert _state(again) == _state(built)
    ex = again.executors[0]
    from parsl_bft.execution.block_errors import pilot_block_error_handler
    assert (ex.block_error_handler is pilot_block_error_handler and ex.max_workers_per_node == 1
            and (ex.heartbeat_period, ex.heartbeat_threshold) == (5, 20) and ex.address == "127.0.0.1"
            and again.retries == 0 and again.strategy == "none")
    from parsl.utils import RepresentationMixin
    if isinstance(ex.provider, RepresentationMixin):                # then the text itself round-trips
        from parsl_bft.execution.config import config_source
        assert config_source(again) == code


def test_the_embedded_default_loads_from_the_package_data():
    """No install needed: the file is in pyproject's package-data and importlib.resources reads it."""
    import tomllib
    from importlib.resources import files

    import yaml

    from parsl_bft.sites import Site
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["parsl_bft"]
    assert "data/sites/*.yaml" in data
    res = files("parsl_bft").joinpath("data", "sites", "local.yaml")
    site = Site(**yaml.safe_load(res.read_text()))
    assert site.name == "local" and site.scheduler == "local"
    # the user-facing copy is the same file, not a second one to keep in step
    assert (ROOT / "site_configs" / "local.yaml").resolve() == Path(str(res)).resolve()


def test_the_site_file_reference_documents_every_field():
    """`parsl-bft sites schema` (and the docs' reference page, which renders the same tables) says what every
    field is: its type, default and what it does."""
    from parsl_bft.site_schema import reference, undocumented
    assert undocumented() == []
    doc = reference()
    assert "| `holes.poll_seconds` | float | `30.0` |" in doc and "| `node` | NodeShape or null | `null` |" in doc


def test_validate_says_an_endpoint_site_is_remote(tmp_path, capsys):
    from parsl_bft.cli import main
    f = tmp_path / "gc.yaml"
    f.write_text(GC_SITE)
    assert main(["sites", "validate", str(f)]) == 0
    out = capsys.readouterr().out
    assert "ok, remote site (Globus Compute endpoint 2a7e6a1c-3e3b-4b8a-9a66-0a3b0c5d9f11) 'x'" in out


# --- several sites: what the multi-site planner cannot honour is refused by name -----------------------------

def _site(name: str, extra: str = ""):
    import yaml

    from parsl_bft.sites import Site
    return Site(**yaml.safe_load(f"name: {name}\nscheduler: local\nnode: {{cores: 2}}\n{extra}"))


@pytest.mark.parametrize("a, b, words", [
    ("objective: {name: throughput}", "", "site 'b': objective.name 'speedup' differs from site 'a' ('throughput')"),
    ("objective: {t_fwd_seconds: 20}", "objective: {t_fwd_seconds: 30}",
     "site 'b': objective.t_fwd_seconds 30.0 differs from site 'a' (20.0)"),
    ("", "objective: {weights: {cnn: 2}}", "site 'b': objective.weights {'cnn': 2.0} differs from site 'a' ({})"),
    ("", "topology: {groups: {r0: [n1, n2]}}", "site 'b': topology: a run over several sites places jobs without"),
])
def test_several_sites_refuse_what_one_planner_cannot_honour(a, b, words):
    from parsl_bft.execution.site_runtime import check_sites
    with pytest.raises(SiteError) as e:
        check_sites([_site("a", a), _site("b", b)])
    assert words in str(e.value)
    check_sites([_site("a", a)])                       # alone, each site is fine
    check_sites([_site("b", b)])
    check_sites([_site("a", a), _site("c", a)])        # sites that agree run together
    with pytest.raises(SiteError, match="site names must differ"):
        check_sites([_site("a"), _site("a")])


def test_a_lane_is_the_sites_own_executor_under_another_label():
    """A lane (pilots of one network group) is built from the site, not by rebuilding its whole Config: the same
    constructor arguments as the site's own executor, its own label, the pool's provider."""
    from parsl_bft.execution.site_runtime import SiteRuntime
    rt = SiteRuntime.of(load_site(ROOT / "site_configs" / "local-slurm.yaml"))
    own = rt.config().executors[0]
    lane = rt.pilot_executor(f"{rt.label}_lane1", own.provider)
    assert lane.label == "bft_local_slurm_lane1" and lane.provider is own.provider
    _, own_args = _state(own)
    _, lane_args = _state(lane)
    assert {k: v for k, v in lane_args.items() if k != "label"} == {k: v for k, v in own_args.items() if k != "label"}


def test_run_workflow_hands_its_settings_in_process(tmp_path, monkeypatch):
    """`parsl-bft run` and the remote runner: the workflow's training_session reads the run's settings, not the
    environment; only a workflow started as plain python takes them from $PARSL_BFT_SITE & co."""
    import json
    import os

    from parsl_bft.execution.run import RunSettings, current_settings, run_workflow
    monkeypatch.setenv("PARSL_BFT_SITE", "/nowhere.yaml")
    assert current_settings() == RunSettings((Path("/nowhere.yaml"),), False, False)
    w = tmp_path / "w.py"
    out = tmp_path / "out.json"
    w.write_text("import json, os, sys\nfrom parsl_bft.execution.run import current_settings\n"
                 "s = current_settings()\n"
                 f"open({str(out)!r}, 'w').write(json.dumps([[x.name for x in s.sites], s.new_run, s.progress, "
                 "sys.argv[1:], os.environ.get('PARSL_BFT_NEW_RUN')]))\n")
    site = ROOT / "site_configs" / "local.yaml"
    run_workflow(w, [site], args=["--x", "1"], new_run=True, progress=True)
    assert json.loads(out.read_text()) == [["local"], True, True, ["--x", "1"], None]
    assert current_settings().sites == (Path("/nowhere.yaml"),)        # the run's settings end with it
    assert os.environ["PARSL_BFT_SITE"] == "/nowhere.yaml"
    from parsl_bft.errors import UsageError
    with pytest.raises(UsageError, match="no such workflow file"):
        run_workflow(tmp_path / "missing.py")
    with pytest.raises(SiteError, match="no such site file"):
        run_workflow(w, [tmp_path / "missing.yaml"])


def test_show_pilot_script_prints_what_would_be_submitted_and_submits_nothing(tmp_path, monkeypatch, capsys):
    """`sites show --pilot-script` is a dry run: the next pilot's batch script with the site's queue, account,
    QOS, resources and options, and no scheduler command is run (none is on PATH here)."""
    from parsl_bft.cli import main
    monkeypatch.setenv("PATH", str(tmp_path))           # no sbatch, qsub, squeue ...
    assert main(["sites", "show", "--pilot-script", str(ROOT / "site_configs" / "polaris.yaml")]) == 0
    pbs = capsys.readouterr().out
    assert "#PBS -q preemptable" in pbs and "#PBS -A YOUR_PROJECT" in pbs and "ngpus=4" in pbs
    assert "process_worker_pool.py" in pbs and "{block_id}" in pbs and "{{" not in pbs
    assert main(["sites", "show", str(ROOT / "site_configs" / "perlmutter.yaml"), "--pilot-script"]) == 0
    slurm = capsys.readouterr().out
    assert "#SBATCH --qos=preempt" in slurm and "#SBATCH --constraint=gpu" in slurm
    assert "#SBATCH --signal=B:USR1@60" in slurm
    # what shapes the run but not the script is listed under it: ranks per node, checkpoint dir, holes, objective
    assert "# not in the script - ranks per node: 4" in slurm and "parsl-bft/checkpoints" in slurm
    assert "# not in the script - objective: speedup, T_fwd 60 s" in slurm
    assert main(["sites", "show", "--pilot-script", str(ROOT / "site_configs" / "local.yaml")]) == 2
    assert "submits no pilot jobs" in capsys.readouterr().err


def test_a_slurm_pilot_asks_for_its_gpus_and_the_probe_tests_the_same_job(tmp_path):
    """node.gpus becomes --gpus-per-node (unless the site's options ask already), and `sbatch --test-only` is
    asked about the job the pilot script submits: account, QOS, GPUs and the site's options included."""
    from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider
    probes = []

    def run(argv):
        if argv[:2] == ["sbatch", "--test-only"]:
            probes.append(argv)
        return 0, "", ""
    prov = SlurmPilotProvider("gpu", qos="scavenger", account="proj1", gpus_per_node=4, commands=SlurmCommands(run),
                              script_dir=str(tmp_path), scheduler_options=["-C a100"])
    script = prov.script("worker", "parsl.bft", 30)
    for line in ("#SBATCH --gpus-per-node=4", "#SBATCH --account=proj1", "#SBATCH --qos=scavenger", "#SBATCH -C a100"):
        assert line in script.splitlines(), script
    prov.walltime_minutes(now=0.0)
    (probe,) = probes
    assert {"--gpus-per-node=4", "--account=proj1", "--qos=scavenger", "-C", "a100", "--partition=gpu"} <= set(probe)
    asked = SlurmPilotProvider("gpu", gpus_per_node=4, scheduler_options=["--gres=gpu:a100:4"],
                               script_dir=str(tmp_path))
    assert "--gpus-per-node=4" not in asked.job_options(30)       # the site's own request stands


def test_a_pbs_site_names_its_preemptable_queue_as_queue(tmp_path):
    f = tmp_path / "pbs.yaml"
    f.write_text("name: p\nscheduler: pbs\nqueue: prod\npreemptable_qos: preemptable\nnode: {cores: 32}\n")
    with pytest.raises(SiteError, match="has no QOS: name the preemptable queue as 'queue'"):
        load_site(f)


@pytest.mark.parametrize("line", [
    "export MY_PASS=hunter2", "sshpass -p hunter2 ssh login1", "DB_PASS=abc", "SSHPASS=abc",
    "mysql -uroot -phunter2 db", "export GITHUB_PAT=github_pat_11ABCDEFG", "WANDB_KEY=0123abcd",
    "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc==;", "echo hunter2 | kinit me"])
def test_credentials_in_worker_init_are_refused_without_repeating_them(tmp_path, line):
    f = tmp_path / "s.yaml"
    f.write_text(f"name: s\nscheduler: slurm\npartition: p\nnode: {{cores: 4}}\nworker_init: {json.dumps(line)}\n")
    with pytest.raises(SiteError, match="worker_init") as e:
        load_site(f)
    assert "hunter2" not in str(e.value) and "abc" not in str(e.value)


@pytest.mark.parametrize("line", ["export PATH=/opt/bin:$PATH", "export TOKENIZERS_PARALLELISM=false",
                                  "export WANDB_KEY=$WANDB_KEY", "mkdir -p /tmp/x", "module load pytorch"])
def test_ordinary_worker_init_lines_are_not_taken_for_credentials(tmp_path, line):
    f = tmp_path / "s.yaml"
    f.write_text(f"name: s\nscheduler: slurm\npartition: p\nnode: {{cores: 4}}\nworker_init: {json.dumps(line)}\n")
    assert load_site(f).worker_init == line


def test_yaml_aliases_and_trailing_newlines_are_refused(tmp_path):
    """Aliases expand without bound (nine levels of *a in 463 bytes: gigabytes), so site files and job sets
    refuse them; a scheduler token with a trailing newline would put a blank line in the #SBATCH block."""
    from parsl_bft.errors import InputError
    from parsl_bft.jobs import load_yaml
    f = tmp_path / "a.yaml"
    f.write_text('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n')
    with pytest.raises(SiteError, match=":2: YAML aliases"):
        load_site(f)
    with pytest.raises(InputError, match="YAML aliases"):
        load_yaml(f)
    f.write_text('name: s\nscheduler: slurm\npartition: "debug\\n"\nnode: {cores: 4}\n')
    with pytest.raises(SiteError, match="partition"):
        load_site(f)
