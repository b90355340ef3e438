"""The detached training session of a submitted run: ``python -m parsl_bft.remote.runner RUN_DIR LOCK_FD``.

Started by ``facility.start_run`` inside a Globus Compute task; it forks away at once, so the task returns and
the session belongs to no endpoint worker (a multi-day run is not one Globus Compute task). It holds the run's
lock (inherited as LOCK_FD) for as long as it lives and runs the workflow as ``parsl-bft run`` would: through
``execution.run.run_workflow``, with the same messages and exit codes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import ParslBftError
from ..execution.signals import deferred_while_logging
from ..extras import optional_imports
from .facility import write_in


def _stop(signum: int, frame: FrameType | None) -> None:
    if not deferred_while_logging(signum):
        raise KeyboardInterrupt("SIGTERM")    # before and after the training session too: end with exit.json


# Set by an endpoint for its own worker (Globus Compute's available_accelerators); sbatch and qsub pass the
# environment on, so a pilot on a 4-GPU compute node would see only the login-node worker's one device.
WORKER_PINNING = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def drop_worker_pinning(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the endpoint worker's accelerator pinning from ``environ``; the names removed."""
    return [k for k in WORKER_PINNING if environ.pop(k, None) is not None]


def _one_line(e: BaseException) -> str:
    """An error as ``parsl-bft`` prints it: one line, unless it carries a rank's traceback."""
    text = str(e)
    return text if "Traceback" in text else " ".join(text.split()) or type(e).__name__


def run(req: dict[str, Any]) -> int:
    """The request's workflow as ``parsl-bft run [--site SITE] WORKFLOW ARGS`` runs it: its messages on stderr and
    its exit code (2: a bad site file or another deliberate error, 130: interrupted once the session cleaned up)."""
    from ..execution.run import run_workflow
    from ..sites import SiteError, load_site

    warnings.simplefilter("default")          # warnings as the parsl-bft command shows them
    warnings.filterwarnings("ignore", category=DeprecationWarning)   # library deprecations are not the user's
    warnings.formatwarning = lambda msg, *a, **k: f"warning: {msg}\n"
    try:
        sites = [load_site(os.path.expanduser(req["site"]))] if req.get("site") else []
    except SiteError as e:
        print(f"parsl-bft run: error: {e}", file=sys.stderr)
        return 2
    if sites:
        print(f"sites: {sites[0].name}", flush=True)
    try:
        with optional_imports():
            run_workflow(req["workflow"], sites, args=req["args"], progress=True)
    except ParslBftError as e:
        print(f"parsl-bft run: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:       # Ctrl-C or SIGTERM (the session turns it into this): already cleaned up
        print("parsl-bft run: interrupted: running fragments checkpointed, nodes given back; run it again with the "
              "same state directory to continue", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str]) -> int:
    """Detach, record this session (runner.json), run the request and record how it ended (exit.json)."""
    d, lock_fd = Path(argv[0]), int(argv[1])
    os.set_inheritable(lock_fd, False)    # the session's own processes must not keep the run "alive" after it
    if os.fork():
        os._exit(0)                       # the starter returns; the session is re-parented to init
    os.setsid()                           # no signal meant for the endpoint's process group reaches it
    signal.signal(signal.SIGTERM, _stop)
    write_in(d, "runner.json", json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                           "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
    req = json.loads((d / "request.json").read_text())
    os.environ.pop("PARSL_BFT_SITE", None)    # nothing the workflow starts reads this endpoint worker's sites
    dropped = drop_worker_pinning(os.environ)
    os.chdir(d / "work")
    print(f"=== session {os.getpid()} on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}",
          flush=True)
    if dropped:
        print(f"=== not passed on to pilots (the endpoint worker's own accelerator pinning): {', '.join(dropped)}",
              flush=True)
    code = 1
    try:
        if (d / "cancel").exists():       # cancelled before runner.json told where to send the signal
            raise KeyboardInterrupt("cancelled")
        code = run(req)
    except SystemExit as e:               # the workflow's own sys.exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:                 # the workflow's error goes to the log, the code to exit.json
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        write_in(d, "exit.json", json.dumps({"code": code, "ended": time.strftime("%Y-%m-%d %H:%M:%S")}))
        os.close(lock_fd)                 # only now may a new submit start the run again
    return code


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
