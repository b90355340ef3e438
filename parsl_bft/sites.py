"""Site files: a facility described once (YAML), validated with pydantic. The schema only: it builds nothing.

Every field is used (one the site's scheduler would ignore is an error): ``parsl_bft.execution.site_runtime``
turns a validated ``Site`` into what a run needs (the Parsl Config, the idle pool, the planner, the checkpoint
location, ranks per node), once per site; ``parsl-bft sites show`` prints that Config's own repr, which is code
that builds it again.

Secrets never belong in a site file: Globus Compute credentials come from the environment
(GLOBUS_COMPUTE_CLIENT_ID / GLOBUS_COMPUTE_CLIENT_SECRET); a value that looks like a secret is rejected.
"""
from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import BadValue, InputError, ParslBftError
from .site_options import managed_options

# the embedded default (this machine, an emulated idle pool): ships inside the package
DEFAULT_SITE = Path(str(files("parsl_bft") / "data" / "sites" / "local.yaml"))
_SECRETS = [re.compile(p, re.I) for p in (
    r"(secret|passw(or)?d|passwd|pwd|token|api[_-]?key|access[_-]?key|private[_-]?key|credential)s?\s*[=:]",
    r"(?<![\w-])--?(password|passwd|pass|token|secret|api-?key|access-?key|client-?secret)(\s*=|\s+)\S",
    r"\bauthorization\s*:", r"\bbearer\s+[\w.~+/=-]{6,}", r"\bbasic\s+[A-Za-z0-9+/=]{12,}",
    r"\bAKIA[0-9A-Z]{16}\b", r"\bgh[pousr]_[A-Za-z0-9]{20,}", r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----", r"\beyJ[\w-]{8,}\.[\w-]{8,}\.",
    r"://[^/\s:@]+:[^/\s@]+@",          # user:password@ in a URL
    # a literal assigned to a name that ends like a credential (MY_PASS=, GITHUB_PAT=, WANDB_KEY=, AccountKey=);
    # $VAR references pass (the value comes from the environment), as do TOKENIZERS_PARALLELISM= or PATH=
    r"\b\w*(pass|passwd|password|secret|token|credential|pwd|pat|key)\s*=\s*['\"]?[^\s$'\"]",
    r"\bsshpass\b", r"\bmysql\b[^|;&\n]*\s-p\S", r"\|\s*(sudo\s+)?kinit\b")]
_TOKEN = re.compile(r"^[A-Za-z0-9._:@+,=/%-]+\Z")          # a scheduler token: partition, account, queue, QOS ...
_SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")   # names a folder (sites/<name>/jobs) and a label
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.:&|*\[\]()!,=-]+\Z")   # Slurm's feature expressions: gpu&hbm80g, [a|b]
_MEM = re.compile(r"^(\d+)\s*([KMGT])B?\Z", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")           # newline and tab are allowed in worker_init only


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds something shaped like a credential (a password option, a token, a key)."""
    return any(p.search(text) for p in _SECRETS)


def _strings(v: object, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a field's value (list items and mapping keys and values included), with where it is."""
    if isinstance(v, str):
        yield where, v
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from _strings(x, f"{where}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _strings(k, f"{where}(key)")
            yield from _strings(x, f"{where}.{k}")
    elif isinstance(v, BaseModel):
        for k in type(v).model_fields:
            yield from _strings(getattr(v, k), f"{where}.{k}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeShape(_Strict):
    """What one node of the site has: cores, accelerators, and the training ranks a fragment runs on it."""

    cores: int = Field(ge=1, description="CPU cores of a node: the fragment slots of a local site, ncpus of "
                       "a PBS pilot's select; Slurm pilots take whole nodes (--exclusive)")
    gpus: int = Field(default=0, ge=0, description="accelerators per node (Polaris, Perlmutter: 4); pilots "
                      "ask for them (Slurm --gpus-per-node unless scheduler_options asks already; PBS ngpus in "
                      "select)")
    ranks_per_node: int | None = Field(default=None, ge=1, description="training ranks a fragment runs on each "
                                       "node; default: one per GPU (CPU-only nodes: 1)")

    @model_validator(mode="after")
    def _ranks(self) -> NodeShape:
        if self.ranks_per_node is None:
            self.ranks_per_node = self.gpus or 1
        elif self.gpus and self.ranks_per_node > self.gpus:
            raise BadValue(f"ranks_per_node {self.ranks_per_node} > gpus {self.gpus}: one rank per accelerator")
        return self


class PilotWalltime(_Strict):
    """The bounds of a pilot's walltime (pilots hold idle nodes; a pilot asks for the hole's length)."""

    min_minutes: int = Field(default=1, ge=1, description="the least walltime a pilot asks for (its "
                             "walltime is the hole's length in whole minutes, within these bounds)")
    max_minutes: int = Field(default=30, ge=1, description="the most walltime a pilot asks for (a longer hole "
                             "takes pilots in turn)")

    @model_validator(mode="after")
    def _order(self) -> PilotWalltime:
        if self.max_minutes < self.min_minutes:
            raise BadValue(f"max_minutes {self.max_minutes} < min_minutes {self.min_minutes}")
        return self


class HoleDiscovery(_Strict):
    """How idle nodes (holes) are found through the scheduler and held with pilots."""

    poll_seconds: float = Field(default=30.0, gt=0, description="seconds between scheduler surveys: 2 queries "
                                "each (sinfo + squeue -t all, or pbsnodes + qstat), whatever the number of pilots, "
                                "+ 1 a minute for reservations: 5 a minute at 30 s. Shorter finds holes sooner and "
                                "costs the scheduler more: agree it with its admins")
    max_pending_seconds: float = Field(default=30.0, gt=0, description="a pilot still queued after this long is "
                                       "cancelled (the hole was taken)")
    notice_seconds: int = Field(default=60, ge=0, description="the reclaim notice: the scheduler signals a "
                                "pilot this long before its walltime ends (Slurm --signal); its fragment is told "
                                "to checkpoint at most this long before, and once stops have been timed, twice "
                                "the slowest recent stop plus three polls before")
    grace_seconds: int | None = Field(default=None, ge=1, description="Slurm: seconds a pilot's worker gets to "
                                      "save after the scheduler's SIGTERM (preemption, scancel) before the pilot "
                                      "kills it; unset: the partition's GraceTime (scontrol show partition), "
                                      "else 3")
    max_pilots: int = Field(default=64, ge=1, description="nodes held at most")
    unused_pilot_seconds: float = Field(default=300.0, gt=0, description="a running pilot none of whose nodes the "
                                        "plan has given a job for this long is given back (its hours are charged "
                                        "for nothing); the pool may submit a fresh one if a job wants it later")
    max_pilots_per_minute: int = Field(default=12, ge=1, description="pilot submissions (sbatch/qsub) in any "
                                       "60 s at most: holes that open and close fast cannot flood the queue")
    max_jobs: int | None = Field(default=None, ge=1, description="the facility's cap on your queued jobs, where "
                                 "the scheduler does not say (sacctmgr / qstat -Q); holes then share pilots")


class ObjectiveSpec(_Strict):
    """What the planner maximises; a run over several sites has one objective, so their sites must agree."""

    name: Literal["throughput", "speedup", "weighted", "proportional", "maxmin", "deadline"] = Field(
        default="speedup", description="what the planner maximises over the jobs (the docs' "
        "explanation/method page says what each one values)")
    weights: dict[str, float] = Field(default_factory=dict, description="per-job weights by job name (the "
                                      "weighted objective); jobs not named keep TrainingJob.weight")
    t_fwd_seconds: float = Field(default=10.0, gt=0, description="the planner's look-ahead: a rescale must pay "
                                 "for itself within this many seconds")


class Emulation(_Strict):
    """The embedded default only: which idle pattern to replay on this machine."""

    trace: str = Field(default="demo", description="'demo' (a bundled slice of ALCF Theta's 2022 log) or an "
                       "idle-interval CSV (node,idle_start,idle_end in seconds)")
    speedup: float = Field(default=30.0, gt=0, description="replay this many times faster than the log")
    notice_seconds: float = Field(default=2.0, ge=0, description="reclaim notice before an emulated node leaves")


_PILOTS_ONLY = {"partition", "queue", "account", "preemptable_qos", "constraint", "mem", "reservation",
                "pilot_walltime", "worker_init", "scheduler_options", "interchange_address", "holes"}
_UNUSED_BY = {"local": _PILOTS_ONLY, "slurm": {"queue"},
              "pbs": {"partition", "preemptable_qos", "constraint", "reservation"}}
# what the site file AT THE FACILITY (remote.site) or the endpoint's own config says for a run submitted through
# Globus Compute: from the laptop these would mean nothing
_FACILITY_ONLY = _PILOTS_ONLY | {"checkpoint_dir", "emulation", "topology", "objective"}


class RemoteRuns(_Strict):
    """Runs submitted through a Globus Compute endpoint (``parsl-bft submit``): paths at the facility."""

    site: str | None = Field(default=None, description="the site file at the facility that the run's "
                             "orchestrator uses there (partition, account, worker_init ...); unset: the embedded "
                             "default of the endpoint's machine")
    runs_dir: str = Field(default="~/.parsl-bft/runs", description="where runs live at the facility: one state "
                          "folder per run id")

    @field_validator("site", "runs_dir")
    @classmethod
    def _facility_path(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith("/") or v.startswith("~")):
            raise BadValue("a path at the facility: absolute or from the home directory (~/...)")
        return v


class Site(_Strict):
    """A validated site file: a facility's scheduler, its nodes, how pilots hold them and what the planner
    maximises there."""

    name: str = Field(min_length=1, description="names the site's Parsl executor (bft_<name>) and, in a "
                      "run over several sites, its folder sites/<name>/")
    scheduler: Literal["local", "slurm", "pbs"] = Field(description="local: the embedded default (this machine, "
                                                        "an emulated idle pool); slurm or pbs: pilot jobs")
    partition: str | None = Field(default=None, description="Slurm partition for pilots")
    queue: str | None = Field(default=None, description="PBS queue for pilots")
    account: str | None = Field(default=None, description="allocation charged for pilots (--account / -A)")
    preemptable_qos: str | None = Field(default=None, description="Slurm only: a QOS with PreemptMode, so the "
                                        "facility may take pilots back at once (on PBS, name the preemptable "
                                        "queue as queue)")
    constraint: str | None = Field(default=None, description="Slurm only: the node features pilots need "
                                   "(--constraint: gpu, gpu&hbm80g, [a|b])")
    mem: str | None = Field(default=None, description="memory a pilot asks for on each node, with its unit (64G, "
                            "512M): Slurm --mem, PBS mem in the select chunk; unset: the scheduler's default")
    reservation: str | None = Field(default=None, description="Slurm only: an advance reservation pilots run in "
                                    "(--reservation); on PBS a reservation is a queue: name it as queue")
    node: NodeShape | None = Field(default=None, description="what one node has; required but on a Globus "
                                   "Compute site (a laptop's: the facility's own site file says it)")
    pilot_walltime: PilotWalltime = Field(default_factory=PilotWalltime, description="pilot lengths")
    worker_init: str = Field(default="", description="shell lines a pilot runs before its worker pool starts "
                             "(module load, conda activate ...)")
    scheduler_options: list[str] = Field(default_factory=list, description="extra #SBATCH / #PBS options, one "
                                         "each, without the prefix; options parsl-bft writes itself (nodes, "
                                         "time, partition, QOS, queue, signal, job name, output, select, "
                                         "walltime ...) are refused, naming the field to use instead")
    interchange_address: str | None = Field(default=None, description="the address compute nodes reach this "
                                            "host on; unset: workers probe every address (slow to connect)")
    checkpoint_dir: str | None = Field(default=None, description="where jobs' checkpoints go: "
                                       "<checkpoint_dir>/<run-id>/<job>/, one folder per run and job; yours "
                                       "alone (not writable by others); a relative path is taken from the "
                                       "directory parsl-bft runs in; unset: under the run's state directory")
    holes: HoleDiscovery = Field(default_factory=HoleDiscovery, description="finding idle nodes and holding "
                                 "them with pilots")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="the planner's objective")
    globus_compute_endpoint: str | None = Field(
        default=None, description="a Globus Compute endpoint at the facility: runs are submitted through it (the "
        "docs' remote-run tutorial); 'local': a stand-in endpoint on this machine, to try the remote cycle "
        "without Globus (each call runs in a fresh process here)")
    remote: RemoteRuns | None = Field(default=None, description="with globus_compute_endpoint: where submitted "
                                      "runs live at the facility (`parsl-bft submit`)")
    emulation: Emulation | None = Field(default=None, description="scheduler local only: the idle pattern "
                                        "replayed on this machine")
    # a bare "dict": the generated reference says "dict or null"
    topology: dict | None = Field(
        default=None, description="network groups for contention-aware planning: groups or hostname, "
        "gpus_per_node, intra_gbps, inter_gbps (parsl_bft.topology.topology_from_dict)")

    @field_validator("topology")
    @classmethod
    def _topology(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            from .topology import topology_from_dict
            topology_from_dict(v, source="topology")
        return v

    unverified: list[str] = Field(default_factory=list,
                                  description="fields whose values could not be checked against the facility")

    @field_validator("*")
    @classmethod
    def _no_secrets(cls, v: Any) -> Any:
        """Over every string field and every list item (scheduler_options included); the message never repeats
        the value."""
        for where, text in _strings(v):
            if looks_secret(text):
                raise BadValue(f"{'item ' + where.lstrip('.') + ' ' if where else ''}looks like a secret: "
                               "credentials come from the environment, never a site file")
            if _CONTROL.search(text):
                raise BadValue(f"{'item ' + where.lstrip('.') + ' ' if where else ''}contains control "
                               "characters")
        return v

    @field_validator("partition", "queue", "account", "preemptable_qos", "reservation", "interchange_address")
    @classmethod
    def _token(cls, v: str | None) -> str | None:
        """Pasted into #SBATCH / #PBS lines: one token, no whitespace or shell characters."""
        if v is not None and not _TOKEN.match(v):
            raise BadValue("must be one token of letters, digits and . _ : @ + , = / % - (no spaces, newlines "
                           "or shell characters)")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _SITE_NAME.match(v):
            raise BadValue("use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (it names "
                           "a folder)")
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None and not _CONSTRAINT.match(v):
            raise BadValue("a Slurm feature expression: letters, digits and _ . : & | * [ ] ( ) ! , = - (no "
                           "spaces)")
        return v

    @field_validator("mem", mode="before")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        v = str(v) if isinstance(v, int) else v          # mem: 64 -> "a size with its unit", not "a string"
        if not isinstance(v, str):
            return v
        m = _MEM.match(v)
        if m is None or int(m.group(1)) == 0:
            raise BadValue(f"a size with its unit K, M, G or T (64G, 512M), got {v[:40]!r}")
        return f"{m.group(1)}{m.group(2).upper()}"

    @field_validator("scheduler_options")
    @classmethod
    def _options(cls, v: list[str], info: ValidationInfo) -> list[str]:
        for i, o in enumerate(v):
            if not o.strip() or "\n" in o or "\r" in o or "\t" in o:
                raise BadValue(f"item [{i}] must be one non-empty line (one #SBATCH / #PBS option)")
            try:                # sbatch and qsub split an option line as a shell does: a lone quote broke every pilot
                shlex.split(o)
            except ValueError as e:
                raise BadValue(f"item [{i}] {o[:80]!r}: {str(e).lower()} (sbatch / qsub would refuse every "
                               "pilot)") from None
        # the fields declared above this one are in info.data: scheduler, account, constraint, mem, reservation
        fields = {k for k in ("account", "constraint", "mem", "reservation") if info.data.get(k)}
        managed = managed_options(str(info.data.get("scheduler", "")), v, fields)
        if managed:
            raise BadValue("parsl-bft writes these itself (sbatch and qsub take the last of a repeated "
                           "option, so yours would win): " + "; ".join(managed) + "; delete "
                           + ("it" if len(managed) == 1 else "them"))
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and ('"' in v or "\n" in v or not v.strip()):
            raise BadValue("must be a path without double quotes or newlines")
        return v

    @field_validator("globus_compute_endpoint")
    @classmethod
    def _endpoint_id(cls, v: str | None) -> str | None:
        if v is None or v == "local":
            return v
        try:
            return str(UUID(v))
        except ValueError:
            raise BadValue(f"not a Globus Compute endpoint id: a UUID (globus-compute-endpoint list prints "
                           f"it) or 'local', got {v[:40]!r}") from None

    @model_validator(mode="after")
    def _per_scheduler(self) -> Site:
        if self.remote is not None and not self.globus_compute_endpoint:
            raise BadValue("'remote' is only for a site with 'globus_compute_endpoint'")
        # a field the scheduler would ignore is an error: a site file means what it says
        if self.globus_compute_endpoint:
            unused = sorted(_FACILITY_ONLY & self.model_fields_set)
            if unused:
                raise BadValue(f"a Globus Compute site does not use {', '.join(unused)}: the facility's own "
                               "site file (remote.site) or the endpoint's config says that; delete "
                               f"{'it' if len(unused) == 1 else 'them'}")
        else:
            if self.node is None:
                raise BadValue(f"scheduler '{self.scheduler}' needs 'node' (what one node has: cores, gpus)")
            if self.scheduler == "slurm" and not self.partition:
                raise BadValue("scheduler 'slurm' needs 'partition'")
            if self.scheduler == "pbs" and not self.queue:
                raise BadValue("scheduler 'pbs' needs 'queue'")
            if self.scheduler != "local" and self.emulation is not None:
                raise BadValue("'emulation' is only for scheduler 'local'")
            unused = sorted(_UNUSED_BY[self.scheduler] & self.model_fields_set)
            if self.scheduler == "pbs" and "preemptable_qos" in unused:
                raise BadValue("scheduler 'pbs' has no QOS: name the preemptable queue as 'queue' (and delete "
                               "preemptable_qos)")
            if self.scheduler == "pbs" and self.holes.grace_seconds is not None:
                raise BadValue("scheduler 'pbs' does not use holes.grace_seconds (PBS's own kill_delay governs "
                               "after its SIGTERM): delete it")
            if self.scheduler == "pbs" and "reservation" in unused:
                raise BadValue("on PBS a reservation is a queue (R123 ...): name it as 'queue' (and delete "
                               "reservation)")
            if unused:
                raise BadValue(f"scheduler '{self.scheduler}' does not use {', '.join(unused)}: delete "
                               f"{'it' if len(unused) == 1 else 'them'}")
        fields = set(type(self).model_fields)
        bad = [u for u in self.unverified if u.split(".")[0] not in fields]
        if bad:
            raise BadValue(f"'unverified' names unknown fields: {', '.join(bad)}")
        return self


class SiteError(ParslBftError):
    """A site file that cannot be used, or sites that cannot run together; the message names the file or the
    site, and the field."""


_REMOVED = {"launcher": "pilots are one node each and start their worker pool themselves",
            "node.memory_gb": "nothing used it (pilots take whole nodes: --exclusive); to ask for memory, use "
                              "the top-level 'mem' (64G)"}


def _present(doc: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def load_site(path: str | Path) -> Site:
    """Read and validate a site file; errors name the file, the field and what is allowed."""
    from .csvio import parse_yaml, read_small_text

    p = Path(path)
    if not p.exists():
        raise SiteError(f"{p}: no such site file")
    try:
        doc = parse_yaml(read_small_text(p, limit=1 << 20), str(p))
    except InputError as e:
        raise SiteError(str(e)) from None
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
                allowed = _allowed(err["loc"])
                near = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1, cutoff=0.6)
                hint = f"did you mean '{near[0]}'? " if near else ""
                msg = f"unknown field; {hint}allowed here: {', '.join(allowed)}"
            msgs.append(f"{p}: field '{loc}': {msg}")
        raise SiteError("\n".join(msgs)) from None


def _allowed(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = Site
    for part in loc[:-1]:
        ann = model.model_fields[str(part)].annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
    return list(model.model_fields)
