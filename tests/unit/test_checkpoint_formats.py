"""Checkpoint format versions: files of formats 1 and 2 written by earlier code still read (tests/data/checkpoints,
see its README), format 3's one metadata record, and a file of a newer format refused with its files kept."""
from __future__ import annotations

import json
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path

import h5py
import pytest
import torch

from parsl_bft.train.checkpoint import (
    CheckpointError,
    CheckpointStore,
    NewerFormatError,
    TrainingState,
    load_checkpoint,
    loading,
    reader,
    save_checkpoint,
)
from parsl_bft.train.checkpoint.format import HEADER, pack_header, record_place

from harness import InlineRunner, assert_same

LEGACY = Path(__file__).resolve().parents[1] / "data" / "checkpoints"


def legacy_state() -> TrainingState:
    """The state the format 1 and 2 files hold: every dtype, a nested optimizer state, no random numbers (its
    values are the same from any torch version)."""
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    model = {"w": w, "b": torch.arange(3, dtype=torch.float64) - 1.5,
             "bf16": (torch.arange(5, dtype=torch.float32) / 3).to(torch.bfloat16),
             "f16": torch.arange(3, dtype=torch.float16) * 0.25, "i64": torch.arange(7) * -3,
             "flags": torch.tensor([True, False]), "u8": torch.arange(4, dtype=torch.uint8),
             "c64": torch.tensor([1 + 2j, -0.5j], dtype=torch.complex64), "empty": torch.zeros(0, 3),
             "scalar": torch.tensor(2.5), "f8": (torch.arange(4, dtype=torch.float32) / 2).to(torch.float8_e4m3fn)}
    optimizer = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": w * 0.1, "exp_avg_sq": w * w}},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                                   "amsgrad": False, "foreach": None, "params": [0]}]}
    scheduler = {"step_size": 5, "gamma": 0.1, "base_lrs": [1e-3], "last_epoch": 3, "_step_count": 4}
    rng = {"torch": torch.arange(16, dtype=torch.uint8), "python": [3, torch.arange(5).numpy(), None]}
    return TrainingState(model=model, optimizer=optimizer, scheduler=scheduler, rng=rng, step=42, epoch=2,
                         samples_done=1344, data_position=320, job={"name": "legacy", "samples": 4096},
                         metrics=[{"step": 41, "loss": 2.25}, {"step": 42, "loss": 2.125}],
                         extra={"freeze_layers": 1})


def write_legacy(directory: Path) -> None:
    """Write ``v2.h5`` and ``v1.h5`` of ``legacy_state()`` with the code checked out (how tests/data/checkpoints
    was made, at a commit that wrote format 2)."""
    import h5py
    directory.mkdir(parents=True, exist_ok=True)
    v2 = save_checkpoint(directory / "v2.h5", legacy_state(), fsync=False)
    v1 = directory / "v1.h5"
    shutil.copyfile(v2, v1)
    with h5py.File(v1, "r+") as f:            # format 1: no metadata checksum
        f.attrs["version"] = 1
        del f.attrs["meta_xxh3"]


def same_state(got: TrainingState, want: TrainingState) -> None:
    for key in ("model", "optimizer", "scheduler"):
        assert_same(getattr(got, key), getattr(want, key))
    assert torch.equal(got.rng["torch"], want.rng["torch"]) and got.rng["python"][0] == 3
    assert list(got.rng["python"][1]) == [0, 1, 2, 3, 4] and got.rng["python"][2] is None
    assert (got.step, got.epoch, got.samples_done, got.data_position) == (42, 2, 1344, 320)
    assert (got.job, got.metrics, got.extra) == (want.job, want.metrics, want.extra)


@pytest.mark.parametrize("version", [1, 2])
def test_files_of_formats_1_and_2_written_by_earlier_code_still_load(tmp_path, version):
    """tests/data/checkpoints holds files written before format 3 (see its README): each loads to exactly the
    state written; format 2 straight into live tensors, format 1 (no metadata checksum) into fresh memory."""
    path = LEGACY / f"v{version}.h5"
    with h5py.File(path, "r") as f:
        assert f.attrs["version"] == version and f.userblock_size == 0
    want = legacy_state()
    same_state(load_checkpoint(path), want)
    live = {k: torch.zeros_like(v) for k, v in want.model.items()}
    got = load_checkpoint(path, into=live)
    same_state(got, want)
    assert (got.model["w"] is live["w"]) == (version == 2)
    assert load_checkpoint(path, arrays=False).model["w"] is None


def test_a_format_3_restore_reads_its_record_not_the_hdf5_tree(tmp_path, monkeypatch):
    """Format 3: the tree, dtypes, shapes and checksums come from the one record in the user block; no HDF5 group
    or dataset is opened by name and one attribute is read (each such call ~130 us): the metrics history, kept
    once. The state is the one the HDF5 tree holds (read the long way, as format 2 is)."""
    path = save_checkpoint(tmp_path / "c.h5", legacy_state(), fsync=False)
    with h5py.File(path, "r") as f:
        assert f.attrs["version"] == 3 and f.userblock_size >= HEADER
    monkeypatch.setattr(reader, "_read_indexed", lambda r, into: None)
    slow = load_checkpoint(path)
    monkeypatch.undo()

    def refused(*a, **k):
        raise AssertionError("a per-object HDF5 call during a format-3 restore")
    group = h5py.Group.__getitem__
    monkeypatch.setattr(h5py.Group, "__getitem__", lambda g, name: group(g, name) if name == "/" else refused())
    monkeypatch.setattr(reader, "_read_state", refused)
    attrs = []
    read_attr = h5py.AttributeManager.__getitem__
    monkeypatch.setattr(h5py.AttributeManager, "__getitem__", lambda m, name: attrs.append(name) or read_attr(m, name))
    live = {k: torch.zeros_like(v) for k, v in legacy_state().model.items()}
    fast = load_checkpoint(path, into=live)
    assert attrs == ["metrics"]                 # the history that grows with each step: kept once, as an attribute
    _, length, _ = record_place(path.read_bytes()[:HEADER])
    assert b"loss" not in path.read_bytes()[HEADER:HEADER + length]
    assert fast.model["w"] is live["w"]
    same_state(fast, legacy_state())
    same_state(slow, legacy_state())


def _rewrite_record(path: Path, edit) -> None:
    """Replace a format-3 file's record by ``edit(record)``, its checksum recomputed (as a crafted file would)."""
    data = bytearray(path.read_bytes())
    userblock, length, _ = record_place(bytes(data[:HEADER]))
    rec = json.loads(bytes(data[HEADER:HEADER + length]))
    edit(rec)
    raw = json.dumps(rec).encode()
    assert HEADER + len(raw) <= userblock
    data[:HEADER + len(raw)] = pack_header(3, userblock, raw) + raw
    path.write_bytes(data)


def test_a_damaged_record_or_header_falls_back_to_the_hdf5_tree(tmp_path):
    """The record is an index: when its checksum or the header's fails, the file is read the long way and loads
    exactly; only damage in the tree itself or the data refuses it."""
    want = legacy_state()
    for pos in (3, 18, 40, HEADER + 10):          # magic, version, record checksum, the record
        path = save_checkpoint(tmp_path / f"c{pos}.h5", want, fsync=False)
        data = bytearray(path.read_bytes())
        data[pos] ^= 0x20
        path.write_bytes(data)
        same_state(load_checkpoint(path), want)


def test_declared_sizes_adding_up_past_the_file_are_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    """300 entries sharing one 140 KB dataset's bytes would load a small file as 42 MB: refused by the sum of
    the declared sizes, before any memory is allocated - in a format-3 record (its checksum made to match) and
    in the HDF5 tree of a format-1 file (hard links to one dataset)."""
    def allocated(*a, **k):
        raise AssertionError("memory allocated for a checkpoint refused by its declared sizes")
    big = {"w": torch.arange(35_000, dtype=torch.float32)}                         # 140 KB
    small = {f"s{i}": torch.zeros(1) for i in range(299)}                           # (room for a long record)
    path = save_checkpoint(tmp_path / "r.h5", TrainingState(model={**big, **small}), fsync=False)
    assert path.stat().st_size < 400_000                                          # 100x less than 42 MB

    def share(rec):
        rec["data"] = rec["data"][:1] * 300
        rec["parts"]["model"] = ["dict", [["str", f"w{i}", ["array", i]] for i in range(300)]]
    _rewrite_record(path, share)
    monkeypatch.setattr(loading, "_empty", allocated)
    with pytest.raises(CheckpointError, match=r"declare 42,000,000 bytes together, more than the whole file"):
        load_checkpoint(path)

    v1 = save_checkpoint(tmp_path / "v1.h5", TrainingState(model=dict(big)), fsync=False)
    with h5py.File(v1, "r+") as f:
        f.attrs["version"] = 1
        del f.attrs["meta_xxh3"]
        for i in range(1, 300):
            f[f"model/k{i}"] = f["model/k0"]                                    # a hard link: the same bytes
        f["model"].attrs["__keys__"] = json.dumps([["str", f"w{i}"] for i in range(300)])
    with pytest.raises(CheckpointError, match=r"declare [\d,]+ bytes together, more than the whole file"):
        load_checkpoint(v1)
    monkeypatch.undo()
    with h5py.File(v1, "r+") as f:                                               # the same file, each name once
        f["model"].attrs["__keys__"] = json.dumps([["str", "w0"]])
    assert torch.equal(load_checkpoint(v1).model["w0"], big["w"])


def test_a_record_that_verifies_but_does_not_hold_together_is_refused(tmp_path):
    """A record whose checksum matches was written so (or crafted): data outside the file, overlapping data, a
    type no checkpoint holds, a dataset in no tree - each refused with what is wrong, not read the long way."""
    cases = {"outside": lambda rec: rec["data"][0].__setitem__(6, 10**12),
             "overlap": lambda rec: rec["data"][1].__setitem__(6, rec["data"][0][6]),
             "type": lambda rec: rec["data"][0].__setitem__(1, "|O"),
             "orphan": lambda rec: rec["parts"]["model"][1].pop()}
    expect = {"outside": "overlaps other data or lies outside the file", "overlap": "overlaps other data",
              "type": "not allowed", "orphan": "belongs to no tree"}
    for name, edit in cases.items():
        path = save_checkpoint(tmp_path / f"{name}.h5", TrainingState(model={"a": torch.ones(8), "b": torch.ones(4)}),
                               fsync=False)
        _rewrite_record(path, edit)
        with pytest.raises(CheckpointError, match="damaged metadata record") as e:
            load_checkpoint(path)
        assert expect[name] in str(e.value), name


def as_newer_format(path: Path, version: int = 4) -> None:
    """Make ``path`` what a later parsl-bft's file looks like to this one: the header's version and stamp (the
    part every format keeps) say ``version``."""
    data = bytearray(path.read_bytes())
    userblock, length, _ = record_place(bytes(data[:HEADER]))
    data[:HEADER] = pack_header(version, userblock, bytes(data[HEADER:HEADER + length]))
    path.write_bytes(data)


def test_a_newer_formats_checkpoint_is_refused_and_kept_not_passed_over(tmp_path):
    """A checkpoint of a newer format is not damaged: load_checkpoint refuses it naming the format (so too a
    newer file that is not even HDF5: the header decides); the store keeps it where it is, does not resume from
    the older checkpoint behind it, keeps it when an older step is saved, and stages it as it is."""
    store = CheckpointStore(tmp_path / "job")
    store.save(legacy_state(), fsync=False)
    newer = save_checkpoint(tmp_path / "job" / "ckpt-000000099.h5", replace(legacy_state(), step=99), fsync=False)
    as_newer_format(newer)
    with pytest.raises(NewerFormatError, match=r"written by a newer parsl-bft \(checkpoint format 4; this one reads "
                       r"up to 3\): upgrade parsl-bft") as e:
        load_checkpoint(newer)
    assert e.value.version == 4 and str(newer) in str(e.value)
    with pytest.raises(NewerFormatError):
        store.latest(arrays=False)
    store.save(replace(legacy_state(), step=50), fsync=False)
    assert newer.exists() and not (tmp_path / "job" / "damaged").exists()
    assert store.paths()[0] == newer
    staged = store.stage_to(tmp_path / "other")
    assert staged is not None and staged.read_bytes() == newer.read_bytes()

    alien = tmp_path / "alien.h5"
    alien.write_bytes(newer.read_bytes()[:HEADER] + b"not HDF5 at all" * 100)
    with pytest.raises(NewerFormatError, match="format 4"):
        load_checkpoint(alien)
    with h5py.File(save_checkpoint(tmp_path / "edited.h5", legacy_state(), fsync=False), "r+") as f:
        f.attrs["version"] = 4                   # the attribute alone, no such header: damage, not a newer file
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "edited.h5")
    assert not isinstance(e.value, NewerFormatError) and "no valid header" in str(e.value)


def test_a_job_whose_checkpoint_is_a_newer_formats_fails_naming_it_and_keeps_its_files(tmp_path, monkeypatch):
    """The orchestrator: the job's fragment cannot read its newest checkpoint (a newer parsl-bft wrote it): the
    job fails at once - not a restart from step 0, not max_failures retries - with an error naming the format,
    and the file stays where it was."""
    from parsl_bft.execution import orchestrator as orch_mod
    from parsl_bft.execution.pool import EmulatedPool
    from parsl_bft.planner import Planner
    from parsl_bft.train.fragment import FragmentConfig, train_rank
    state = tmp_path / "state"
    jobdir = state / "jobs" / "img"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        train_rank(FragmentConfig(job="img", workload="images", checkpoint_dir=str(jobdir), global_batch=32,
                                  fsync=False, deterministic=False, workload_args={"n": 256}, steps=2))
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    newest = jobdir / "ckpt-000000002.h5"
    as_newer_format(newest, 7)
    before = newest.read_bytes()
    monkeypatch.setattr(orch_mod, "SiteRunner", InlineRunner)
    pool = EmulatedPool.pattern(nodes=1, period_s=100_000.0, cycles=1, notice_s=2.0)
    orch = orch_mod.Orchestrator(state, pool, Planner(method="dp", objective="throughput", t_fwd=20.0),
                                 warm_up=False, settle_s=0.0, poll_s=0.01)
    try:
        fut = orch.submit(orch_mod.TrainingJob("img", workload="images", samples=32 * 8, global_batch=32,
                                               min_nodes=1, max_nodes=1, workload_args={"n": 256},
                                               rate_guess=3000.0))
        orch.run(timeout_s=120)
        with pytest.raises(orch_mod.JobFailed, match=r"job img: its checkpoint cannot be read here: .*"
                           r"ckpt-000000002.h5: written by a newer parsl-bft \(checkpoint format 7"):
            fut.result(timeout=0)
        assert len(orch.db.events("fragment-failed")) == 1 and not orch.db.events("fragment-done")
        assert orch.db.job("img").status == "failed"
    finally:
        orch.close()
    assert newest.read_bytes() == before and not (jobdir / "damaged").exists()
    assert [p.name for p in CheckpointStore(jobdir).paths()] == [newest.name]


if __name__ == "__main__":
    write_legacy(Path(sys.argv[1]))
