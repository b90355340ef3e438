"""Hostile and broken inputs (issue 12): nothing crashes, nothing escapes the state directory, nothing good is
deleted. Every class of bad input either works or ends in ONE deliberate error (a ParslBftError: CheckpointError,
InputError, SiteError, StateError ...) - never a traceback, a hang or an exhausted memory. CLI cases run the CLI
in-process through ``main()``: exit code 2 and a one-line message on stderr."""
from __future__ import annotations

import io
import json
import os
import signal
import stat
from contextlib import redirect_stderr, redirect_stdout, suppress
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsl_bft.errors import InputError, ParslBftError
from parsl_bft.train.checkpoint import CheckpointError, CheckpointStore, TrainingState, load_checkpoint, save_checkpoint

from harness import assert_same, damage_checkpoint
from paths import FIXTURES

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                        HealthCheck.too_slow], derandomize=True)


# --- checkpoints -------------------------------------------------------------------------------------
def small_state(step: int = 3) -> TrainingState:
    torch.manual_seed(step)
    m = torch.nn.Linear(3, 2)
    o = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(1, 3)).sum().backward()
    o.step()
    return TrainingState(model=m.state_dict(), optimizer=o.state_dict(), step=step, epoch=1, samples_done=96,
                         job={"name": "x"}, metrics=[{"step": step, "loss": 1.5}], extra={"freeze_layers": 0})


def same_state(a: TrainingState, b: TrainingState) -> None:
    assert_same(a.model, b.model)
    assert_same(a.optimizer, b.optimizer)
    assert (a.step, a.epoch, a.samples_done, a.data_position) == (b.step, b.epoch, b.samples_done, b.data_position)
    assert (a.job, a.metrics, a.extra) == (b.job, b.metrics, b.extra)


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    st_ = small_state()
    path = save_checkpoint(d / "ckpt-000000003.h5", st_, fsync=False)
    return st_, path.read_bytes(), d


@pytest.mark.slow
def test_1000_single_byte_flips_of_a_real_checkpoint_never_crash(real_checkpoint):
    """Each flipped file either loads to exactly the saved state or raises CheckpointError naming the file
    (HDF5's RuntimeError, MemoryError from a huge declared shape, bad JSON ... all included)."""
    original, data, d = real_checkpoint
    target = d / "flipped.h5"
    outcome = {"loaded": 0, "damaged": 0}

    @settings(FAST, max_examples=1000)
    @given(pos=st.integers(0, len(data) - 1), xor=st.integers(1, 255))
    def flip(pos, xor):
        b = bytearray(data)
        b[pos] ^= xor
        target.write_bytes(b)
        try:
            got = load_checkpoint(target)
        except CheckpointError as e:
            assert str(target) in str(e)
            outcome["damaged"] += 1
            return
        same_state(original, got)
        outcome["loaded"] += 1

    flip()
    assert sum(outcome.values()) >= 1000 and outcome["damaged"] > 0


def _rewrite(path: Path, edit) -> None:
    with h5py.File(path, "r+") as f:
        edit(f)


@pytest.mark.parametrize("case", ["external-link", "soft-link", "external-raw", "virtual", "huge-shape",
                                  "deep-json", "newer-version", "string-dataset", "chunked"])
def test_crafted_checkpoints_are_refused_before_anything_is_read(tmp_path, case):
    """A checkpoint staged from another site is input: it may not read other files (external links, external raw
    storage, virtual datasets) nor make us allocate more than its own size."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    p = save_checkpoint(tmp_path / "ckpt-000000001.h5", small_state(1), fsync=False)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["w"] = np.zeros((2, 3), np.float32)

    def edit(f):
        w = f["model/k0"]
        attrs = dict(w.attrs)
        if case in ("external-link", "soft-link", "external-raw", "virtual", "huge-shape", "string-dataset",
                    "chunked"):
            del f["model/k0"]
        if case == "external-link":
            f["model/k0"] = h5py.ExternalLink(str(other), "/w")
        elif case == "soft-link":
            f["model/k0"] = h5py.SoftLink("/model/k1")
        elif case == "external-raw":
            f["model"].create_dataset("k0", shape=(2, 3), dtype=np.float32, external=[(str(secret), 0, 24)])
        elif case == "virtual":
            layout = h5py.VirtualLayout(shape=(2, 3), dtype=np.float32)
            layout[:] = h5py.VirtualSource(str(other), "w", shape=(2, 3))
            f["model"].create_virtual_dataset("k0", layout)
        elif case == "huge-shape":
            f["model"].create_dataset("k0", shape=(10**6, 10**5), dtype=np.float64)   # 800 GB declared
        elif case == "string-dataset":
            f["model"].create_dataset("k0", data=np.array([b"x" * 10] * 6).reshape(2, 3))
        elif case == "chunked":
            f["model"].create_dataset("k0", data=np.zeros((2, 3), np.float32), chunks=(1, 3), compression="gzip")
        elif case == "deep-json":
            f["model"].attrs["__keys__"] = "[" * 100_000 + "]" * 100_000
        elif case == "newer-version":
            f.attrs["version"] = 99
        if case not in ("deep-json", "newer-version") and "k0" in f["model"] and \
                not isinstance(f["model"].get("k0", getlink=True), (h5py.ExternalLink, h5py.SoftLink)):
            for k, v in attrs.items():
                f["model/k0"].attrs[k] = v
    _rewrite(p, edit)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(p)
    assert str(p) in str(e.value)
    if case not in ("deep-json", "newer-version"):
        assert e.value.dataset == "/model/k0", str(e.value)
    expect = {"external-link": "only hard links", "soft-link": "only hard links", "external-raw": "external raw",
              "virtual": "virtual", "huge-shape": "more than the whole file", "deep-json": "RecursionError",
              "newer-version": "newer parsl-bft", "string-dataset": "not allowed", "chunked": "chunked"}[case]
    assert expect in str(e.value)
    assert CheckpointStore(tmp_path).latest() is None             # and the store skips it (sets it aside)


def test_a_checkpoint_whose_datasets_declare_more_than_the_file_in_total_is_refused(tmp_path):
    """Declared sizes were checked one by one: a 157 KB file of 300 datasets declaring 140 KB each (storage never
    allocated, so each is read as its fill value) loaded as 42 MB. Here two datasets each declare 60% of the file."""
    p = save_checkpoint(tmp_path / "ckpt-000000001.h5", small_state(1), fsync=False)
    each = int(p.stat().st_size * 0.6) // 8

    def edit(f):
        for k in ("k0", "k1"):
            attrs = dict(f[f"model/{k}"].attrs)
            del f[f"model/{k}"]
            f["model"].create_dataset(k, shape=(each,), dtype=np.float64)      # declared, never written
            for a, v in attrs.items():
                f[f"model/{k}"].attrs[a] = v
    _rewrite(p, edit)
    assert each * 8 < p.stat().st_size < 2 * each * 8
    with pytest.raises(CheckpointError, match=r"the datasets declare [\d,]+ bytes together, more than the whole "
                                              r"file"):
        load_checkpoint(p)


@pytest.mark.parametrize("what", ["directory", "dev-zero", "missing", "empty"])
def test_not_a_checkpoint_file(tmp_path, what):
    p = {"directory": tmp_path, "dev-zero": Path("/dev/zero"), "missing": tmp_path / "nope.h5",
         "empty": tmp_path / "empty.h5"}[what]
    if what == "empty":
        p.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"not a regular file|cannot read|not a readable HDF5"):
        load_checkpoint(p)


def test_keep_last_k_never_deletes_the_newest_good_nor_the_one_just_written(tmp_path):
    """K damaged checkpoints newer than the job (it fell back behind them): the next save keeps itself and the
    last good one; the damaged files are moved aside into damaged/, not counted and not deleted."""
    store = CheckpointStore(tmp_path, keep=2)
    for s in (1, 2):
        store.save(small_state(s), fsync=False)
    for s in (10, 11):
        p = save_checkpoint(tmp_path / f"ckpt-{s:09d}.h5", small_state(s), fsync=False)
        damage_checkpoint(p)
    new = store.save(small_state(3), fsync=False)                   # without a latest() first
    assert new.exists()
    assert [p.name for p in store.paths()] == ["ckpt-000000003.h5", "ckpt-000000002.h5"]
    assert len(list((tmp_path / "damaged").iterdir())) == 2
    same_state(small_state(3), store.latest())
    # ... and after a fallback (latest() sets the damaged newest aside at once)
    damage_checkpoint(tmp_path / "ckpt-000000003.h5")
    assert store.latest().step == 2 and len(store.skipped) == 1
    assert [p.name for p in store.paths()] == ["ckpt-000000002.h5"]
    store.save(small_state(4), fsync=False)
    assert [p.name for p in store.paths()] == ["ckpt-000000004.h5", "ckpt-000000002.h5"]
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt-000000004.h5").st_mode) == 0o600


def test_non_finite_loss_or_weights_fail_the_fragment_and_keep_the_last_finite_checkpoint(tmp_path):
    from parsl_bft.train.fragment import FragmentConfig, FragmentFailed, _Saver, train_rank
    from parsl_bft.train.protocol import JobDir
    poisoned = tmp_path / "poisoned.py"
    poisoned.write_text("from parsl_bft.train.workloads import SyntheticImages\n"
                        "class Poisoned(SyntheticImages):\n"
                        "    def loss(self, model, batch):\n"
                        "        return super().loss(model, batch) * float('nan')\n")
    d = tmp_path / "job"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        base = dict(job="nan", checkpoint_dir=str(d), global_batch=16, fsync=False, deterministic=False,
                    workload_args={"n": 64})
        train_rank(FragmentConfig(workload="images", steps=2, **base))
        before = (d / "ckpt-000000002.h5").read_bytes()
        with pytest.raises(FragmentFailed, match="loss is nan at step 3"):
            train_rank(FragmentConfig(workload=f"{poisoned}:Poisoned", steps=5, **base))
        assert [p.name for p in CheckpointStore(d).paths()] == ["ckpt-000000002.h5"]
        assert (d / "ckpt-000000002.h5").read_bytes() == before
        bad = small_state(7)
        bad.model["weight"][0, 0] = float("inf")
        cfg = FragmentConfig(workload="images", steps=1, **base)
        with pytest.raises(FragmentFailed, match="weight weight is not finite"):
            _Saver(cfg, CheckpointStore(d), JobDir(d)).save(bad)
        assert [p.name for p in CheckpointStore(d).paths()] == ["ckpt-000000002.h5"]
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


# --- site files --------------------------------------------------------------------------------------
SLURM_SITE = "name: s\nscheduler: slurm\npartition: backfill\nnode: {cores: 4}\n"


@pytest.mark.parametrize("field,value", [
    ("partition", "backfill\\n#SBATCH --uid=0"), ("account", "proj; rm -rf ~"), ("preemptable_qos", "a b"),
    ("interchange_address", "host\\tx"), ("name", "../x"), ("checkpoint_dir", "/a\\x07b"),
    ("scheduler_options", ["--exclusive\\necho owned"]), ("worker_init", "module load x\\x1b[2J")])
def test_site_values_cannot_add_lines_to_a_batch_script(tmp_path, field, value):
    from parsl_bft.sites import SiteError, load_site
    doc = SLURM_SITE.replace("partition: backfill\n", "") if field == "partition" else SLURM_SITE
    doc = doc.replace("name: s\n", "") if field == "name" else doc
    f = tmp_path / "s.yaml"
    f.write_text(doc + f"{field}: {json.dumps(value).replace(chr(92) + chr(92), chr(92))}\n")
    with pytest.raises(SiteError, match=f"field '{field}"):
        load_site(f)


SECRETS = ["AWS_SECRET_ACCESS_KEY=abcd1234", "--password hunter2", "Authorization: Bearer abcdef123456",
           "curl -H 'authorization: token xyz'", "--token=abc", "GITHUB_TOKEN: x", "ghp_" + "a" * 36,
           "AKIA" + "B" * 16, "https://user:pass@example.org/x", "export API_KEY=1"]


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("where", ["worker_init", "scheduler_options", "account"])
def test_secrets_are_refused_in_every_string_field_and_list_item_and_never_printed(tmp_path, where, secret):
    f = tmp_path / "s.yaml"
    value = [f"--comment={secret}"] if where == "scheduler_options" else secret
    f.write_text(SLURM_SITE + f"{where}: {json.dumps(value)}\n")
    rc, out, err = run_cli(["sites", "show", str(f)])
    assert rc == 2 and out == ""
    assert "looks like a secret" in err or where == "account"      # an account must be a token anyway
    for piece in ("abcd1234", "hunter2", "abcdef123456", "xyz", "a" * 36, "B" * 16, "pass@"):
        if piece in secret:
            assert piece not in err


def test_pilot_scripts_are_private_and_quote_paths(tmp_path):
    from fakes import canned_pbs

    from parsl_bft.execution.pbs import PBSCommands, PBSPilotProvider
    d = tmp_path / "dir with space"
    prov = PBSPilotProvider("preemptable", commands=PBSCommands(canned_pbs([])), script_dir=str(d))
    prov.submit("process_worker_pool.py", 1, "pilot")
    script = next(d.glob("pilot.*.sh"))
    assert stat.S_IMODE(script.stat().st_mode) == 0o700 and stat.S_IMODE(d.stat().st_mode) == 0o700
    text = script.read_text()
    assert f'#PBS -o "{d}/"' in text and f"BFT_MARK='{d}'/" in text


# --- the CLI: one line, exit code 2, no traceback --------------------------------------------------
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    import warnings

    from parsl_bft.cli import main
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _row(j, sub, wait, run, n):
    return f"{j} {sub} {wait} {run} {n} -1 -1 {n} 3600 -1 1 1 1 -1 1 -1 -1 -1\n"


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    import gzip
    d = tmp_path_factory.mktemp("bad")
    hdr = "; MaxNodes: 4\n; MaxProcs: 4\n"
    (d / "nan.swf").write_text(hdr + _row(1, 0, 0, 100, 2) + _row(2, 10, 5, "nan", 2) + _row(3, 20, 0, 100, 2))
    (d / "inf.swf").write_text(hdr + _row(1, 0, 0, 100, 2) + _row(2, 10, 5, "1e400", 2))
    (d / "maxnodes.swf").write_text("; MaxNodes: 1000000000\n" + _row(1, 0, 0, 100, 2) + _row(2, 10, 5, 100, 2))
    (d / "hugejob.swf").write_text(_row(1, 0, 0, 100, 2) + _row(2, 10, 5, 100, 1_000_000_000))
    (d / "nowait.swf").write_text(hdr + _row(1, 0, 0, 100, 2) + _row(2, 10, 0, 100, 2) + _row(3, 200, 0, 100, 1))
    (d / "infend.csv").write_text("node,idle_start,idle_end\na,0,10\nb,5,inf\n")
    (d / "zero.csv").write_text("node,idle_start,idle_end\na,10,10\nb,5,5\n")
    (d / "badutf.csv").write_bytes(b"node,idle_start,idle_end\n\xff\xfe,0,10\n")
    gz = gzip.compress(b"node,idle_start,idle_end\na,0,10\nb,5,20\n" * 50)
    (d / "trunc.csv.gz").write_bytes(gz[: len(gz) // 2])
    broken = bytearray(gz)
    broken[20] ^= 0xFF
    broken[25] ^= 0xFF
    (d / "corrupt.csv.gz").write_bytes(bytes(broken))
    (d / "notgz.csv.gz").write_bytes(b"node,idle_start,idle_end\na,0,10\n")
    (d / "dir.swf").mkdir()
    (d / "bigfield.csv").write_text('node,idle_start,idle_end\n"' + "x" * 200_000 + '",0,10\n')
    (d / "deep.yaml").write_text("jobs: " + "[" * 100_000 + "]" * 100_000 + "\n")
    job = "{name: a, model: m, min_nodes: 1, max_nodes: %s, t_up: 1, t_down: 1, samples: 10}"
    (d / "tinyrate.yaml").write_text(f"jobs:\n  - {job % 2}\nscaling:\n  m: {{1: 1e-300, 2: 2e-300}}\n")
    (d / "hugenodes.yaml").write_text(f"jobs:\n  - {job % '1e12'}\nscaling:\n  m: {{1: 10}}\n")
    (d / "notlist.yaml").write_text("jobs: 5\n")
    (d / "scalingnotmap.yaml").write_text(f"jobs:\n  - {job % 2}\nscaling: [1, 2]\n")
    (d / "nan.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\na,m,1,2,nan,1,10,0\n")
    (d / "nan.scaling.csv").write_text("model,nodes,samples_per_sec\nm,1,10\n")
    (d / "ok.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\na,m,1,2,1,1,10,0\n")
    (d / "ok.scaling.csv").write_text("model,nodes,samples_per_sec\nm,1,10\nm,2,19\n")
    for s in ("corrupt", "empty", "nojobs"):
        (d / f"state_{s}").mkdir()
    (d / "state_corrupt" / "state.sqlite").write_bytes(b"garbage" * 100)
    (d / "state_empty" / "state.sqlite").write_bytes(b"")
    (d / "newline.yaml").write_text(SLURM_SITE.replace("backfill", '"backfill\\n#SBATCH --uid=0"'))
    (d / "topo.yaml").write_text("topology: {groups: [\n")
    (d / "topo.conf").write_bytes(b"\xff\xfeSwitchName=s1 Nodes=a\n")
    (d / "header.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n")
    (d / "header.scaling.csv").write_text("model,nodes,samples_per_sec\nm,1,10\n")
    (d / "lvl0.jobs.csv").write_text((d / "ok.jobs.csv").read_text())
    (d / "lvl0.scaling.csv").write_text("model,nodes,samples_per_sec,freeze,layers,frozen_compute,frozen_params\n"
                                        "m,1,10,0,3,0.5,0.5\nm,2,19,,,,\n")
    return d


OK_CSV = str(FIXTURES / "summit_idle_head.csv")
CLI_CASES = {     # name: (argv with {d} for the folder of bad files, what the one line must say)
    "swf NaN run time": (["idle", "{d}/nan.swf"], "nan.swf:4: field '4 (run time)' not a finite number"),
    "swf NaN, easy replay": (["idle", "{d}/nan.swf", "--schedule", "easy"], "nan.swf:4: field '4 (run time)'"),
    "swf overflowing run time": (["idle", "{d}/inf.swf"], "inf.swf:4: field '4 (run time)'"),
    "swf MaxNodes 1e9": (["idle", "{d}/maxnodes.swf"], "maxnodes.swf:1: field 'MaxNodes' 1,000,000,000 nodes"),
    "swf a 1e9-node job": (["idle", "{d}/hugejob.swf"], "hugejob.swf:2: field '5 (allocated processors)'"),
    "intervals ending at inf": (["idle", "{d}/infend.csv"], "infend.csv:3: field 'idle_end' not a finite time"),
    "zero-length intervals only": (["idle", "{d}/zero.csv"], "zero.csv: field 'idle_end' every interval has zero"),
    "not UTF-8": (["idle", "{d}/badutf.csv"], "badutf.csv:1: not UTF-8 text"),
    "truncated gz": (["idle", "{d}/trunc.csv.gz"], "trunc.csv.gz:2: damaged gzip data"),
    "corrupt gz": (["idle", "{d}/corrupt.csv.gz"], "corrupt.csv.gz:1: damaged gzip data"),
    "not gzip at all": (["idle", "{d}/notgz.csv.gz"], "notgz.csv.gz:1: damaged gzip data"),
    "a CSV field over the size limit": (["idle", "{d}/bigfield.csv"], "bigfield.csv:2: not valid CSV"),
    "a directory as the source": (["idle", "{d}/dir.swf"], "dir.swf: is a directory"),
    "a header-only job set": (["jobs", "{d}/header.jobs.csv"], "header.jobs.csv: no jobs in this job set"),
    "a window starting at nan": (["idle", OK_CSV, "--window", "nan/+1h"], "not a time: 'nan'"),
    "a directory as the workflow": (["run", "{d}/dir.swf"], "dir.swf is not a file: give the workflow's Python"),
    "demo --out where no folder can be": (["demo", "--out", "/proc/parsl-bft-nowhere"], "cannot make that folder"),
    "/dev/zero as the source": (["idle", "/dev/zero"], "/dev/zero: not a regular file"),
    "missing source": (["idle", "{d}/nope.csv"], "nope.csv: no such file"),
    "idle --json into a missing folder": (["idle", OK_CSV, "--json", "{d}/no/x.json"], "--json: no such directory"),
    "idle --plot into a missing folder": (["idle", OK_CSV, "--plot", "{d}/no/x.png"], "--plot: no such directory"),
    "simulate --tfwd nan": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv", "--tfwd", "nan"],
                            "t_fwd must be a finite number > 0"),
    "simulate --json into a missing folder": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv",
                                               "--json", "{d}/no/x.json"], "--json: no such directory"),
    "simulate on a /dev/zero log": (["simulate", "--swf", "/dev/zero", "--jobs", "{d}/ok.jobs.csv"],
                                    "/dev/zero: not a regular file"),
    "YAML nested 100k deep": (["jobs", "{d}/deep.yaml"], "deep.yaml: not valid YAML: nested too deeply"),
    "scaling rate 1e-300": (["jobs", "{d}/tinyrate.yaml"], "field 'scaling.m'"),
    "a 1e12-node job": (["jobs", "{d}/hugenodes.yaml"], "hugenodes.yaml:1: field 'max_nodes'"),
    "jobs not a list": (["jobs", "{d}/notlist.yaml"], "notlist.yaml: field 'jobs'"),
    "scaling not a mapping": (["jobs", "{d}/scalingnotmap.yaml"], "scalingnotmap.yaml: field 'scaling'"),
    "NaN in a jobs CSV": (["jobs", "{d}/nan.jobs.csv"], "nan.jobs.csv:2: field 't_up' not a finite number"),
    "corrupt state database": (["status", "{d}/state_corrupt"], "is damaged or not an orchestrator's"),
    "0-byte state database": (["status", "{d}/state_empty"], "move state.sqlite aside"),
    "no state database": (["status", "{d}/state_nojobs"], "no orchestrator state"),
    "newline in a partition": (["sites", "show", "{d}/newline.yaml"], "field 'partition': must be one token"),
    "a directory as a site file": (["sites", "show", "{d}/dir.swf"], "dir.swf: is a directory"),
    "demo --speedup nan": (["demo", "--speedup", "nan"], "--speedup must be a finite number"),
    "profile --ranks x": (["profile", "images", "--ranks", "1,x"], "--ranks '1,x'"),
    "profile an unknown workload": (["profile", "nosuch"], "unknown workload 'nosuch'"),
    "profile a missing workload file": (["profile", "{d}/nope.py:make"], "cannot load workload"),
    "profile --steps 0": (["profile", "images", "--steps", "0"], "--steps must be >= 1, got 0"),
    "profile --freeze-layers -1": (["profile", "images", "--freeze-layers", "-1"], "--freeze-layers must be >= 0"),
    "profile --freeze-layers above the model": (["profile", "images", "--freeze-layers", "4", "--steps", "1"],
                                                "--freeze-layers 4: images has 4 layers; levels go up to 3"),
    "simulate --nodes 0": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv", "--nodes", "0"],
                           "--nodes must be >= 1, got 0"),
    "simulate --duration 0": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv", "--duration",
                               "0s"], "--duration '0s': must be > 0"),
    "simulate --cluster 0": (["simulate", "--cluster", "0", "--jobs", "{d}/ok.jobs.csv"],
                             "--cluster needs 1 to 1,000,000 nodes, got 0"),
    "simulate --cluster 1e10": (["simulate", "--cluster", "10000000000", "--jobs", "{d}/ok.jobs.csv"],
                                "got 10,000,000,000"),
    "topology not valid YAML": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv", "--topology",
                                 "{d}/topo.yaml"], "topo.yaml:2: not valid YAML"),
    "topology not UTF-8": (["simulate", "--idle-intervals", OK_CSV, "--jobs", "{d}/ok.jobs.csv", "--topology",
                            "{d}/topo.conf"], "topo.conf: not UTF-8 text"),
    "frozen shares at freeze level 0": (["jobs", "{d}/lvl0.jobs.csv"],
                                        "lvl0.scaling.csv:2: field 'frozen_compute' freeze level 0 freezes nothing"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_every_command_given_bad_input_exits_2_with_one_line_and_no_traceback(bad, case):
    argv, expect = CLI_CASES[case]
    rc, _out, err = run_cli([a.replace("{d}", str(bad)) for a in argv])
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith(f"parsl-bft {argv[0]}: error: "), err
    assert expect in lines[0] and "Traceback" not in err


def test_a_training_function_called_with_anything_but_ctx_is_refused_naming_its_signature(tmp_path):
    from parsl_bft.train.check import check_signature as _check_signature
    _check_signature(lambda ctx, lr=0.1: None, "f.py:ok")
    for fn, expect in ((lambda ctx, extra: None, r"takes \(ctx, extra\)"), (lambda: None, r"takes \(\)"),
                       (5, "is a int, not a function")):
        with pytest.raises(ValueError, match=f"training function 'f.py:x' {expect}.*def train"):
            _check_signature(fn, "f.py:x")


@pytest.mark.slow
def test_a_training_loop_that_never_calls_should_stop_fails_within_a_prefetch_of_batches(tmp_path):
    """It took batches for ever: no notice, deadline or budget reached it (should_stop is where they are read),
    so a reclaim left the rank running on nodes given back. A DataLoader may fetch up to PREFETCH_BATCHES ahead
    of the steps; one more fails the fragment."""
    from parsl_bft.train.fragment import FragmentConfig, FragmentFailed
    from parsl_bft.train.launcher import run_fragment
    (tmp_path / "user.py").write_text("def train(ctx):\n    for idx in ctx.batches(256):\n        pass\n")
    with pytest.raises(FragmentFailed, match=r"took 33 batches in 0 steps without calling ctx.should_stop\(\)"):
        run_fragment(FragmentConfig(job="a", workload="unused", loop=f"{tmp_path / 'user.py'}:train", steps=3,
                                    checkpoint_dir=str(tmp_path / "j"), global_batch=32, fsync=False,
                                    timeout_s=60))


def test_status_reads_only(bad):
    before = (bad / "state_empty" / "state.sqlite").stat()
    run_cli(["status", str(bad / "state_empty")])
    assert (bad / "state_empty" / "state.sqlite").stat().st_size == before.st_size == 0
    assert sorted(p.name for p in (bad / "state_empty").iterdir()) == ["state.sqlite"]
    from parsl_bft.execution.jobstore import JobStore
    db = JobStore(bad / "state_ok" / "state.sqlite")
    db.add("a", {"name": "a", "samples": 10})
    db.close()
    before = (bad / "state_ok" / "state.sqlite").read_bytes()
    rc, out, _err = run_cli(["status", str(bad / "state_ok")])
    assert rc == 0 and "waiting" in out
    assert (bad / "state_ok" / "state.sqlite").read_bytes() == before
    assert sorted(p.name for p in (bad / "state_ok").iterdir()) == ["state.sqlite"]


def test_debug_shows_the_traceback(bad):
    from parsl_bft.errors import InputError
    with pytest.raises(InputError):
        run_cli(["--debug", "idle", str(bad / "zero.csv")])
    with pytest.raises(InputError):
        run_cli(["idle", "--debug", str(bad / "zero.csv")])


def test_a_log_in_which_no_job_waits_is_fine(bad):
    rc, out, _err = run_cli(["idle", str(bad / "nowait.swf")])
    assert rc == 0 and "idle fraction" in out


# --- property-based: whatever the lines, a result or an InputError -----------------------------------
_FIELD = st.one_of(st.integers(-5, 10**6).map(str), st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "1e13",
                                                                      "x", "0x1f", "", "1.5", "1e9"]))


@settings(FAST, max_examples=120)
@given(rows=st.lists(st.lists(_FIELD, min_size=16, max_size=19), min_size=1, max_size=6),
       header=st.sampled_from(["", "; MaxNodes: 8\n; MaxProcs: 8\n", "; MaxNodes: 1e9\n", "; MaxNodes: nan\n",
                               "; MaxNodes: 4\n; MaxProcs: 2\n"]),
       schedule=st.sampled_from(["recorded", "easy"]))
def test_swf_lines_give_a_trace_or_an_input_error(tmp_path, rows, header, schedule):
    from parsl_bft.idle.sources import load_source
    from parsl_bft.idle.stats import idle_stats
    f = tmp_path / "h.swf"
    f.write_text(header + "".join(" ".join(r or ["1"]) + "\n" for r in rows))
    try:
        src = load_source(f, schedule=schedule, lenient=False)
        idle_stats(src.intervals, src.intervals, src.schedule)
    except ParslBftError:
        pass


_TIME = st.one_of(st.integers(-10, 10**6).map(str), st.sampled_from(["nan", "inf", "1e13", "", "x", "3.5"]))


@settings(FAST, max_examples=120)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", "", "c d"]), _TIME, _TIME), min_size=1, max_size=8),
       lenient=st.booleans())
def test_interval_csv_rows_give_intervals_or_an_input_error(tmp_path, rows, lenient):
    import warnings

    from parsl_bft.idle.intervals import read_idle_intervals
    from parsl_bft.idle.sources import mask_outages
    from parsl_bft.idle.stats import idle_stats
    f = tmp_path / "i.csv"
    f.write_text("node,idle_start,idle_end\n" + "".join(",".join(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            iv = read_idle_intervals(f, lenient=lenient)
        except ParslBftError:
            return
    st_ = idle_stats(iv, mask_outages(iv))
    assert all(np.isfinite(v) for v in (st_.idle_fraction, st_.idle_fraction_raw, st_.span_s))


_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
_YAML = st.recursive(_SCALAR,
                     lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
                     max_leaves=12)
_JOB_KEYS = ["name", "model", "min_nodes", "max_nodes", "t_up", "t_down", "samples", "weight", "deadline"]


@settings(FAST, max_examples=120)
@given(doc=st.one_of(_YAML, st.fixed_dictionaries({
    "jobs": st.one_of(_YAML, st.lists(st.dictionaries(st.sampled_from(_JOB_KEYS), _YAML, max_size=9), max_size=3)),
    "scaling": st.one_of(_YAML, st.dictionaries(st.text(max_size=3), st.dictionaries(_SCALAR, _YAML, max_size=3),
                                                max_size=2))})))
@pytest.mark.slow
def test_yaml_job_sets_of_any_shape_give_a_job_set_or_an_input_error(tmp_path, doc):
    import yaml

    from parsl_bft.jobs import read_jobset_yaml
    f = tmp_path / "j.yaml"
    f.write_text(yaml.safe_dump(doc))
    with suppress(ParslBftError):
        read_jobset_yaml(f)


_SITE_KEYS = ["name", "scheduler", "partition", "queue", "account", "preemptable_qos", "node", "worker_init",
              "scheduler_options", "interchange_address", "checkpoint_dir", "holes", "objective", "unverified"]


@settings(FAST, max_examples=80)
@given(doc=st.dictionaries(st.sampled_from(_SITE_KEYS), _YAML, max_size=8))
def test_site_files_of_any_shape_give_a_site_or_a_site_error(tmp_path, doc):
    import yaml

    from parsl_bft.sites import SiteError, load_site
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "scheduler": "slurm", "partition": "p", "node": {"cores": 1}, **doc}))
    with suppress(SiteError):
        load_site(f)


@pytest.mark.parametrize("text", ["[1, 2]", '{"pids": [123]}', '{"pids": {"abc": "1"}}', '{"pids": {"1": 5}}', "7"])
def test_a_rank_pid_file_of_another_shape_is_passed_over(tmp_path, text):
    """Valid JSON of another shape failed every restart (AttributeError while killing a predecessor's ranks)."""
    from parsl_bft.train.protocol import JobDir, hostname
    (tmp_path / f".ranks-{hostname()}-f-1.pid").write_text(text)
    assert JobDir(tmp_path).kill_ranks() == 0
    assert not list(tmp_path.glob(".ranks-*"))          # junk of a dead run is cleared like a real record


def test_a_file_that_is_not_csv_is_not_echoed_in_the_error(tmp_path):
    """A job-set path may point at anything: its first line (here a password hash) was quoted as the 'header'."""
    from parsl_bft.jobs import read_jobs_csv
    p = tmp_path / "shadow"
    p.write_text("root:$6$secrethash:19000:0:99999:7:::\n")
    with pytest.raises(InputError, match="its first line is not a CSV header") as e:
        read_jobs_csv(p)
    assert "secrethash" not in str(e.value)
    p.write_text("name,model\na,m\n")                # a CSV header is named, to say what is missing
    with pytest.raises(InputError, match=r"missing column.*; header is name,model$"):
        read_jobs_csv(p)


# --- property-based, valid inputs: each loader above also loads what is well formed (a loader that refused
# everything would pass the tests above) ----------------------------------------------------------------
_SWF_JOB = st.tuples(st.integers(0, 500), st.integers(0, 300), st.integers(1, 500), st.integers(1, 4))


@settings(FAST, max_examples=40)
@given(jobs=st.lists(_SWF_JOB, min_size=1, max_size=6), schedule=st.sampled_from(["recorded", "easy"]))
def test_valid_swf_logs_load(tmp_path, jobs, schedule):
    """(gap after the previous job's end, wait, run time, nodes) per job on a 4-node machine: one job at a time,
    so the recorded starts fit the machine too."""
    from parsl_bft.idle.sources import load_source
    from parsl_bft.idle.stats import idle_stats
    free_at, lines, starts = 0, [], []
    for i, (gap, wait, run, n) in enumerate(jobs, 1):
        lines.append(_row(i, free_at + gap, wait, run, n))
        starts.append(free_at + gap + wait)
        free_at += gap + wait + run
    f = tmp_path / "v.swf"
    f.write_text("; MaxNodes: 4\n; MaxProcs: 4\n" + "".join(lines))
    src = load_source(f, schedule=schedule, lenient=False)
    stats = idle_stats(src.intervals, src.intervals, src.schedule)
    assert src.intervals.n_nodes == 4 and len(src.schedule.start) == len(jobs)     # every job, the log's machine
    if schedule == "recorded":
        assert list(src.schedule.start) == starts
    assert 0.0 <= stats.idle_fraction <= 1.0


@settings(FAST, max_examples=40)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 10**6), st.integers(1, 10**5)),
                     min_size=1, max_size=8))
def test_valid_interval_csv_rows_load(tmp_path, rows):
    """(node, idle start, length) rows: every node is read, with at least its longest interval's idle time."""
    from parsl_bft.idle.intervals import read_idle_intervals
    f = tmp_path / "i.csv"
    f.write_text("node,idle_start,idle_end\n" + "".join(f"{n},{s},{s + d}\n" for n, s, d in rows))
    iv = read_idle_intervals(f, lenient=False)
    assert sorted(iv.names) == sorted({n for n, _, _ in rows})
    assert float(np.sum(iv.end - iv.start)) >= max(d for _, _, d in rows)


_VALID_JOB = st.tuples(st.just("m"), st.integers(1, 2), st.integers(0, 2), st.floats(0, 100), st.floats(0, 100),
                       st.integers(1, 10**6))


@settings(FAST, max_examples=10)          # a load fits the model's curve (~0.1 s): what varies here is the jobs
@given(jobs=st.lists(_VALID_JOB, min_size=1, max_size=4))
def test_valid_yaml_job_sets_load(tmp_path, jobs):
    """(model, min_nodes, extra nodes, t_up, t_down, samples) per job, the model's curve given."""
    import yaml

    from parsl_bft.jobs import read_jobset_yaml
    doc = {"jobs": [{"name": f"j{i}", "model": m, "min_nodes": lo, "max_nodes": lo + extra, "t_up": up,
                     "t_down": down, "samples": samples} for i, (m, lo, extra, up, down, samples) in enumerate(jobs)],
           "scaling": {"m": {1: 10.0, 2: 19.0, 4: 35.0}}}
    f = tmp_path / "j.yaml"
    f.write_text(yaml.safe_dump(doc))
    js = read_jobset_yaml(f)
    assert [(j.name, j.model, j.min_nodes, j.max_nodes, j.samples) for j in js.jobs] == \
        [(d["name"], d["model"], d["min_nodes"], d["max_nodes"], d["samples"]) for d in doc["jobs"]]
    assert {d["model"] for d in doc["jobs"]} <= set(js.curves)


_TOKEN = st.from_regex(r"[a-z][a-z0-9_-]{0,7}", fullmatch=True)


@settings(FAST, max_examples=40)
@given(name=_TOKEN, partition=_TOKEN, account=st.none() | _TOKEN, cores=st.integers(1, 256),
       gpus=st.integers(0, 8), max_pilots=st.integers(1, 64))
def test_valid_site_files_load(tmp_path, name, partition, account, cores, gpus, max_pilots):
    import yaml

    from parsl_bft.sites import load_site
    doc = {"name": name, "scheduler": "slurm", "partition": partition, "node": {"cores": cores, "gpus": gpus},
           "holes": {"max_pilots": max_pilots}, **({"account": account} if account else {})}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    s = load_site(f)
    assert (s.name, s.partition, s.account, s.node.cores, s.node.gpus, s.holes.max_pilots) == \
        (name, partition, account, cores, gpus, max_pilots)
