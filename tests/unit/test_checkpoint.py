import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies

from parsl_bft.train.checkpoint import (
    BackgroundSave,
    CheckpointError,
    CheckpointStore,
    TrainingState,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)

from harness import assert_same


def sample_state(step=1):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    tensors = {"w": model.weight.detach(), "bf16": torch.randn(5).to(torch.bfloat16),
               "f16": torch.randn(3).half(), "i64": torch.arange(7), "b": torch.tensor([True, False]),
               "u8": torch.arange(4, dtype=torch.uint8), "c64": torch.randn(2, dtype=torch.complex64),
               "empty": torch.zeros(0, 3)}
    if hasattr(torch, "float8_e4m3fn"):
        tensors["f8"] = torch.randn(4).to(torch.float8_e4m3fn)
    return TrainingState(model=tensors, optimizer=opt.state_dict(), scheduler=sched.state_dict(), rng=capture_rng(),
                         step=step, epoch=2, samples_done=640, data_position=128, job={"name": "a"},
                         metrics=[{"step": 1, "loss": 2.5}], extra={"freeze_layers": 1})




@pytest.mark.slow
def test_roundtrip_every_dtype_and_nested_state(tmp_path):
    st = sample_state()
    save_checkpoint(tmp_path / "c.h5", st)
    back = load_checkpoint(tmp_path / "c.h5")
    for key in ("model", "optimizer", "scheduler"):
        assert_same(getattr(st, key), getattr(back, key))
    assert (back.step, back.epoch, back.samples_done, back.data_position) == (1, 2, 640, 128)
    assert back.job == {"name": "a"} and back.metrics == st.metrics and back.extra == st.extra
    # an optimizer restored from it continues exactly
    m = torch.nn.Linear(4, 3)
    o = torch.optim.AdamW(m.parameters(), lr=1e-3)
    o.load_state_dict(back.optimizer)
    assert o.state_dict()["state"][0]["exp_avg"].equal(st.optimizer["state"][0]["exp_avg"])


def test_rng_states_restore(tmp_path):
    torch.manual_seed(3)
    np.random.seed(3)
    st = TrainingState(model={}, rng=capture_rng())
    save_checkpoint(tmp_path / "r.h5", st)
    a = (torch.rand(3), np.random.rand(3), __import__("random").random())
    restore_rng(load_checkpoint(tmp_path / "r.h5").rng)
    b = (torch.rand(3), np.random.rand(3), __import__("random").random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_loading_never_unpickles(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "c.h5", sample_state())

    def forbidden(*a, **k):
        raise AssertionError("unpickling during load")
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_checkpoint(tmp_path / "c.h5")


def test_inspectable_with_h5py_names(tmp_path):
    save_checkpoint(tmp_path / "c.h5", sample_state())
    with h5py.File(tmp_path / "c.h5") as f:
        assert f.attrs["format"] == "parsl-bft-checkpoint"
        ds = f["model/k0"]
        assert ds.shape == (3, 4) and ds.dtype == np.float32 and "xxh3" in ds.attrs
        assert f["model/k1"].attrs["torch_dtype"] == "bfloat16"


def test_flipped_byte_names_the_dataset_and_store_falls_back(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    store.save(sample_state(step=1))
    newest = store.save(sample_state(step=2))
    with h5py.File(newest, "r") as f:
        offset = f["model/k0"].id.get_offset()
    with open(newest, "r+b") as fh:
        fh.seek(offset + 5)
        b = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="checksum mismatch") as e:
        load_checkpoint(newest)
    assert e.value.dataset == "/model/k0"
    got = store.latest()
    assert got.step == 1
    assert len(store.skipped) == 1 and "/model/k0" in str(store.skipped[0])


def test_keeps_the_last_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for s in range(1, 5):
        store.save(sample_state(step=s), fsync=False)
    assert [p.name for p in store.paths()] == ["ckpt-000000004.h5", "ckpt-000000003.h5"]


def test_truncated_or_foreign_file(tmp_path):
    p = tmp_path / "ckpt-000000001.h5"
    p.write_bytes(b"not hdf5")
    with pytest.raises(CheckpointError, match="not a readable HDF5"):
        load_checkpoint(p)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.attrs["format"] = "something else"
    with pytest.raises(CheckpointError, match="not a parsl-bft checkpoint"):
        load_checkpoint(tmp_path / "x.h5")


@pytest.mark.slow
def test_writer_killed_mid_write_leaves_previous_intact(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(sample_state(step=1))
    here = Path(__file__).resolve()                # this module imports harness (tests/) by name
    paths = [str(here.parents[2]), str(here.parents[1]), str(here.parent)]
    code = (f"import sys; sys.path[:0] = {paths!r}; from test_checkpoint import sample_state; "
            "from parsl_bft.train.checkpoint import CheckpointStore; "
            f"CheckpointStore({str(tmp_path)!r}).save(sample_state(step=2))")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PARSL_BFT_FAULT": "save:optimizer"})
    assert r.returncode == -9                                     # killed half-way through the write
    assert [p.name for p in store.paths()] == ["ckpt-000000001.h5"]   # no half-written checkpoint visible
    assert list(tmp_path.glob(".ckpt-*.tmp-*"))                   # the torn temporary is there ...
    again = CheckpointStore(tmp_path)
    assert not list(tmp_path.glob(".ckpt-*.tmp-*"))               # ... and cleaned up by the next store
    assert again.latest().step == 1


def test_another_hosts_save_in_progress_is_never_deleted(tmp_path):
    """A job directory on a shared file system: a temporary of another node (whose pid means nothing here)
    survives a new store; only one untouched for an hour is dropped."""
    live = tmp_path / ".ckpt-000000005.h5.tmp-othernode-1"           # pid 1 exists here, so also 999999999
    gone = tmp_path / ".ckpt-000000004.h5.tmp-othernode-999999999"
    old = tmp_path / ".ckpt-000000003.h5.tmp-othernode-2"
    for p in (live, gone, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    CheckpointStore(tmp_path)
    assert live.exists() and gone.exists() and not old.exists()


def test_background_save_writes_the_state_as_it_was_when_started(tmp_path):
    """The pause is a copy: training may change the tensors while the thread writes; one write at a time; the
    copy buffers are the same from one save to the next; a failed write fails the next wait."""
    import threading

    store = CheckpointStore(tmp_path)
    release = threading.Event()
    bg = BackgroundSave(lambda st: release.wait() and store.save(st, fsync=False))
    st = sample_state(step=1)
    before = {k: v.clone() for k, v in st.model.items()}
    bg.prepare(st)
    bg.wait()
    buffers = {k: t.data_ptr() for k, t in bg._buffers.items()}
    assert bg.start(st)
    for t in st.model.values():                   # training goes on, in place
        if t.dtype in (torch.float32, torch.float16, torch.bfloat16):
            t.add_(1.0)
    assert not bg.start(sample_state(step=2))     # still writing step 1
    release.set()
    assert bg.wait().name == "ckpt-000000001.h5"
    back = load_checkpoint(bg.last)
    for k, t in before.items():
        assert_same(t, back.model[k])
    assert {k: t.data_ptr() for k, t in bg._buffers.items()} == buffers
    broken = BackgroundSave(lambda st: 1 / 0)
    assert broken.start(st)
    with pytest.raises(ZeroDivisionError):
        broken.wait()


def test_where_a_job_stands_reads_no_array(tmp_path):
    """arrays=False reads step and counters, checks the metadata checksum, and does not read the data: damaged
    data is found by the full load only, a damaged attribute by both."""
    path = save_checkpoint(tmp_path / "ckpt-000000007.h5", sample_state(step=7))
    with h5py.File(path, "r") as f:
        offset = f["model/k0"].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff\xff")
    info = load_checkpoint(path, arrays=False)
    assert (info.step, info.samples_done, info.data_position) == (7, 640, 128) and info.model["w"] is None
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    with h5py.File(path, "r+") as f:
        f.attrs["samples_done"] = 10**6
    with pytest.raises(CheckpointError, match="metadata checksum"):
        load_checkpoint(path, arrays=False)


def test_large_arrays_load_exactly_and_damage_in_any_piece_is_found(tmp_path):
    """Datasets of 1 MiB and more are read piece by piece into a memory mapping of their own: exact, writable,
    independent of the file, picklable like any tensor; a flipped byte in the last, partial piece is found."""
    big, odd = torch.randn(1 << 20), torch.arange(300_001, dtype=torch.int32)     # 4 MiB; 1.2 MB, partial piece
    path = save_checkpoint(tmp_path / "c.h5", TrainingState(model={"big": big, "odd": odd}))
    back = load_checkpoint(path).model
    assert torch.equal(back["big"], big) and torch.equal(back["odd"], odd)
    path.unlink()
    back["big"].add_(1.0)
    assert torch.equal(back["big"], big + 1.0)
    assert torch.equal(pickle.loads(pickle.dumps(back["odd"])), odd)
    path = save_checkpoint(tmp_path / "c.h5", TrainingState(model={"big": big, "odd": odd}))
    with h5py.File(path, "r") as f:
        end = f["model/k1"].id.get_offset() + odd.numel() * 4
    with open(path, "r+b") as fh:
        fh.seek(end - 1)
        last = fh.read(1)
        fh.seek(end - 1)
        fh.write(bytes([last[0] ^ 0x01]))
    with pytest.raises(CheckpointError, match="checksum mismatch") as e:
        load_checkpoint(path)
    assert e.value.dataset == "/model/k1"


def test_background_copy_of_every_tensor_layout(tmp_path):
    """``start`` copies plain CPU tensors with memmove and the rest (views with strides, conjugate views) with
    copy_: the checkpoint holds the values either way."""
    base = torch.randn(5, 7)
    model = {"t": base.t(), "column": base[:, 2], "conj": torch.randn(3, dtype=torch.complex64).conj(),
             "scalar": torch.tensor(2.5), "flags": torch.tensor([True, False, True]),
             "bf16": torch.randn(6).to(torch.bfloat16), "big": torch.randn(1 << 18), "none": torch.zeros(0)}
    st = TrainingState(model=model, optimizer={"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []})
    bg = BackgroundSave(lambda s: save_checkpoint(tmp_path / "c.h5", s, fsync=False))
    bg.prepare(st)
    bg.wait()
    assert bg.start(st)
    bg.wait()
    back = load_checkpoint(tmp_path / "c.h5")
    for k, t in model.items():
        assert back.model[k].dtype == t.dtype and torch.equal(back.model[k], t.resolve_conj()), k
    assert back.optimizer["state"][0]["step"].item() == 3.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NOT RUN: needs a CUDA GPU (CI has none; "
                    "pinned-buffer saves from GPU tensors passed on one H100)")
def test_background_copy_from_a_gpu_goes_to_pinned_buffers(tmp_path):
    st = TrainingState(model={"w": torch.randn(256, 256, device="cuda"), "b": torch.randn(256, device="cuda")})
    bg = BackgroundSave(lambda s: save_checkpoint(tmp_path / "c.h5", s, fsync=False))
    bg.prepare(st)
    bg.wait()
    assert bg.start(st)
    bg.wait()
    assert all(buf.is_pinned() for buf in bg._buffers.values())
    back = load_checkpoint(tmp_path / "c.h5")
    assert all(torch.equal(back.model[k], t.cpu()) for k, t in st.model.items())


def flip_byte(path, dataset, at=0):
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        b = fh.read(1)
        fh.seek(offset + at)
        fh.write(bytes([b[0] ^ 0xFF]))


def set_attr(path, dataset, name, value):
    with h5py.File(path, "r+") as f:
        f[dataset].attrs[name] = value


def untouched(live):
    return not any(t.view(torch.uint8).any() for t in live.values() if t.numel())


def test_a_restore_into_the_live_model_reads_each_tensor_into_it(tmp_path):
    """``into``: every tensor whose name, shape and dtype match is read straight into the live one (every dtype,
    bfloat16 and float8 included) and returned as that very tensor, so load_state_dict copies nothing; a
    mismatch loads into fresh memory and is named by load_state_dict, and a live tensor outside CPU memory's
    dense layout is never written."""
    st = sample_state()
    path = save_checkpoint(tmp_path / "c.h5", st, fsync=False)
    live = {k: torch.zeros_like(v) for k, v in st.model.items()}
    back = load_checkpoint(path, into=live)
    assert_same(back.model, st.model)
    assert all(back.model[k] is live[k] for k in live if live[k].numel()), "read into fresh memory"
    assert_same(back.optimizer, st.optimizer)

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    path = save_checkpoint(tmp_path / "m.h5", TrainingState(model=model.state_dict()), fsync=False)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    back = load_checkpoint(path, into=other.state_dict())
    assert back.model["0.weight"].data_ptr() == other[0].weight.data_ptr()
    other.load_state_dict(back.model)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))

    wider = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    live = {**wider.state_dict(), "1.bias": torch.zeros(4)[::2],      # the right shape, not one dense block
            "1.weight": torch.empty(2, 3, device="meta")}               # not in CPU memory (as on a GPU)
    back = load_checkpoint(path, into=live)
    assert back.model["0.weight"].shape == (3, 4) and torch.equal(back.model["1.bias"], model[1].bias)
    assert torch.equal(back.model["1.weight"], model[1].weight) and not live["1.bias"].any()
    with pytest.raises(RuntimeError, match=r"size mismatch for 0.weight"):
        wider.load_state_dict(back.model)


def test_damage_is_found_before_the_live_model_is_written_or_it_is_reported_overwritten(tmp_path):
    """Metadata, length and optimizer state verify before any live tensor is written; damage in the model's own
    data shows only after: the error says so, the store restores the next good checkpoint into the same tensors,
    and with none left it refuses rather than hand back a half-overwritten model as a fresh start."""
    def live_model():
        return {k: torch.zeros_like(v) for k, v in sample_state().model.items()}

    store = CheckpointStore(tmp_path / "s", keep=3)
    old = sample_state(step=1)
    store.save(old, fsync=False)
    newest = store.save(sample_state(step=2), fsync=False)
    for damage in (lambda p: flip_byte(p, "optimizer/k0/k0/k1"),                 # AdamW's exp_avg of parameter 0
                   lambda p: os.truncate(p, p.stat().st_size - 1),
                   lambda p: set_attr(p, "model/k0", "xxh3", "0")):                  # metadata
        path = save_checkpoint(tmp_path / "d.h5", sample_state(step=3), fsync=False)
        damage(path)
        live = live_model()
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path, into=live)
        assert not e.value.overwritten and untouched(live)

    flip_byte(newest, "model/k0", at=5)
    live = live_model()
    with pytest.raises(CheckpointError, match="checksum mismatch") as e:
        load_checkpoint(newest, into=live)
    assert e.value.overwritten and e.value.dataset == "/model/k0"
    got = store.latest(into=live)
    assert got.step == 1 and got.model["w"] is live["w"] and len(store.skipped) == 1
    assert_same(got.model, old.model)

    flip_byte(store.paths()[0], "model/k0", at=5)                                  # the only one left
    with pytest.raises(CheckpointError, match="build the model again"):
        store.latest(into=live_model())
    solo = CheckpointStore(tmp_path / "solo")
    flip_byte(solo.save(sample_state(step=4), fsync=False), "optimizer/k0/k0/k1")
    live = live_model()
    assert solo.latest(into=live) is None and len(solo.skipped) == 1 and untouched(live)   # a fresh start


@pytest.mark.slow
def test_a_restore_into_the_live_model_touches_it_only_when_the_error_says_so(tmp_path):
    """Single byte flips anywhere in a real checkpoint, loaded into live tensors: each loads exactly into them,
    or raises CheckpointError naming the file and leaving them as they were - unless it says ``overwritten``,
    which only damage inside the model's own data may cause."""
    saved = sample_state()
    data = save_checkpoint(tmp_path / "c.h5", saved, fsync=False).read_bytes()
    target = tmp_path / "flipped.h5"
    outcome = {"loaded": 0, "untouched": 0, "overwritten": 0}

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(pos=strategies.integers(0, len(data) - 1), xor=strategies.integers(1, 255))
    def flip(pos, xor):
        b = bytearray(data)
        b[pos] ^= xor
        target.write_bytes(b)
        live = {k: torch.zeros_like(v) for k, v in saved.model.items()}
        try:
            got = load_checkpoint(target, into=live)
        except CheckpointError as e:
            assert str(target) in str(e)
            if e.overwritten:
                assert e.dataset.startswith("/model/"), e
                outcome["overwritten"] += 1
            else:
                assert untouched(live), e
                outcome["untouched"] += 1
            return
        assert_same(got.model, saved.model)
        assert all(got.model[k] is live[k] for k in live if live[k].numel())
        outcome["loaded"] += 1

    flip()
    assert outcome["untouched"] and outcome["loaded"]


def test_the_store_refuses_a_good_checkpoint_that_cannot_rewrite_what_a_damaged_one_overwrote(tmp_path):
    """A damaged newest checkpoint overwrote a live tensor that the next good one does not hold: load_state_dict
    would leave it as it is without a word (BatchNorm takes a missing num_batches_tracked), so the store raises
    instead of handing back a model with a tensor of the damaged file; the good file is kept for a model built
    again."""
    def bn_model():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))

    store = CheckpointStore(tmp_path / "s")
    older = {k: v for k, v in bn_model().state_dict().items() if not k.endswith("num_batches_tracked")}
    good = store.save(TrainingState(model=older, step=1), fsync=False)
    newest = store.save(TrainingState(model=bn_model().state_dict(), step=2), fsync=False)
    flip_byte(newest, "model/k6")                                      # 1.num_batches_tracked, the last tensor
    model = bn_model()
    with pytest.raises(CheckpointError, match=r"does not hold 1 of the tensors it overwrote .*num_batches_tracked"):
        store.latest(into=model.state_dict())
    assert store.skipped[0].written == tuple(model.state_dict()) and store.paths() == [good]
    fresh = bn_model()
    fresh.load_state_dict(store.latest(into=fresh.state_dict()).model)
    assert int(fresh[1].num_batches_tracked) == 0


def test_a_format_1_checkpoint_is_never_read_into_the_live_model(tmp_path):
    """Format 1 has no metadata checksum: a damaged attribute could only show after the live tensors were written,
    so such a file loads into fresh memory (load_state_dict then copies it)."""
    saved = sample_state()
    path = save_checkpoint(tmp_path / "c.h5", saved, fsync=False)
    with h5py.File(path, "r+") as f:
        f.attrs["version"] = 1
        del f.attrs["meta_xxh3"]
    live = {k: torch.zeros_like(v) for k, v in saved.model.items()}
    back = load_checkpoint(path, into=live)
    assert_same(back.model, saved.model)
    assert back.model["w"] is not live["w"] and untouched(live)
    set_attr(path, "model/k0", "xxh3", "0")
    with pytest.raises(CheckpointError, match="checksum mismatch") as e:
        load_checkpoint(path, into=live)
    assert not e.value.overwritten and untouched(live)


def test_a_model_with_lazy_parameters_restores_instead_of_setting_its_checkpoint_aside(tmp_path):
    """A lazy module's parameters have no memory before their first use: the checkpoint loads into fresh memory
    and load_state_dict materialises them (asking their shape raised, and the good file was set aside as damaged:
    the job would have started over)."""
    trained = torch.nn.Sequential(torch.nn.LazyLinear(3))
    trained(torch.randn(2, 5))
    store = CheckpointStore(tmp_path)
    store.save(TrainingState(model=trained.state_dict(), step=7), fsync=False)
    model = torch.nn.Sequential(torch.nn.LazyLinear(3))
    st = store.latest(into=model.state_dict())
    assert st.step == 7 and not store.skipped
    model.load_state_dict(st.model)
    assert torch.equal(model[0].weight, trained[0].weight)


def test_a_checkpoint_replaced_between_the_stat_and_the_open_is_bounded_by_its_own_size(tmp_path, monkeypatch):
    """Another save of the same step lands after load_checkpoint's stat and before HDF5 opens the path: the sizes
    are bounded by the file opened, not the one the stat saw (that declared the good file damaged, set it aside
    and made latest() a fresh start)."""
    store = CheckpointStore(tmp_path / "s")
    path = store.save(TrainingState(model={"w": torch.zeros(10)}, step=5), fsync=False)
    bigger = save_checkpoint(tmp_path / "b.h5", TrainingState(model={"w": torch.ones(100_000)}, step=5), fsync=False)
    opened = h5py.File

    def replaced_first(name, *args, **kwargs):
        if bigger.exists():
            os.replace(bigger, name)
        return opened(name, *args, **kwargs)

    monkeypatch.setattr(h5py, "File", replaced_first)
    st = store.latest()
    assert st.step == 5 and torch.equal(st.model["w"], torch.ones(100_000)) and not store.skipped
    assert store.paths() == [path]


def test_a_non_finite_tensor_is_found_under_any_key():
    """A scientist's state keeps its model under any key ({"net": ..., "ema": ...}): NaN weights there passed
    the check, which looked at "model" only, and replaced the last finite checkpoint."""
    from parsl_bft.train.checkpoint import finite_weights
    good = {"net": {"w": torch.ones(2)}, "step": 3, "opt": {"state": {0: {"m": torch.zeros(2)}}}}
    assert finite_weights(good) is None
    good["ema"] = {"w": torch.tensor([1.0, float("nan")])}
    assert finite_weights(good) == "ema.w"


def test_staged_reads_give_the_bytes_and_digest_of_a_plain_read(tmp_path, monkeypatch):
    """DeviceStaging (the road onto an accelerator: two buffers that take turns) reads the same bytes and checksum
    as the read into host memory, across many buffer turns; a file that ends early gives None. Run here into a
    CPU tensor (the GPU test reads onto a GPU)."""
    from parsl_bft.train.checkpoint import reader, staging
    monkeypatch.setattr(staging, "_BUFFER", 1 << 12)          # many turns of two small buffers
    data = torch.randn(3, 5000)
    path = save_checkpoint(tmp_path / "c.h5", TrainingState(model={"w": data}), fsync=False)
    with h5py.File(path, "r") as f:
        offset = f["model/k0"].id.get_offset()
    fd = os.open(path, os.O_RDONLY)
    try:
        dest = torch.empty_like(data)
        got = staging.DeviceStaging(1 << 10).read(fd, offset, dest)
        plain = np.empty(data.numel(), dtype=np.float32)
        assert got == reader._read_into(fd, offset, plain) is not None
        assert torch.equal(dest, data) and torch.equal(torch.from_numpy(plain).view(3, 5000), data)
        size = os.fstat(fd).st_size
        assert staging.DeviceStaging(1 << 10).read(fd, size - 100, torch.empty(1000)) is None
    finally:
        os.close(fd)


def test_a_checkpoint_keeps_a_bounded_window_of_per_step_metrics(tmp_path, monkeypatch):
    """Every save stored the whole per-step history: at a million steps 54 MB and a 3.3 s save for a tiny model.
    A checkpoint keeps the last METRICS_KEPT steps' (here 5), across fragments; memory keeps at most twice that."""
    from parsl_bft.train import context
    from parsl_bft.train.fragment import FragmentConfig, train_rank
    monkeypatch.setattr(context, "METRICS_KEPT", 5)

    def run(steps):
        train_rank(FragmentConfig(job="a", workload="images", checkpoint_dir=str(tmp_path), global_batch=32,
                                  workload_args={"n": 512}, fsync=False, steps=steps))
        return [m["step"] for m in CheckpointStore(tmp_path).latest(arrays=False).metrics]
    assert run(12) == [8, 9, 10, 11, 12]
    assert run(4) == [12, 13, 14, 15, 16]                  # the restored window goes on
    ctx = context.TrainContext.__new__(context.TrainContext)
    ctx.metrics = []
    for step in range(1, 100):
        ctx._keep_metrics({"step": step})
        assert len(ctx.metrics) <= 10 and ctx.metrics[-1]["step"] == step
