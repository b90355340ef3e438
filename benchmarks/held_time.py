"""Where the node-time pilots held went, in a facility replay (benchmarks/facility_replay.py): each held node's
span, from its pilot's start to its end, cut at its fragments' launches, first steps, last steps and collection.

  startup      the pilot runs, no fragment launched on the node yet: worker pool connecting, its rank forkserver
               warming up (torch imported), the plan settling
  launch       a fragment launched -> its first step: ranks started, restore, rendezvous
  training     first step -> last step
  stop         last step -> the fragment collected: the final save, ranks exiting, the result through Parsl
  between      one fragment collected -> the next launched on the node: re-planning, or the node unused
  tail         the last fragment on the node collected -> the pilot ended: notice/grace, the release, unused
  unused       pilots on which no fragment ever launched (whole span)
A fragment that failed has no first step: its launch -> end is counted as ``launch``.
"""
from __future__ import annotations

from pathlib import Path

from facility_stream import Replayed

from parsl_bft.execution.jobstore import JobStore

PARTS = ("startup", "launch", "training", "stop", "between", "tail", "unused")


def _fragments(state: Path, t0: float) -> dict[str, list[tuple[float, float, float, float]]]:
    """node -> its fragments as (launched, first step, last step, collected), s from t0, in launch order."""
    db = JobStore(state / "state.sqlite", readonly=True)
    nodes = {e["fragment"]: e["nodes"] for _, _, e in db.events("launch")}
    nodes.update({e["fragment"]: e["nodes"] for _, _, e in db.events("placed")})
    out: dict[str, list[tuple[float, float, float, float]]] = {}
    for _, _, e in db.events("fragment-done"):
        a, b = e["train_started"] - t0, e["train_started"] - t0 + e["train_s"]
        spans = (e["launched"] - t0, a, b, (e.get("ended") or e["train_started"] + e["train_s"]) - t0)
        for n in nodes.get(e["fragment"], []):
            out.setdefault(n, []).append(spans)
    for _, _, e in db.events("fragment-failed"):
        a, end = e["launched"] - t0, (e.get("ended") or e["launched"]) - t0
        for n in nodes.get(e["fragment"], []):
            out.setdefault(n, []).append((a, end, end, end))
    return {n: sorted(v) for n, v in out.items()}


def held_time(rep: Replayed, state: Path, window_s: float) -> dict[str, float]:
    """Node-seconds of each part (PARTS) within [0, window_s], over every pilot's nodes."""
    frags = _fragments(state, rep.t0)
    parts = dict.fromkeys(PARTS, 0.0)

    def add(part: str, a: float, b: float) -> None:
        parts[part] += max(0.0, min(b, window_s) - max(a, 0.0))

    for p in rep.pilots():
        if p.start is None:
            continue
        end = window_s if p.end is None else p.end
        for n in p.nodes:
            mine = [f for f in frags.get(n, []) if p.start <= f[0] < end]
            if not mine:
                add("unused", p.start, end)
                continue
            t = p.start
            for i, (launched, first, last, collected) in enumerate(mine):
                add("startup" if i == 0 else "between", t, launched)
                add("launch", launched, first)
                add("training", first, last)
                add("stop", last, min(collected, end))
                t = max(t, collected)
            add("tail", t, end)
    return parts
