"""Node ids: the one place that builds and parses them.

A node id is a node's name at its site (``nid00042``) with one site, and ``site:name`` with several
(``polaris:x3004c0s7b0n0``), so ids of different sites never collide in the planner's one pool. The site part is
never empty in a multi-site id; a name may itself hold ':' (only the first one separates).
"""
from __future__ import annotations

from typing import NewType

NodeId = NewType("NodeId", str)


def node_id(site: str, name: str) -> NodeId:
    """The id of node ``name`` at ``site`` ("" for the single, unnamed site)."""
    return NodeId(f"{site}:{name}" if site else name)


def site_of(node: str) -> str:
    """The site of a node id ("" for a single-site id)."""
    return node.split(":", 1)[0] if ":" in node else ""


def local_name(node: str) -> str:
    """A node's name at its site: what its scheduler and executor call it."""
    return node.split(":", 1)[1] if site_of(node) else node
