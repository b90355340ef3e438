"""The laptop's side: a session with a facility's Globus Compute endpoint, runs submitted through it, futures.

    with remote_session("perlmutter-remote.yaml") as remote:
        run = remote.submit("workflows/image_classifier.py")     # ships it, starts a detached session there
        ckpt = run.job("cnn-small").result()                      # resolves when that job finishes there
        run.fetch("out/")                                         # the final checkpoints, in chunks

Every call is one short Globus Compute task (``parsl_bft.remote.facility``); between calls nothing of the
laptop is needed: close it, come back, ``remote.run(run_id)``.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

from ..errors import ParslBftError
from ..execution.jobstore import JobStatus
from ..extras import optional_imports
from ..owned import link_of_another, untrusted
from ..sites import RemoteRuns, Site, SiteError, load_site
from . import answers, facility
from .bundle import Bundle, make_bundle
from .facility import END_STATES


class RemoteError(ParslBftError):
    """The endpoint, the Globus service or the facility side refused or failed a call."""


LOCAL_ENDPOINT = "local"


class NotLoggedIn(RemoteError):
    """No Globus login on this machine: ``globus-compute-endpoint login`` (or the SDK's login) first."""


class EndpointUnavailable(RemoteError):
    """The site's Globus Compute endpoint is not online: start it at the facility."""


class RemoteJobFailed(RemoteError):
    """A remote job ended without its final checkpoint (failed, or its run ended first)."""


_NOT_LOGGED_IN = ("not logged in to Globus Compute: set GLOBUS_COMPUTE_CLIENT_ID and GLOBUS_COMPUTE_CLIENT_SECRET "
                  "(a client identity), or log in once interactively: python -c 'import globus_compute_sdk as g; "
                  "g.Client()'")


def check_login():
    """The SDK's own app, if it can work without a prompt: client credentials in the environment or tokens from
    an earlier login. Otherwise a clear error - never the interactive login the SDK would start by itself."""
    with optional_imports():
        from globus_compute_sdk.sdk.auth.globus_app import get_globus_app  # the SDK's own choice of identity
        from globus_compute_sdk.sdk.compute_dir import get_compute_dir
        from globus_sdk import UserApp

    creds = [os.environ.get(k) for k in ("GLOBUS_COMPUTE_CLIENT_ID", "GLOBUS_COMPUTE_CLIENT_SECRET")]
    if not any(creds) and not (get_compute_dir() / "storage.db").exists():
        # no client identity and no stored tokens: the SDK would create its token store (~/.globus_compute)
        # before finding out there is no login
        raise NotLoggedIn(_NOT_LOGGED_IN)

    try:
        app = get_globus_app()
    except ValueError as e:             # only one of the two variables set
        raise NotLoggedIn(str(e)) from None
    if isinstance(app, UserApp) and app.login_required():
        raise NotLoggedIn(_NOT_LOGGED_IN)
    return app


class _LocalService:
    """What the service answers about the local stand-in endpoint: it is online while this process is."""

    def get_endpoint_status(self, endpoint_id: str) -> dict[str, str]:
        return {"status": "online"}


def sdk_executor(endpoint_id: str):
    """The SDK's Executor for the endpoint (the one seam tests replace: the cloud service is not reachable).
    ``local``: the SDK's serialiser and a worker process on this machine instead of the cloud and an endpoint
    (the session a submit starts detaches from the worker, as at a facility)."""
    if endpoint_id == LOCAL_ENDPOINT:
        with optional_imports():
            from ..execution.globus import LocalEndpointExecutor, TaskProcesses
        executor = LocalEndpointExecutor(pool=TaskProcesses())        # the nil endpoint id
        executor.client = _LocalService()  # type: ignore[assignment]  # answers the one query connect() asks
        return executor
    with optional_imports():
        from globus_compute_sdk import Client, Executor
    return Executor(endpoint_id=endpoint_id, client=Client(app=check_login()))


def _unreachable(e: Exception) -> RemoteError:
    return RemoteError(f"cannot reach the Globus service ({type(e).__name__}): nothing was sent")


def connect(endpoint_id: str):
    """An Executor for an endpoint that exists and is online, or a RemoteError that says which it is not."""
    from globus_sdk import GlobusAPIError, NetworkError

    try:
        executor = sdk_executor(endpoint_id)         # the SDK's Client asks the service for its version here
    except GlobusAPIError as e:
        raise NotLoggedIn(f"the Globus service refused these credentials ({e.http_status}: {e.message}): check "
                          "GLOBUS_COMPUTE_CLIENT_ID / GLOBUS_COMPUTE_CLIENT_SECRET, or log in again") from None
    except NetworkError as e:
        raise _unreachable(e) from None
    try:
        status = executor.client.get_endpoint_status(endpoint_id)
    except GlobusAPIError as e:
        executor.shutdown(wait=False)
        what = "unknown, or not shared with you" if e.http_status in (400, 403, 404) else f"refused ({e.message})"
        raise EndpointUnavailable(f"Globus Compute endpoint {endpoint_id}: {what}; check the site file's "
                                  "globus_compute_endpoint against `globus-compute-endpoint list` at the "
                                  "facility") from None
    except NetworkError as e:
        executor.shutdown(wait=False)
        raise _unreachable(e) from None
    if status.get("status") != "online":
        executor.shutdown(wait=False)
        raise EndpointUnavailable(f"Globus Compute endpoint {endpoint_id} is {status.get('status', 'not online')}: "
                                  "start it at the facility (globus-compute-endpoint start NAME)")
    return executor


def endpoint_site(site: Site | str | Path) -> Site:
    """The site (loaded if a path), checked to name the Globus Compute endpoint runs are submitted through."""
    s = site if isinstance(site, Site) else load_site(site)
    if not s.globus_compute_endpoint:
        raise SiteError(f"site '{s.name}' names no globus_compute_endpoint: runs are submitted through one "
                        "(run parsl-bft at the facility with `parsl-bft run --site` instead)")
    return s


class RemoteSession:
    """Calls on one endpoint's runs. ``poll_s``: how often futures of remote jobs ask for news."""

    def __init__(self, site: Site, executor, poll_s: float = 30.0, call_timeout_s: float = 600.0):
        self.site = site
        self.remote = site.remote or RemoteRuns()
        self.executor = executor
        self.poll_s = poll_s
        self.call_timeout_s = call_timeout_s
        self._runs: dict[str, RemoteRun] = {}
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def call(self, op: str, run_id: str, *args):
        """One facility function, by name, through the endpoint: its refusal is a RemoteError here, and so is an
        answer of another shape than the facility sends (``answers``: every value checked)."""
        fut = self.executor.submit(facility.call, op, self.remote.runs_dir, run_id, *args)
        try:
            out = fut.result(timeout=self.call_timeout_s)
        except TimeoutError:
            raise RemoteError(f"the endpoint did not answer {op} within {self.call_timeout_s:.0f} s") from None
        except Exception as e:          # the SDK's task failure, whatever its class
            raise RemoteError(f"{op} failed at the endpoint: {' '.join(str(e).split())[-500:]}") from None
        try:
            ok, value = answers.reply(op, out)
        except answers.BadAnswer as e:
            raise RemoteError(str(e)) from None
        if not ok:
            raise RemoteError(value)
        return value

    def submit(self, workflow: str | Path, args=(), files=(), run_id: str | None = None) -> RemoteRun:
        """Ship the workflow (and the files it names, and ``files``) and start it detached at the facility. The
        same submission again - or the same ``run_id`` - starts no second session; after a cancel or a failure
        it resumes the run."""
        return self.submit_bundle(make_bundle(workflow, args, files), run_id)

    def submit_bundle(self, bundle: Bundle, run_id: str | None = None) -> RemoteRun:
        """``submit`` for a bundle made already: start it (or resume it) at the facility under ``run_id``."""
        digest = bundle.digest(self.remote.site)
        run_id = facility.check_run_id(run_id or bundle.run_id(self.remote.site))
        request = {"workflow": bundle.workflow, "args": list(bundle.args), "site": self.remote.site,
                   "digest": digest}
        status = self.call("start", run_id, bundle.files, request)
        run = self.run(run_id)
        if status["started"]:
            run._new_session()
        run.last = status
        return run

    def run(self, run_id: str) -> RemoteRun:
        """A run submitted before (by this laptop or another)."""
        if run_id not in self._runs:
            self._runs[run_id] = RemoteRun(self, run_id)
        return self._runs[run_id]

    def _watch(self) -> None:
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll, name="parsl-bft-remote-poll", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            for run in list(self._runs.values()):
                if run.waiting() and not self._stop.is_set():
                    try:
                        run.status()
                    except RemoteError as e:    # one failed poll is no verdict; the next one may answer
                        run.last_error = str(e)
            self._stop.wait(self.poll_s)

    def close(self) -> None:
        """The laptop goes away: the runs at the facility go on; futures not yet resolved fail with a RemoteError
        (nothing waits forever) - ``run(run_id)`` in a new session watches again."""
        self._stop.set()
        # a poll already sent is not waited for: the SDK cannot cancel a task it has registered, and an
        # offline endpoint answers it after call_timeout_s at best; its late answer finds these futures failed
        self.executor.shutdown(wait=False, cancel_futures=True)
        for run in self._runs.values():
            run._abandon()


def with_checkpoint(status: dict, jobs=None) -> list[dict]:
    """The jobs of a run's ``status`` that have a checkpoint (all, or those named in ``jobs``)."""
    return [r for r in status["jobs"] if r.get("checkpoint") and (jobs is None or r["job"] in jobs)]


class RemoteRun:
    """One run at the facility, seen from the laptop: its status, logs and cancel, and futures that resolve
    when its jobs or the whole run end."""

    def __init__(self, session: RemoteSession, run_id: str) -> None:
        self.session = session
        self.run_id = run_id
        self.last: dict | None = None
        self.last_error: str | None = None
        self._jobs: dict[str, Future] = {}
        self._done: Future | None = None
        self._lock = threading.Lock()

    def status(self) -> dict:
        """The run's state and its jobs' progress (and resolves the futures it can)."""
        st = self.session.call("status", self.run_id)
        self._update(st)
        return st

    def logs(self, offset: int | None = None) -> dict:
        """The session's log from ``offset`` on (None: its tail), and the offset to ask from next."""
        return self.session.call("logs", self.run_id, offset)

    def cancel(self) -> dict:
        """Ask the session to checkpoint, give its nodes back and stop; ``submit`` again resumes it."""
        st = self.session.call("cancel", self.run_id)
        self._update(st)
        return st

    def job(self, name: str) -> Future:
        """Resolves to the path (at the facility) of the job's final checkpoint when it finishes there."""
        with self._lock:
            fut = self._jobs.setdefault(name, Future())
        self.session._watch()
        return fut

    def done(self) -> Future:
        """Resolves to the run's last status when its session has ended (finished, failed, cancelled)."""
        with self._lock:
            if self._done is None:
                self._done = Future()
        self.session._watch()
        return self._done

    def result(self, timeout: float | None = None) -> dict:
        """Wait (at most ``timeout`` s) for the run to end: its last status."""
        return self.done().result(timeout)

    def waiting(self) -> bool:
        """Whether a future handed out is still unresolved (the session's poller then keeps asking)."""
        with self._lock:
            return any(not f.done() for f in [*self._jobs.values(), *([self._done] if self._done else [])])

    def _new_session(self) -> None:
        """The run resumed: what its last session's end resolved (a cancel failed every job) is no answer for
        this one; futures handed out before keep theirs."""
        with self._lock:
            self._jobs = {name: f for name, f in self._jobs.items() if not f.done()}
            if self._done is not None and self._done.done():
                self._done = None

    def _abandon(self) -> None:
        with self._lock:
            for fut in [*self._jobs.values(), *([self._done] if self._done else [])]:
                if not fut.done():
                    fut.set_exception(RemoteError(f"the remote session was closed while this waited on run "
                                                  f"{self.run_id}, which goes on at the facility: "
                                                  "remote.run(run_id) in a new session watches it again"))

    def _update(self, st: dict) -> None:
        self.last = st
        ended = st["state"] in END_STATES
        rows = {r["job"]: r for r in st["jobs"]}
        with self._lock:
            for name, fut in self._jobs.items():
                row = rows.get(name)
                if fut.done():
                    continue
                if row and row["status"] == JobStatus.DONE:
                    fut.set_result(row["checkpoint"])
                elif (row and row["status"] == JobStatus.FAILED) or ended:
                    fut.set_exception(RemoteJobFailed(f"run {self.run_id}: job {name} "
                                                      f"{row['status'] if row else 'never started'}, run "
                                                      f"{st['state']} (parsl-bft logs {self.run_id})"))
            if ended and self._done is not None and not self._done.done():
                self._done.set_result(st)

    def fetch(self, dest: str | Path, jobs=None, status: dict | None = None) -> dict[str, Path]:
        """Copy each job's newest checkpoint (the final one of a finished job; of a cancelled, failed or running
        one, where it stands) - all jobs, or those named - to ``dest``/<job>.h5, in chunks of one Globus Compute
        task each, checked against their SHA-256 at the facility. ``status``: the run's, if the caller has just
        asked for it (each ask is a task at the endpoint)."""
        rows = with_checkpoint(status or self.status(), jobs)
        if jobs is not None and {r["job"] for r in rows} != set(jobs):
            missing = sorted(set(jobs) - {r["job"] for r in rows})
            raise RemoteError(f"run {self.run_id}: no checkpoint yet for {', '.join(missing)}")
        try:                            # the endpoint's answer names files here: nothing may leave dest
            rows = [answers.job_row(r, "fetch") for r in rows]
        except answers.BadAnswer as e:
            raise RemoteError(str(e)) from None
        dest = Path(dest)
        fd = _open_out(dest)
        try:
            names = [r["job"] for r in rows]
            out = {}
            for r in rows:
                # the whole state path: exp1/bft-state and exp2/bft-state both end in bft-state
                key = r["job"] if names.count(r["job"]) == 1 else f"{r['state'].replace('/', '-')}-{r['job']}"
                out[key] = dest / self._download(r, fd, f"{key}.h5")
        finally:
            os.close(fd)
        return out

    def _download(self, row: dict, fd: int, name: str) -> str:
        """``name`` in the folder ``fd``: written under a fresh name made exclusively (O_EXCL, O_NOFOLLOW, 0600:
        no link another user put there is followed, nobody else reads it), then renamed over ``name``."""
        info = self.session.call("digest", self.run_id, row["state"], row["job"])
        part = f".{name}.{secrets.token_hex(6)}.part"
        h = hashlib.sha256()
        try:
            with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                   0o600, dir_fd=fd), "wb") as f:
                while f.tell() < info["size"]:
                    data = self.session.call("chunk", self.run_id, row["state"], row["job"], f.tell())
                    if not data:
                        break
                    f.write(data)
                    h.update(data)
            if h.hexdigest() != info["sha256"]:
                raise RemoteError(f"run {self.run_id}: {row['job']}'s checkpoint changed while it was copied; "
                                  "fetch again")
            os.replace(part, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=fd)
            if isinstance(e, OSError):      # a full disk; another user's <job>.h5 in a sticky folder
                raise RemoteError(f"fetch: cannot write {name} in the --out folder: {e.strerror}") from None
            raise
        return name


def _open_out(dest: Path) -> int:
    """``fetch``'s folder (made 0700 if missing), open: a folder of the user's own that nobody else can write
    (sticky folders such as /tmp aside), reached through no link another user made. Held open, so that the
    folder checked is the folder written, whatever is renamed meanwhile."""
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        if link_of_another(dest):
            raise RemoteError(f"fetch: --out {dest} is a symbolic link another user made: give a folder of your own")
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:            # a file of that name, no permission: the CLI's one-line error
        raise RemoteError(f"fetch: cannot use {dest} as the folder for the checkpoints: {e.strerror}") from None
    why = untrusted(os.fstat(fd), sticky_ok=True)
    if why:
        os.close(fd)
        raise RemoteError(f"fetch: --out {dest} {why}: give a folder of your own that only you can write")
    return fd


@contextmanager
def remote_session(site: Site | str | Path, poll_s: float = 30.0) -> Iterator[RemoteSession]:
    """A session with the site's Globus Compute endpoint (checked: logged in, endpoint known and online)."""
    s = endpoint_site(site)
    session = RemoteSession(s, connect(str(s.globus_compute_endpoint)), poll_s=poll_s)
    try:
        yield session
    finally:
        session.close()
