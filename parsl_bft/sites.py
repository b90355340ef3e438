"""Site files: a facility described once (YAML, validated with pydantic) -> the Parsl Config parsl-bft runs.

Secrets never belong in a site file: Globus Compute credentials come from the environment
(GLOBUS_COMPUTE_CLIENT_ID / GLOBUS_COMPUTE_CLIENT_SECRET); a value that looks like a secret is rejected.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from uuid import UUID

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ParslBftError

_SECRET = re.compile(r"(secret|password|passwd|token|api[_-]?key)\s*[=:]", re.I)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeShape(_Strict):
    cores: int = Field(ge=1)
    gpus: int = Field(default=0, ge=0)
    ranks_per_node: int | None = Field(default=None, ge=1, description="training ranks a fragment runs on each "
                                       "node; default: one per GPU (CPU-only nodes: 1)")

    @model_validator(mode="after")
    def _ranks(self):
        if self.ranks_per_node is None:
            self.ranks_per_node = self.gpus or 1
        elif self.gpus and self.ranks_per_node > self.gpus:
            raise ValueError(f"ranks_per_node {self.ranks_per_node} > gpus {self.gpus}: one rank per accelerator")
        return self


class PilotWalltime(_Strict):
    min_minutes: int = Field(default=1, ge=1)
    max_minutes: int = Field(default=30, ge=1)

    @model_validator(mode="after")
    def _order(self):
        if self.max_minutes < self.min_minutes:
            raise ValueError(f"max_minutes {self.max_minutes} < min_minutes {self.min_minutes}")
        return self


class HoleDiscovery(_Strict):
    poll_seconds: float = Field(default=5.0, gt=0)
    max_pending_seconds: float = Field(default=30.0, gt=0)
    notice_seconds: int = Field(default=60, ge=0)
    max_pilots: int = Field(default=64, ge=1)


class ObjectiveSpec(_Strict):
    name: Literal["throughput", "speedup", "weighted", "proportional", "maxmin", "deadline"] = "speedup"
    weights: dict[str, float] = Field(default_factory=dict, description="per-job weights by job name (the "
                                      "weighted objective); jobs not named keep TrainingJob.weight")
    t_fwd_seconds: float = Field(default=10.0, gt=0)


class Emulation(_Strict):
    """The embedded default only: which idle pattern to replay on this machine."""

    trace: str = "demo"              # 'demo' (bundled Theta slice) or a path to an idle-interval CSV
    speedup: float = Field(default=30.0, gt=0)
    notice_seconds: float = Field(default=2.0, ge=0)


class Site(_Strict):
    name: str = Field(min_length=1)
    scheduler: Literal["local", "slurm", "pbs"]
    partition: str | None = None           # slurm
    queue: str | None = None               # pbs
    account: str | None = None
    preemptable_qos: str | None = None     # slurm QOS with PreemptMode / pbs preemptable queue
    node: NodeShape
    pilot_walltime: PilotWalltime = Field(default_factory=PilotWalltime)
    worker_init: str = ""
    scheduler_options: list[str] = Field(default_factory=list, description="extra #SBATCH / #PBS options")
    interchange_address: str | None = Field(default=None, description="the address compute nodes reach this "
                                            "host on; unset: workers probe every address (slow to connect)")
    checkpoint_dir: str | None = Field(default=None, description="where jobs' checkpoints go (one folder per "
                                       "job; a relative path is taken from the directory parsl-bft runs in); "
                                       "unset: under the run's state directory")
    holes: HoleDiscovery = Field(default_factory=HoleDiscovery)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    globus_compute_endpoint: UUID | None = None
    emulation: Emulation | None = None
    unverified: list[str] = Field(default_factory=list,
                                  description="fields whose values could not be checked against the facility")

    @field_validator("worker_init", "account", "partition", "queue", "checkpoint_dir", "preemptable_qos")
    @classmethod
    def _no_secrets(cls, v):
        if isinstance(v, str) and _SECRET.search(v):
            raise ValueError("looks like a secret: credentials come from the environment, never a site file")
        return v

    @model_validator(mode="after")
    def _per_scheduler(self):
        if self.scheduler == "slurm" and not self.partition:
            raise ValueError("scheduler 'slurm' needs 'partition'")
        if self.scheduler == "pbs" and not self.queue:
            raise ValueError("scheduler 'pbs' needs 'queue'")
        if self.scheduler != "local" and self.emulation is not None:
            raise ValueError("'emulation' is only for scheduler 'local'")
        fields = set(type(self).model_fields)
        bad = [u for u in self.unverified if u.split(".")[0] not in fields]
        if bad:
            raise ValueError(f"'unverified' names unknown fields: {', '.join(bad)}")
        return self


class SiteError(ParslBftError):
    pass


_REMOVED = {"launcher": "pilots are one node each and start their worker pool themselves",
            "node.memory_gb": "nothing used it (pilots take whole nodes: --exclusive)"}


def _present(doc: dict, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def load_site(path: str | Path) -> Site:
    """Read and validate a site file; errors name the file, the field and what is allowed."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise SiteError(f"{p}: no such site file") from None
    except yaml.YAMLError as e:
        raise SiteError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise SiteError(f"{p}: a site file is a mapping of fields (name, scheduler, node, ...)")
    removed = [k for k in _REMOVED if _present(doc, k)]
    if removed:
        raise SiteError("\n".join(f"{p}: field '{k}' was removed: {_REMOVED[k]}; delete it" for k in removed))
    try:
        return Site(**doc)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(site)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown field; allowed here: {', '.join(_allowed(err['loc']))}"
            msgs.append(f"{p}: field '{loc}': {msg}")
        raise SiteError("\n".join(msgs)) from None


def _allowed(loc) -> list[str]:
    model: type[BaseModel] = Site
    for part in loc[:-1]:
        ann = model.model_fields[str(part)].annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
    return list(model.model_fields)


def config_code(site: Site) -> str:
    """The Parsl Config this site builds, as Python code (what ``parsl-bft sites show`` prints)."""
    label = f"bft_{re.sub(r'[^A-Za-z0-9_]', '_', site.name)}"
    if site.globus_compute_endpoint:
        return (
            "from globus_compute_sdk import Executor\n"
            "from parsl.config import Config\n"
            "from parsl.executors import GlobusComputeExecutor\n\n"
            "# credentials: GLOBUS_COMPUTE_CLIENT_ID / GLOBUS_COMPUTE_CLIENT_SECRET in the environment\n"
            f"config = Config(executors=[GlobusComputeExecutor(label={label!r}, executor=Executor("
            f"endpoint_id={str(site.globus_compute_endpoint)!r}))], retries=0)\n")
    if site.scheduler == "local":
        return ("from parsl_bft.execution.config import local_config\n\n"
                f"config = local_config(workers={max(site.node.cores, 1)}, label={label!r})\n")
    w = site.pilot_walltime
    if site.scheduler == "slurm":
        provider = (f"SlurmPilotProvider(partition={site.partition!r}, qos={site.preemptable_qos!r}, "
                    f"account={site.account!r}, walltime_min_min={w.min_minutes}, walltime_max_min={w.max_minutes}, "
                    f"notice_s={site.holes.notice_seconds}, max_pending_s={site.holes.max_pending_seconds}, "
                    f"worker_init={site.worker_init!r}, poll_s={int(site.holes.poll_seconds)}, "
                    f"scheduler_options={site.scheduler_options!r})")
        imports = "from parsl_bft.execution.slurm import SlurmPilotProvider\n"
    else:
        select = f"1:ncpus={site.node.cores}" + (f":ngpus={site.node.gpus}" if site.node.gpus else "")
        provider = (f"PBSPilotProvider(queue={(site.preemptable_qos or site.queue)!r}, account={site.account!r}, "
                    f"select={select!r}, walltime_min_min={w.min_minutes}, walltime_max_min={w.max_minutes}, "
                    f"notice_s={site.holes.notice_seconds}, max_pending_s={site.holes.max_pending_seconds}, "
                    f"worker_init={site.worker_init!r}, poll_s={int(site.holes.poll_seconds)}, "
                    f"scheduler_options={site.scheduler_options!r})")
        imports = "from parsl_bft.execution.pbs import PBSPilotProvider\n"
    return (
        "from parsl.config import Config\n"
        "from parsl.executors import HighThroughputExecutor\n"
        "from parsl_bft.execution.block_errors import pilot_block_error_handler\n"
        + imports + "\n"
        f"config = Config(\n    executors=[HighThroughputExecutor(\n        label={label!r},\n"
        "        max_workers_per_node=1,\n"
        + (f"        address={site.interchange_address!r},\n" if site.interchange_address else "") +
        "        heartbeat_period=5,\n        heartbeat_threshold=20,     # pilots come and go: notice lost ones soon\n"
        "        block_error_handler=pilot_block_error_handler,   # a pilot that ends is normal\n"
        f"        provider={provider},\n    )],\n"
        "    retries=0,\n    strategy='none',\n)\n")


def build_config(site: Site):
    """Execute ``config_code`` and return the Config (so what is printed is exactly what runs)."""
    ns: dict = {}
    exec(compile(config_code(site), f"<site {site.name}>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["config"]
