"""A local stand-in for the Globus Compute service and endpoint: ``LocalEndpointExecutor`` is the SDK's Executor
with the cloud round trip replaced by worker processes on this machine (the SDK's serialiser is real).

Fragments never travel through Globus Compute: a run naming a Globus Compute site is refused
(``site_runtime.refuse_remote``); it is submitted instead (``parsl-bft submit``, parsl_bft.remote), and only the
facility functions of parsl_bft.remote.facility (start a run's detached session, its status, logs, cancel,
checkpoint chunks) go through the endpoint; the run's own orchestrator then launches its fragments at the
facility. This module is that endpoint for the endpoint id ``local`` (``remote.client.sdk_executor``: a fresh
process per task, ``TaskProcesses``) and for the tests (tests/globus_standin.py).
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from globus_compute_sdk import Executor
from globus_compute_sdk.serialize import ComputeSerializer

from ..safe_python import python_command


class TaskProcesses(concurrent.futures.Executor):
    """Endpoint workers for ``LocalEndpointExecutor``'s ``pool``: each task in a fresh Python process (an
    endpoint's worker is a separate process too), started by its command line - unlike a multiprocessing pool,
    which would import the caller's __main__ again in every worker (a script without an ``if __name__`` guard
    would start over)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``_run_serialised(payload)`` in a new process; its result (or its failure) in the future."""
        assert fn is _run_serialised and len(args) == 1 and not kwargs, "TaskProcesses runs serialised tasks"
        fut: Future[Any] = Future()

        def run() -> None:
            try:
                r = subprocess.run(python_command("-m", __name__), input=args[0], capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"the task's process exited {r.returncode}: {r.stderr.strip()[-2000:]}")
                fut.set_result(r.stdout)
            except BaseException as e:
                fut.set_exception(e)
        threading.Thread(target=run, daemon=True).start()
        return fut


def _run_serialised(payload: str) -> str:
    """What an endpoint worker does with a task: unpack, deserialise, run, serialise the result."""
    s = ComputeSerializer()
    fn_buf, args_buf, kwargs_buf = s.unpack_buffers(payload)
    fn, args, kwargs = s.deserialize(fn_buf), s.deserialize(args_buf), s.deserialize(kwargs_buf)
    return s.serialize(fn(*args, **kwargs))


class _Watcher:
    """The SDK's result watcher, of which the stand-in has nothing to stop."""

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class LocalEndpointExecutor(Executor):
    """A globus_compute_sdk.Executor whose 'cloud' is a local process pool: the SDK's serialiser and Parsl's
    GlobusComputeExecutor wiring are real; only the AMQP round trip to the service is replaced."""

    def __init__(self, endpoint_id: str = "00000000-0000-0000-0000-000000000000", workers: int = 2,
                 pool: concurrent.futures.Executor | None = None) -> None:
        """``pool``: an endpoint's worker processes that outlive this executor (a laptop's connection to a
        facility); by default its own."""
        # deliberately not calling Executor.__init__: it would log in to the cloud service
        self.label = "local-endpoint"
        self.endpoint_id = endpoint_id
        self.resource_specification = None
        self.user_endpoint_config = None
        self._ser = ComputeSerializer()
        # spawn, like a real endpoint's workers: separate processes that share nothing with this one
        self._own_pool = pool is None
        self._pool = pool or ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        self.submitted_specs: list[Any] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:  # type: ignore[override]
        """Run ``fn(*args, **kwargs)`` as an endpoint worker would: serialised there and back."""
        s = self._ser
        payload = s.pack_buffers([s.serialize(fn), s.serialize(args), s.serialize(kwargs)])
        self.submitted_specs.append(self.resource_specification)
        inner = self._pool.submit(_run_serialised, payload)
        outer: Future[Any] = Future()

        def done(f: Future[str]) -> None:
            try:
                outer.set_result(s.deserialize(f.result()))
            except BaseException as e:   # the task's own exception reaches the caller
                outer.set_exception(e)
        inner.add_done_callback(done)
        return outer

    def __repr__(self) -> str:
        """What ``sites show`` writes for it."""
        return f"LocalEndpointExecutor(endpoint_id={self.endpoint_id!r})"

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the endpoint's worker processes, unless they were lent (``pool``)."""
        if self._own_pool:
            self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _get_result_watcher(self) -> _Watcher:  # type: ignore[override]
        return _Watcher()


if __name__ == "__main__":          # a TaskProcesses worker: one serialised task from stdin, its result to stdout
    sys.stdout.write(_run_serialised(sys.stdin.read()))
