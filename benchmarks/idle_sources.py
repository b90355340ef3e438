"""Idle-source throughput: events per second for the 448k-job RICC EASY replay and the full Summit idle log.

Prints a table; the ratio column compares each source with parsing alone (same process), since absolute times
drift on a shared machine.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from parsl_bft.idle.sources import load_source

DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"


def run(path: Path, schedule: str) -> dict:
    t = time.perf_counter()
    src = load_source(path, schedule=schedule)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    n = sum(1 for _ in src.intervals.events())
    t_ev = time.perf_counter() - t
    return {"source": path.name, "schedule": schedule if ".swf" in path.name else "-", "events": n,
            "load_s": round(t_load, 2), "events_s": round(t_ev, 2),
            "events_per_s": round(n / (t_load + t_ev))}


def main() -> None:
    rows = [run(DATA / "traces" / "RICC-2010-2.swf.gz", "easy"),
            run(DATA / "eval" / "summit_2021feb_idle_intervals.csv.gz", "recorded"),
            run(DATA / "traces" / "theta_2022.swf.gz", "recorded")]
    base = rows[1]["events_per_s"]
    print(f"{'source':40} {'sched':8} {'events':>9} {'load s':>7} {'iter s':>7} {'events/s':>10} {'vs summit':>9}")
    for r in rows:
        print(f"{r['source']:40} {r['schedule']:8} {r['events']:>9} {r['load_s']:>7} {r['events_s']:>7} "
              f"{r['events_per_s']:>10} {r['events_per_s'] / base:>9.2f}")
    print(json.dumps({"results": rows}))


if __name__ == "__main__":
    main()
