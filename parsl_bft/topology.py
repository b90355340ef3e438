"""Network topology: which group (rack, leaf switch, dragonfly group) each node is in, and how fast the links are.

An input like idle capacity: read from the scheduler (Slurm's topology/tree plugin, PBS vnode resources), a site
file's ``topology:`` section, or node names (Summit's ``a01n01`` is rack a01). The planner and the simulator's
rate model consume it; nothing here imports Parsl. Sources:

- ``parse_slurm_topology``: ``scontrol show topology`` or a topology.conf (leaf switches = groups);
- ``parse_pbsnodes_topology``: ``pbsnodes -a -F json`` with a placement-set resource (``switch``, ``tier0``...);
- ``topology_from_dict``: a site file's ``topology:`` section;
- ``HOSTNAME_RULES`` / ``hostname_topology``: a regular expression on node names;
- ``slurm_topology``: the live cluster's (``scontrol show topology``);
- ``load_topology(spec)``: any of the above from a command-line spec.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ParslBftError
from .hostlist import MAX_HOSTS, count_hosts, expand_hostlist

# Assumed link speeds (GB/s) when a source does not say: a node's injection bandwidth inside its group, and
# one job's share of the group's uplinks when nothing else uses them (a 2:1 tapered fat tree).
DEFAULT_INTRA_GBPS = 25.0
DEFAULT_INTER_GBPS = 12.5

# node-name rules: the first that matches names the group
HOSTNAME_RULES: dict[str, tuple[str, ...]] = {
    # Summit / Sierra: a01n01 = rack a01, node 1; HPE Cray EX (Polaris, Frontier): x3001c0s1b0n0 = cabinet x3001
    "hostname-rack": (r"^(?P<group>[a-z]\d+)n\d+$", r"^(?P<group>x\d+)c\d+s\d+b\d+n\d+$"),
}


class TopologyError(ParslBftError, ValueError):
    """A topology source that cannot be read; the message names the source and the bad part."""


@dataclass(frozen=True)
class Topology:
    """Nodes -> groups, accelerators per node, intra- and inter-group bandwidth.

    ``groups`` maps known nodes to their group; ``rules`` (regular expressions with a ``group`` capture) name the
    group of any other node. A node neither knows is an error (``group``) - or its own group, with
    ``singletons=True`` (a log whose nodes the site file does not list: each is then a group of one, the
    contention-blind worst case).
    """

    groups: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[str, ...] = ()
    gpus_per_node: int = 1
    intra_gbps: float = DEFAULT_INTRA_GBPS
    inter_gbps: float = DEFAULT_INTER_GBPS
    source: str = ""
    singletons: bool = False
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _cache: dict[str, str] = field(init=False, repr=False, compare=False)     # node -> group, by the rules

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise TopologyError(f"gpus_per_node must be >= 1, got {self.gpus_per_node} ({self.source})")
        if not (self.intra_gbps > 0 and self.inter_gbps > 0):
            raise TopologyError(f"bandwidths must be > 0, got intra {self.intra_gbps}, inter {self.inter_gbps} "
                                f"({self.source})")
        compiled = []
        for r in self.rules:
            try:
                c = re.compile(r)
            except re.error as e:
                raise TopologyError(f"bad hostname rule {r!r}: {e}") from None
            if "group" not in c.groupindex:
                raise TopologyError(f"hostname rule {r!r} has no (?P<group>...) capture")
            compiled.append(c)
        object.__setattr__(self, "_compiled", tuple(compiled))
        object.__setattr__(self, "_cache", {})

    def group(self, node: str) -> str:
        """The group ``node`` is in: listed, else by the first rule that matches (TopologyError: none)."""
        g = self.groups.get(node)
        if g is not None:
            return g
        cache = self._cache
        if node in cache:
            return cache[node]
        for c in self._compiled:
            m = c.match(node)
            if m:
                cache[node] = m.group("group")
                return cache[node]
        if self.singletons:
            cache[node] = node
            return node
        raise TopologyError(f"node {node!r} is in no group of topology {self.source or '(unnamed)'}")

    def by_group(self, nodes: Iterable[str]) -> dict[str, list[str]]:
        """``nodes`` by group, in their order."""
        out: dict[str, list[str]] = {}
        for n in nodes:
            out.setdefault(self.group(n), []).append(n)
        return out

    def span(self, nodes: Iterable[str]) -> int:
        """Number of groups ``nodes`` touch."""
        return len({self.group(n) for n in nodes})


# --- Slurm --------------------------------------------------------------------------------------------------
def _hosts(text: str) -> tuple[str, ...]:
    try:
        return expand_hostlist(text)
    except ValueError as e:
        raise TopologyError(str(e)) from None


class _HostBudget:
    """MAX_HOSTS names in total over a topology's host lists, counted before each is expanded: the cap per list
    let 60 lists of a million names (a 1.7 KB site file) take 3.8 GB and end in a MemoryError."""

    def __init__(self, source: str) -> None:
        self.source, self.total = source, 0

    def take(self, members: str | list[str]) -> None:
        try:
            self.total += count_hosts(members) if isinstance(members, str) else len(members)
        except ValueError as e:
            raise TopologyError(str(e)) from None
        if self.total > MAX_HOSTS:
            raise TopologyError(f"{self.source}: its host lists name more than {MAX_HOSTS:,} hosts in total: beyond "
                                "any machine")


def parse_slurm_topology(text: str, *, gpus_per_node: int = 1, intra_gbps: float = DEFAULT_INTRA_GBPS,
                         inter_gbps: float = DEFAULT_INTER_GBPS, source: str = "slurm") -> Topology:
    """``scontrol show topology`` (topology/tree) or a topology.conf: leaf switches (those with ``Nodes=`` and
    no ``Switches=``) are the groups. A node under two leaves is an error (Slurm rejects it too)."""
    leaves: list[tuple[int, str, str]] = []      # every leaf's host list counted before any is expanded
    budget = _HostBudget(source)
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name = fields.get("SwitchName")
        if not name:
            raise TopologyError(f"{source} line {lineno}: no SwitchName= in {line!r}")
        if "Nodes" not in fields or fields.get("Switches"):
            continue
        budget.take(fields["Nodes"])
        leaves.append((lineno, name, fields["Nodes"]))
    groups: dict[str, str] = {}
    for lineno, name, nodes in leaves:
        for n in _hosts(nodes):
            if n in groups and groups[n] != name:
                raise TopologyError(f"{source} line {lineno}: node {n} is under leaf switches {groups[n]} and {name}")
            groups[n] = name
    if not groups:
        raise TopologyError(f"{source}: no leaf switch lists nodes (is TopologyPlugin=topology/tree set?)")
    return Topology(groups, gpus_per_node=gpus_per_node, intra_gbps=intra_gbps, inter_gbps=inter_gbps,
                    source=source)


def slurm_topology(**kw) -> Topology:
    """The live cluster's: ``scontrol show topology`` (SLURM_CONF from the environment)."""
    import subprocess
    try:
        r = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TopologyError(f"scontrol show topology: {e}") from None
    if r.returncode != 0:
        raise TopologyError(f"scontrol show topology failed: {(r.stderr or r.stdout).strip()[:300]}")
    return parse_slurm_topology(r.stdout, source="scontrol show topology", **kw)


# --- PBS ----------------------------------------------------------------------------------------------------
PBS_GROUP_KEYS = ("switch", "tier0", "rack", "group", "tier1")


def parse_pbsnodes_topology(text: str, *, key: str | None = None, intra_gbps: float = DEFAULT_INTRA_GBPS,
                            inter_gbps: float = DEFAULT_INTER_GBPS, source: str = "pbsnodes") -> Topology:
    """``pbsnodes -a -F json``: the group is the vnode resource ``key`` (a placement-set key of the server's
    node_group_key; default: the first of PBS_GROUP_KEYS that every node has); GPUs per node are the most common
    ``ngpus``."""
    try:
        nodes = json.loads(text)["nodes"]
    except (ValueError, KeyError, TypeError) as e:
        raise TopologyError(f"{source}: not pbsnodes -F json output ({e})") from None
    if not isinstance(nodes, dict) or not all(isinstance(v, dict) and isinstance(v.get("resources_available", {}),
                                                                                 dict) for v in nodes.values()):
        raise TopologyError(f"{source}: not pbsnodes -F json output ('nodes' is not an object of nodes by name)")
    avail = {n: (v.get("resources_available") or {}) for n, v in nodes.items()}
    if key is None:
        key = next((k for k in PBS_GROUP_KEYS if avail and all(k in a for a in avail.values())), None)
        if key is None:
            raise TopologyError(f"{source}: no vnode resource names a group for every node (tried "
                                f"{', '.join(PBS_GROUP_KEYS)}; pass key=)")
    missing = [n for n, a in avail.items() if key not in a]
    if missing:
        raise TopologyError(f"{source}: nodes without resources_available.{key}: {', '.join(missing[:5])}")
    gpus = [int(a.get("ngpus", 0)) for a in avail.values() if int(a.get("ngpus", 0)) > 0]
    per_node = max(set(gpus), key=gpus.count) if gpus else 1
    return Topology({n: str(a[key]) for n, a in avail.items()}, gpus_per_node=per_node, intra_gbps=intra_gbps,
                    inter_gbps=inter_gbps, source=f"{source} ({key})")


# --- site file and hostnames ----------------------------------------------------------------------------------
_DICT_KEYS = {"groups", "hostname", "gpus_per_node", "intra_gbps", "inter_gbps"}


def topology_from_dict(doc: Mapping, source: str = "topology section") -> Topology:
    """A site file's ``topology:`` section::

        topology:
          groups: {sw0: "n[1-4]", sw1: "n[5-8]"}     # or hostname: hostname-rack | a regex with (?P<group>...)
          gpus_per_node: 4
          intra_gbps: 25
          inter_gbps: 12.5
    """
    if not isinstance(doc, Mapping):
        raise TopologyError(f"{source}: expected a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _DICT_KEYS)
    if unknown:
        raise TopologyError(f"{source}: unknown field(s) {', '.join(map(str, unknown))}; allowed: "
                            f"{', '.join(sorted(_DICT_KEYS))}")
    if ("groups" in doc) == ("hostname" in doc):
        raise TopologyError(f"{source}: give exactly one of 'groups' or 'hostname'")
    groups: dict[str, str] = {}
    listed = doc.get("groups", {})
    if not isinstance(listed, Mapping) or ("groups" in doc and not listed):
        raise TopologyError(f"{source}: 'groups' must map each group to its nodes (a hostlist such as "
                            f"\"n[1-4]\", or a list of names), got {listed!r}")
    budget = _HostBudget(source)
    for g, members in listed.items():       # every list counted before any is expanded
        if not isinstance(members, str) and not (isinstance(members, list) and members
                                                 and all(isinstance(m, str) for m in members)):
            raise TopologyError(f"{source}: group {g!r}: its nodes must be a hostlist such as \"n[1-4]\" or a "
                                f"list of names, got {members!r}")
        budget.take(members)
    for g, members in listed.items():
        names = _hosts(members) if isinstance(members, str) else members
        for n in names:
            if n in groups:
                raise TopologyError(f"{source}: node {n} is in groups {groups[n]} and {g}")
            groups[n] = str(g)
    rules: tuple[str, ...] = ()
    if "hostname" in doc:
        h = str(doc["hostname"])
        rules = HOSTNAME_RULES.get(h, (h,))
    try:
        return Topology(groups, rules, gpus_per_node=int(doc.get("gpus_per_node", 1)),
                        intra_gbps=float(doc.get("intra_gbps", DEFAULT_INTRA_GBPS)),
                        inter_gbps=float(doc.get("inter_gbps", DEFAULT_INTER_GBPS)), source=source)
    except (TypeError, ValueError) as e:
        raise TopologyError(f"{source}: {e}") from None


def hostname_topology(rule: str = "hostname-rack", **kw: Any) -> Topology:
    """Groups from node names: ``rule`` is a ``HOSTNAME_RULES`` name or a regular expression with a ``group``
    capture; ``kw`` sets the other Topology fields."""
    return Topology(rules=HOSTNAME_RULES.get(rule, (rule,)), source=rule, **kw)


def load_topology(spec: str, **kw: Any) -> Topology:
    """``hostname-rack`` | ``hostname:REGEX`` | ``slurm`` (ask the live cluster) | a file: topology.conf / saved
    ``scontrol show topology`` text,
    ``pbsnodes -a -F json`` output (.json), or YAML with a ``topology:`` section (a site file) or the section
    itself. Keyword arguments (gpus_per_node, intra_gbps, inter_gbps) override the source's defaults."""
    if spec in HOSTNAME_RULES:
        return hostname_topology(spec, **kw)
    if spec.startswith("hostname:"):
        return hostname_topology(spec[len("hostname:"):], **kw)
    if spec == "slurm":
        return slurm_topology(**kw)
    path = Path(spec)
    if not path.is_file():
        raise TopologyError(f"topology {spec!r}: not a file and not one of {', '.join(HOSTNAME_RULES)}, "
                            "hostname:REGEX or slurm")
    # bad bytes, bad YAML: an error naming the file, not a traceback
    if path.suffix in (".yaml", ".yml"):
        from .jobs import load_yaml
        doc = load_yaml(path) or {}
        return _override(topology_from_dict(doc.get("topology", doc) if isinstance(doc, dict) else doc,
                                            source=str(path)), kw)
    from .csvio import read_small_text
    text = read_small_text(path)
    if path.suffix == ".json":
        return _override(parse_pbsnodes_topology(text, source=str(path)), kw)
    return _override(parse_slurm_topology(text, source=str(path)), kw)


def _override(t: Topology, kw: dict[str, Any]) -> Topology:
    if not kw:
        return t
    from dataclasses import replace
    return replace(t, **kw)
