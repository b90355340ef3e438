"""Files parsl-bft writes or reads for the user outside a state directory follow its rules: ``fetch --out`` and
the scheduler-log parse cache are the user's own and writable by nobody else, no link another user planted is
followed, files are made exclusively with mode 0600."""
import hashlib
import os
import pickle
import re
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

import pytest

from parsl_bft.remote.client import RemoteError, RemoteRun

NOBODY = 65534
CKPT = b"the checkpoint's bytes" * 100


def need_root() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user (os.chown); CI runs as root: run it there")


class _Endpoint:
    """The facility's answers to a fetch: a digest, then chunks."""

    def call(self, op, run_id, state, job, *rest):
        if op == "digest":
            return {"size": len(CKPT), "sha256": hashlib.sha256(CKPT).hexdigest()}
        assert op == "chunk"
        return CKPT[rest[0]:rest[0] + 1000]


STATUS = {"jobs": [{"job": "a", "state": "bft-state", "status": "done", "samples_done": 1, "fragments": 1,
                    "checkpoint": "/x/a.h5"}]}


def fetch(dest: Path) -> dict:
    return RemoteRun(_Endpoint(), "r1").fetch(dest, status=STATUS)


def test_fetch_follows_no_link_planted_in_its_folder(tmp_path):
    """A link at <out>/<job>.h5.part made fetch overwrite the file it pointed to with the checkpoint."""
    victim = tmp_path / "victim"
    victim.write_text("root only")
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    for name in ("a.h5.part", "a.h5"):
        (out / name).symlink_to(victim)
    got = fetch(out)
    assert victim.read_text() == "root only"
    st = os.lstat(got["a"])
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and got["a"].read_bytes() == CKPT
    assert sorted(p.name for p in out.iterdir()) == ["a.h5", "a.h5.part"]     # no temporary file left


def test_fetch_refuses_an_out_folder_others_can_write(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(RemoteError, match=r"--out .*out is writable by others \(mode 777\): give a folder"):
        fetch(out)
    assert list(out.iterdir()) == []
    out.chmod(0o777 | stat.S_ISVTX)          # as /tmp: nobody can replace another user's files there
    assert fetch(out)["a"].read_bytes() == CKPT


def test_fetch_refuses_an_out_folder_of_another_user(tmp_path):
    need_root()
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    os.chown(out, NOBODY, NOBODY)
    with pytest.raises(RemoteError, match=r"--out .*out belongs to another user \(uid 65534\)"):
        fetch(out)
    assert list(out.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "r1"                   # the default --out, planted as a link by the other user
    link.symlink_to(mine)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(RemoteError, match=r"--out .*r1 is a symbolic link another user made"):
        fetch(link)
    assert list(mine.iterdir()) == []


def test_fetch_cannot_replace_another_users_file_in_a_sticky_folder():
    """In /tmp the other user's <job>.h5 stays theirs: one line, not a PermissionError traceback."""
    need_root()
    out = Path(tempfile.mkdtemp(prefix="bft-sticky-"))       # under /tmp: a plain user can reach it
    try:
        out.chmod(0o777 | stat.S_ISVTX)
        (out / "a.h5").write_text("theirs")
        os.chown(out / "a.h5", NOBODY, NOBODY)
        pid = os.fork()
        if pid == 0:                          # as a plain user (root may replace anything)
            code = 1
            try:
                os.setuid(NOBODY - 1)
                fetch(out)
            except RemoteError as e:
                code = 0 if "cannot write a.h5 in the --out folder: Operation not permitted" in str(e) else 2
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert (out / "a.h5").read_text() == "theirs"
    finally:
        shutil.rmtree(out)


# --- the scheduler-log parse cache ---------------------------------------------------------------------------
class _Planted:
    """What another user's pickle does when it is read: leaves a mark (a command would run the same way)."""

    def __init__(self, mark: Path) -> None:
        self.mark = str(mark)

    def __reduce__(self):
        return (Path.touch, (Path(self.mark),))


def _plant(tmp_path, monkeypatch, folder_mode=0o700, file_mode=0o600, file_owner=None):
    """A cache folder holding, under the very name the log's entry will have, another user's pickle."""
    from parsl_bft.idle.cache import cache_key
    folder, log, mark = tmp_path / "cache", tmp_path / "x.swf", tmp_path / "ran"
    log.write_text("1 0 0 100 4 -1 -1 4 100 -1 1 1 1 1 1 -1 -1 -1\n")
    folder.mkdir()
    entry = folder / f"{cache_key(log, {'v': 1})}.pickle"
    entry.write_bytes(pickle.dumps((_Planted(mark), [])))
    entry.chmod(file_mode)
    if file_owner is not None:
        os.chown(entry, file_owner, file_owner)
    folder.chmod(folder_mode)
    monkeypatch.setenv("PARSL_BFT_CACHE", str(folder))
    return log, mark


def _load(log):
    from parsl_bft.idle.cache import cached
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        value = cached(log, {"v": 1}, lambda: "parsed")
    return value, [str(w.message) for w in said]


@pytest.mark.parametrize("folder_mode, file_mode, why", [
    (0o777, 0o600, r"cache's .*cache is writable by others \(mode 777\): not used"),
    (0o1777, 0o600, r"cache's .*cache is writable by others \(mode 1777\): not used"),
    (0o700, 0o666, r"cache's .*\.pickle is writable by others \(mode 666\): not used"),
])
def test_the_parse_cache_never_reads_a_pickle_others_could_write(tmp_path, monkeypatch, folder_mode, file_mode,
                                                                 why):
    log, mark = _plant(tmp_path, monkeypatch, folder_mode, file_mode)
    value, said = _load(log)
    assert value == "parsed" and not mark.exists()
    assert len(said) == 1 and re.search(why, said[0]), said


def test_the_parse_cache_never_reads_another_users_pickle(tmp_path, monkeypatch):
    need_root()
    log, mark = _plant(tmp_path, monkeypatch, file_owner=NOBODY)
    value, said = _load(log)
    assert value == "parsed" and not mark.exists()
    assert len(said) == 1 and "belongs to another user (uid 65534)" in said[0], said
    os.chown(tmp_path / "cache", NOBODY, NOBODY)           # their folder, too
    assert _load(log) == ("parsed", [f"the parse cache's {tmp_path / 'cache'} belongs to another user (uid 65534): "
                                     "not used (the log is parsed again); set PARSL_BFT_CACHE to a folder of your "
                                     "own that only you can write"])
    assert not mark.exists()


def test_the_parse_cache_keeps_and_reads_its_own_entries(tmp_path, monkeypatch):
    """A private cache still works: the second load is read back; its files are 0600."""
    from parsl_bft.idle.cache import cached
    monkeypatch.setenv("PARSL_BFT_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "x.swf"
    log.write_text("1\n")
    built = []
    assert cached(log, {}, lambda: built.append(1) or "v") == "v"
    assert cached(log, {}, lambda: built.append(1) or "v") == "v" and built == [1]
    (entry,) = (tmp_path / "cache").iterdir()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


# --- the remote-run registry ---------------------------------------------------------------------------------
def test_the_remote_run_registry_is_used_only_in_a_folder_of_ones_own(tmp_path, monkeypatch):
    """Another user's registry could point `status RUN_ID` at a site file (an endpoint) of theirs, and its
    temporary file was written through whatever link was there. A private folder works as before, files 0600."""
    from parsl_bft.errors import ParslBftError
    from parsl_bft.remote.registry import known_runs, registry_path, remember
    home = tmp_path / "home"
    monkeypatch.setenv("PARSL_BFT_HOME", str(home))
    remember("r1", tmp_path / "a.yaml")
    remember("r2", tmp_path / "b.yaml")
    assert known_runs() == {"r1": str(tmp_path / "a.yaml"), "r2": str(tmp_path / "b.yaml")}
    assert stat.S_IMODE(registry_path().stat().st_mode) == 0o600
    assert sorted(p.name for p in home.iterdir()) == ["remote-runs.json", "remote-runs.json.lock"]
    home.chmod(0o777)
    with pytest.raises(ParslBftError, match=r"registry's folder .*home is writable by others \(mode 777\)"):
        remember("r3", tmp_path / "c.yaml")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert known_runs() == {}
    assert [str(w.message) for w in said] == [f"the remote-run registry's folder {home} is writable by others "
                                              "(mode 777): not read"]
