"""Files and folders parsl-bft reads or writes on the user's behalf outside a state directory (``fetch --out``,
the scheduler-log parse cache) follow OpenSSH's and Slurm's rule: the user's own (or root's), and writable by
nobody else - a folder that others may write only with the sticky bit, as /tmp, where nobody can replace another
user's files. No Parsl, no torch: the idle-capacity tools use it too."""
from __future__ import annotations

import os
import stat


def untrusted(st: os.stat_result, sticky_ok: bool = False) -> str | None:
    """Why a file or folder with status ``st`` is not to be trusted (words that follow its name), or None.
    ``sticky_ok``: a folder others may write is fine if it has the sticky bit (its files stay their owners')."""
    if st.st_uid not in (os.getuid(), 0):
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022 and not (sticky_ok and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def link_of_another(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` itself is a symbolic link someone else made (one of the user's own is their choice)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.getuid(), 0)
