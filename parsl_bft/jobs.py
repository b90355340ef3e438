"""Training job specs and job-set files (``*.jobs.csv``, YAML)."""
from __future__ import annotations

import csv
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from .csvio import parse_number, parse_yaml, read_rows, read_small_text
from .errors import BadRows, BadValue, InputError, ParslBftError
from .scaling import LayerProfile, ScalingCurve, read_scaling_table

JOB_COLUMNS = ["name", "model", "min_nodes", "max_nodes", "t_up", "t_down", "samples", "submit"]
OPTIONAL_COLUMNS = ["weight", "deadline", "freeze", "accuracy_budget", "unfreeze"]
OPTIONAL_DEFAULTS = {"weight": 1.0, "deadline": None, "freeze": "off", "accuracy_budget": 0.0, "unfreeze": False}
FreezeMode = Literal["off", "auto"]        # "auto": the planner may freeze a prefix of a job's layers
FREEZE_MODES: tuple[FreezeMode, ...] = get_args(FreezeMode)
COLUMN_DOCS = {         # the docs' job-set reference renders this table
    "name": "the job's name, unique in the set",
    "model": "which rows of the scaling file (`X.scaling.csv`: model,nodes,samples_per_sec) give its throughput",
    "min_nodes": "the fewest nodes it runs on (it waits with 0 below that)",
    "max_nodes": "the most nodes it can use",
    "t_up": "seconds of progress lost when it grows (charged at its current rate)",
    "t_down": "seconds of progress lost when it shrinks or a node is reclaimed",
    "samples": "the work to do, in samples",
    "submit": "unix time it becomes eligible (`simulate --submits relative`: seconds from the replay's start)",
    "weight": "its weight in the `weighted` objective (default 1)",
    "deadline": "unix time it should be done by (the `deadline` objective); empty: none",
    "freeze": "`off` (default) or `auto`: the planner may freeze a prefix of its layers (layer elasticity)",
    "accuracy_budget": "with `freeze=auto`: the predicted accuracy it may lose, a fraction (0.005 = half a point)",
    "unfreeze": "with `freeze=auto`: `true` lets the planner lower the frozen level again (default: only up)",
}
MAX_JOB_NODES = 1_000_000       # sanity cap, as for machines (idle.swf.MAX_NODES)


@dataclass(frozen=True)
class JobSpec:
    """One elastic training job: runs on 0 or [min_nodes, max_nodes] nodes.

    t_up / t_down: seconds of progress lost when the job grows / shrinks (charged at its current rate).
    samples: work to do. submit: unix time it becomes eligible. weight and deadline feed the objectives.
    freeze: "off" (default: every layer trains) or "auto" (the planner may freeze a prefix of the model's layers
    while the predicted accuracy cost stays within ``accuracy_budget``, a fraction: 0.005 = half a point);
    levels only go up unless ``unfreeze``.
    """

    name: str
    model: str
    min_nodes: int
    max_nodes: int
    t_up: float
    t_down: float
    samples: float
    submit: float = 0.0
    weight: float = 1.0
    deadline: float | None = None
    freeze: FreezeMode = "off"
    accuracy_budget: float = 0.0
    unfreeze: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not self.name or not isinstance(self.name, str):
            problems.append(("name", "empty job name"))
        if self.max_nodes > MAX_JOB_NODES:
            problems.append(("max_nodes", f"{self.max_nodes:,} nodes is beyond any machine (sanity cap "
                                          f"{MAX_JOB_NODES:,})"))
        for f in ("t_up", "t_down", "samples", "submit", "weight"):
            if not abs(getattr(self, f)) < float("inf"):
                problems.append((f, f"must be a finite number, got {getattr(self, f)}"))
        if self.min_nodes < 1:
            problems.append(("min_nodes", f"must be >= 1, got {self.min_nodes}"))
        if self.max_nodes < self.min_nodes:
            problems.append(("max_nodes", f"min_nodes {self.min_nodes} > max_nodes {self.max_nodes}"))
        for f in ("t_up", "t_down"):
            if getattr(self, f) < 0:
                problems.append((f, f"must be >= 0, got {getattr(self, f)}"))
        if not self.samples > 0:
            problems.append(("samples", f"must be > 0, got {self.samples}"))
        if not self.weight > 0:
            problems.append(("weight", f"must be > 0, got {self.weight}"))
        if self.freeze not in FREEZE_MODES:
            problems.append(("freeze", f"must be one of {', '.join(FREEZE_MODES)}, got {self.freeze!r}"))
        if not 0 <= self.accuracy_budget <= 1:
            problems.append(("accuracy_budget", f"must be a fraction in [0, 1] (0.005 = half an accuracy point), "
                                                f"got {self.accuracy_budget}"))
        elif self.freeze == "auto" and self.accuracy_budget == 0:
            problems.append(("accuracy_budget", "freeze='auto' needs a budget > 0 (e.g. 0.005): with 0 nothing "
                                                "may ever be frozen"))
        if problems:
            field, msg = problems[0]
            raise JobSpecError(field, f"job {self.name!r}: {msg}", msg)


_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def check_job_name(name: object) -> str:
    """A job's name is its directory's name: one path component of letters, digits, '.', '_' and '-', starting with
    a letter or digit - so no name reaches outside its own directory (no '/', '..', absolute paths, no trailing
    newline) and no two spellings ('a', './a', 'x/../a') share one. Also what the laptop checks a name the
    facility sends back against before it names a file."""
    if not isinstance(name, str) or not _JOB_NAME.match(name):
        raise BadValue(f"job name {str(name)[:60]!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a "
                       "letter or digit (it names the job's directory)")
    return name


class JobSpecError(ParslBftError, ValueError):
    """A job spec that cannot run: ``field`` names the offending field, ``problem`` says what is wrong with it
    (the message names the job too)."""

    def __init__(self, field: str, msg: str, problem: str = "") -> None:
        super().__init__(msg)
        self.field, self.problem = field, problem or msg


@dataclass
class JobSet:
    """Jobs and the throughput curve of every model they use."""

    jobs: list[JobSpec]
    curves: dict[str, ScalingCurve]
    layers: dict[str, LayerProfile] = field(default_factory=dict)   # models measured at freeze levels

    def __post_init__(self) -> None:
        names = set()
        for j in self.jobs:
            if j.name in names:
                raise BadValue(f"duplicate job name {j.name!r}")
            names.add(j.name)
            if j.model not in self.curves:
                raise BadValue(f"job {j.name!r}: no scaling curve for model {j.model!r} "
                               f"(have: {', '.join(sorted(self.curves))})")
            if j.freeze != "off":
                prof = self.layers.get(j.model)
                if prof is None:
                    raise BadValue(f"job {j.name!r}: freeze={j.freeze!r} but model {j.model!r} has no freeze "
                                   "levels in its scaling file (parsl-bft profile --freeze-levels 0,1,...)")
                if prof.n_layers < 2:
                    raise BadValue(f"job {j.name!r}: model {j.model!r} has {prof.n_layers} layer: nothing to "
                                   "freeze while something still trains")

    def curve(self, job: JobSpec) -> ScalingCurve:
        """The throughput curve of ``job``'s model."""
        return self.curves[job.model]


def read_jobs_csv(path: str | Path, *, lenient: bool = False) -> list[JobSpec]:
    """Jobs from a ``*.jobs.csv`` (``JOB_COLUMNS``, optional columns too); errors name the file, line and field
    (``lenient``: damaged rows are skipped and counted instead)."""
    p = str(path)
    bad = BadRows(lenient)
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for line, row in read_rows(path, JOB_COLUMNS, bad):
        try:
            if row["name"] in seen:
                raise InputError(p, line, "name",
                                 f"duplicate job name {row['name']!r} (first on line {seen[row['name']]})")
            num: dict[str, Any] = {f: parse_number(p, line, f, row[f], kind=int) for f in ("min_nodes", "max_nodes")}
            num.update({f: parse_number(p, line, f, row[f]) for f in ("t_up", "t_down", "samples", "submit")})
            if row.get("weight"):
                num["weight"] = parse_number(p, line, "weight", row["weight"])
            if row.get("deadline"):
                num["deadline"] = parse_number(p, line, "deadline", row["deadline"])
            if row.get("accuracy_budget"):
                num["accuracy_budget"] = parse_number(p, line, "accuracy_budget", row["accuracy_budget"])
            if row.get("freeze"):
                num["freeze"] = row["freeze"]
            if row.get("unfreeze"):
                num["unfreeze"] = _parse_bool(p, line, "unfreeze", row["unfreeze"])
            try:
                job = JobSpec(name=row["name"], model=row["model"], **num)
            except JobSpecError as e:
                raise InputError(p, line, e.field, str(e)) from None
        except InputError as e:
            bad.add(e)
            continue
        seen[job.name] = line
        jobs.append(job)
    bad.warn()
    return jobs


def _parse_bool(source: str, line: int, field_name: str, text: object) -> bool:
    v = str(text).strip().lower()
    if v in ("true", "yes", "1"):
        return True
    if v in ("false", "no", "0"):
        return False
    raise InputError(source, line, field_name, f"expected true or false, got {text!r}")


def write_jobs_csv(path: str | Path, jobs: list[JobSpec]) -> None:
    """Write ``jobs`` as a ``*.jobs.csv`` (optional columns only where a job sets them)."""
    extra = [c for c in OPTIONAL_COLUMNS if any(getattr(j, c) != OPTIONAL_DEFAULTS[c] for j in jobs)]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(JOB_COLUMNS + extra)
        for j in jobs:
            d = asdict(j)
            w.writerow([d[c] if d[c] is not None else "" for c in JOB_COLUMNS + extra])


def jobs_from_dicts(items: list[Any], source: str = "<python>") -> list[JobSpec]:
    """Build jobs from plain dicts (YAML, JSON or a workflow), naming the entry and field on error."""
    known = {f.name for f in fields(JobSpec)}
    out = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise InputError(source, i, None, f"job entry {i}: expected a mapping of job fields")
        unknown = set(map(str, item)) - known
        if unknown:
            raise InputError(source, i, sorted(unknown)[0], f"unknown job field; allowed: {', '.join(sorted(known))}")
        item = dict(item)
        for f in ("min_nodes", "max_nodes"):
            if f in item:
                item[f] = int(parse_number(source, i, f, str(item[f]), kind=int))
        for f in ("t_up", "t_down", "samples", "submit", "weight", "deadline", "accuracy_budget"):
            if item.get(f) is not None:
                item[f] = parse_number(source, i, f, str(item[f]))
        if "unfreeze" in item:
            item["unfreeze"] = _parse_bool(source, i, "unfreeze", item["unfreeze"])
        if item.get("freeze") is False:       # YAML reads a bare `freeze: off` as false
            item["freeze"] = "off"
        try:
            out.append(JobSpec(**item))
        except TypeError as e:
            raise InputError(source, i, None, f"job entry {i}: {e}") from None
        except JobSpecError as e:
            raise InputError(source, i, e.field, str(e)) from None
    return out


def load_yaml(p: Path) -> Any:
    """A YAML document from a small regular file (``csvio.parse_yaml``: aliases refused); errors are InputErrors
    naming the file (and line)."""
    return parse_yaml(read_small_text(p), str(p))


def read_jobset_yaml(path: str | Path) -> JobSet:
    """YAML equivalent of the two CSV files::

        jobs:
          - {name: a, model: resnet18, min_nodes: 1, max_nodes: 8, t_up: 18, t_down: 11, samples: 1e6}
        scaling:
          resnet18: {1: 5218.8, 2: 10582.5, 4: 20436.0}
        # or: scaling_csv: imagenet_mix.scaling.csv   (relative to this file)

    Line numbers in errors count job entries (1-based), since YAML has no row lines.
    """
    p = Path(path)
    doc = load_yaml(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise InputError(str(p), 0, "jobs", "expected a mapping with a 'jobs' list")
    jobs = jobs_from_dicts(doc["jobs"], str(p))
    curves: dict[str, ScalingCurve] = {}
    layers: dict[str, LayerProfile] = {}
    if "scaling_csv" in doc:
        if not isinstance(doc["scaling_csv"], str):
            raise InputError(str(p), 0, "scaling_csv", "expected a file name")
        table = read_scaling_table(p.parent / doc["scaling_csv"])
        curves.update(table.curves)
        layers.update(table.layers)
    scaling = doc.get("scaling") or {}
    if not isinstance(scaling, dict):
        raise InputError(str(p), 0, "scaling", "expected a mapping model -> {nodes: samples/s}")
    for model, pts in scaling.items():
        try:
            if not isinstance(pts, dict):
                raise ValueError("expected a mapping {nodes: samples/s}")
            curves[str(model)] = ScalingCurve(str(model), {int(n): float(r) for n, r in pts.items()})
        except (ValueError, TypeError, OverflowError) as e:
            raise InputError(str(p), 0, f"scaling.{model}", str(e)) from None
    try:
        return JobSet(jobs, curves, layers)
    except ValueError as e:
        raise InputError(str(p), 0, None, str(e)) from None


def load_jobset(jobs: str | Path, scaling: str | Path | None = None, *, lenient: bool = False) -> JobSet:
    """Load a job set from ``X.jobs.csv`` (+ ``X.scaling.csv``, found beside it if not given) or a YAML file."""
    jp = Path(jobs)
    js = _load_jobset(jp, scaling, lenient)
    if not js.jobs:                     # a report of nothing, exit 0, said nothing was wrong
        raise InputError(str(jp), 0, None, "no jobs in this job set")
    return js


def _load_jobset(jp: Path, scaling: str | Path | None, lenient: bool) -> JobSet:
    if jp.suffix in (".yaml", ".yml"):
        return read_jobset_yaml(jp)
    if scaling is None:
        guess = jp.with_name(jp.name.replace(".jobs.csv", ".scaling.csv"))
        if guess == jp or not guess.exists():
            raise InputError(str(jp), 0, None, "no scaling file given and none found beside it (X.scaling.csv)")
        scaling = guess
    try:
        table = read_scaling_table(scaling, lenient=lenient)
        return JobSet(read_jobs_csv(jp, lenient=lenient), table.curves, table.layers)
    except ValueError as e:
        raise InputError(str(jp), 0, "model", str(e)) from None
