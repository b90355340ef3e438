import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsl_bft.errors import InputError
from parsl_bft.idle.easy import easy_schedule
from parsl_bft.idle.intervals import IdleIntervals, read_idle_intervals
from parsl_bft.idle.sources import load_source, mask_outages, parse_window
from parsl_bft.idle.stats import idle_stats
from parsl_bft.idle.swf import SwfTrace, assign_nodes, read_swf, recorded_schedule

from paths import FIXTURES

SWF_HEAD = "; MaxNodes: 8\n; MaxProcs: 8\n"


def swf_line(i, submit, wait, run, procs, req=-1, f6=-1):
    return f"{i} {submit} {wait} {run} {procs} {f6} -1 {procs} {req} -1 1 1 1 1 1 -1 -1 -1\n"


# --- idle intervals and the event stream ---------------------------------------------------------
def test_events_from_intervals():
    iv = IdleIntervals.build(["a", "b"], [0, 1, 0], [0, 5, 10], [10, 20, 15], t0=0, t1=30)
    # a: 0..10 and 10..15 touch -> one interval 0..15
    assert len(iv.start) == 2
    ev = list(iv.events())
    assert [(e.time, e.joined, e.left) for e in ev] == [(0, ("a",), ()), (5, ("b",), ()), (15, (), ("a",)),
                                                       (20, (), ("b",))]
    assert ev[0].joined_until == (15.0,)


def test_interval_at_end_of_span_is_not_a_reclaim():
    iv = IdleIntervals.build(["a"], [0], [5], [30], t0=0, t1=30)
    assert [(e.time, e.left) for e in iv.events()] == [(5, ())]


def test_window_and_node_slice():
    iv = IdleIntervals.build(["x", "y", "z"], [0, 1, 2], [0, 0, 0], [100, 100, 100], t0=0, t1=100)
    w = iv.window(20, 50)
    assert (w.t0, w.t1) == (20, 50) and w.idle_node_seconds() == 90
    s = iv.first_nodes(2)
    assert s.names == ["x", "y"] and s.idle_node_seconds() == 200


def test_reads_idle_interval_csv_in_order_of_first_appearance():
    iv = read_idle_intervals(FIXTURES / "summit_idle_head.csv")
    assert iv.names[0] == "c05n06"
    assert iv.n_nodes == len(set(iv.names))
    assert np.all(iv.end > iv.start)


def test_reads_real_summit_slice(shared_data):
    iv = read_idle_intervals(shared_data / "eval" / "summit_256n_24h_idle_intervals.csv.gz")
    assert iv.n_nodes == 250 and 86000 < iv.span <= 86400 + 1


def test_idle_csv_bad_rows(tmp_path):
    p = tmp_path / "idle.csv"
    p.write_text("node,idle_start,idle_end\na,10,20\nb,30,25\n")
    with pytest.raises(InputError) as e:
        read_idle_intervals(p)
    assert (e.value.line, e.value.field) == (3, "idle_end")
    p.write_text("node,idle_start,idle_end\na,10,20\nb,x,25\nc,1,2\n")
    with pytest.raises(InputError, match="idle_start"):
        read_idle_intervals(p)
    with pytest.warns(UserWarning, match="skipped 1 bad row"):
        iv = read_idle_intervals(p, lenient=True)
    assert iv.names == ["a", "c"]
    p.write_text("node,start,end\na,1,2\n")
    with pytest.raises(InputError, match="missing column"):
        read_idle_intervals(p)


# --- SWF ----------------------------------------------------------------------------------------
def test_swf_recorded_schedule_and_node_ids(tmp_path):
    p = tmp_path / "t.swf"
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, 4) + swf_line(2, 10, 0, 50, 4) + swf_line(3, 20, 80, 100, 8))
    src = load_source(p)
    iv = src.intervals
    assert iv.n_nodes == 8 and (iv.t0, iv.t1) == (0, 20)   # span: first start .. last submit
    # nodes 0-3 busy from 0, nodes 4-7 idle until 10
    assert iv.idle_node_seconds() == 4 * 10
    assert src.schedule.start.tolist() == [0, 10, 100]


def test_swf_bad_input(tmp_path):
    p = tmp_path / "t.swf"
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, 4) + "2 10 0 50 four -1 -1 4 -1 -1 1 1 1 1 1 -1 -1 -1\n")
    with pytest.raises(InputError) as e:
        read_swf(p)
    assert e.value.line == 4 and "allocated processors" in e.value.field
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, -7))
    with pytest.raises(InputError, match="negative value -7"):
        read_swf(p)
    p.write_text(SWF_HEAD + "1 2 3\n")
    with pytest.raises(InputError, match="18 fields"):
        read_swf(p)
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, 16))
    with pytest.raises(InputError, match="needs 16 nodes, machine has 8"):
        read_swf(p)
    p.write_text(SWF_HEAD + "1 0 0 100 4.5 -1 -1 4 -1 -1 1 1 1 1 1 -1 -1 -1\n")   # was truncated to 4
    with pytest.raises(InputError, match=r"must be a whole number: '4\.5'") as e:
        read_swf(p)
    assert "allocated processors" in e.value.field


def test_cancelled_jobs_are_counted_not_silently_dropped(tmp_path):
    p = tmp_path / "t.swf"
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, 4) + swf_line(2, 5, -1, -1, 4))
    tr = read_swf(p)
    assert len(tr) == 1 and tr.skipped == {"no run time (cancelled)": 1}


def test_nonstandard_swf_walltime_in_field6_unsorted():
    tr = read_swf(FIXTURES / "theta_2023H1_head.swf")
    assert tr.variant == "walltime6"
    assert np.all(np.diff(tr.submit) >= 0)              # sorted on read
    assert np.all(tr.estimate >= tr.run)
    assert tr.estimate[tr.run == 3632].max() >= 3600     # the requested 3600 s from field 6 is used
    s = easy_schedule(tr)
    assert np.all(s.start >= s.submit)


def test_core_units_pack_onto_nodes():
    tr = read_swf(FIXTURES / "ricc_head.swf")
    assert tr.units == "cores" and tr.cores_per_node == 8 and tr.capacity == 8192
    s = easy_schedule(tr)
    iv = assign_nodes(s)
    assert iv.n_nodes == 1024
    # a node is idle only when all 8 cores are free: idle node-seconds <= idle core-seconds / 8
    busy_core_s = float(np.sum((np.clip(s.end, iv.t0, iv.t1) - np.clip(s.start, iv.t0, iv.t1)) * s.size))
    idle_core_s = 8192 * iv.span - busy_core_s
    assert iv.idle_node_seconds() <= idle_core_s / 8 + 1e-6


def test_inconsistent_recorded_log_is_refused():
    tr = read_swf(FIXTURES / "ricc_head.swf")
    tr.size[:] = 8192          # everything at once cannot fit
    with pytest.raises(InputError, match="use --schedule easy"):
        assign_nodes(recorded_schedule(tr))


def test_easy_backfills_a_short_job_ahead_of_a_blocked_one(tmp_path):
    p = tmp_path / "t.swf"
    # 6 nodes busy until 100; an 8-node job waits; a 2-node 50 s job backfills; a 2-node 500 s job may not
    p.write_text(SWF_HEAD + swf_line(1, 0, 0, 100, 6, req=100) + swf_line(2, 1, 0, 10, 8, req=10)
                 + swf_line(3, 2, 0, 50, 2, req=50) + swf_line(4, 3, 0, 500, 2, req=500))
    s = easy_schedule(read_swf(p))
    assert s.start.tolist() == [0, 100, 2, 110]
    assert s.reservation[1] == 100


@st.composite
def traces(draw):
    cap = draw(st.integers(2, 16))
    n = draw(st.integers(1, 40))
    submit = np.cumsum(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)))
    run = np.array(draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)), dtype=float)
    over = np.array(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)), dtype=float)
    size = np.array(draw(st.lists(st.integers(1, cap), min_size=n, max_size=n)))
    return SwfTrace("<hypothesis>", cap, np.arange(n), submit.astype(float), np.full(n, -1.0), run, size,
                    run + over)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_easy_properties(tr):
    s = easy_schedule(tr, backfill_depth=None)
    assert not np.any(np.isnan(s.start))
    assert np.all(s.start >= s.submit)                           # nobody starts before submit
    t = np.concatenate([s.end, s.start])
    d = np.concatenate([-s.size, s.size])
    order = np.lexsort((d, t))
    assert np.cumsum(d[order]).max() <= tr.capacity              # never over capacity
    has = ~np.isnan(s.reservation)
    assert np.all(s.start[has] <= s.reservation[has] + 1e-9)     # backfill never delays the head's reservation
    iv = assign_nodes(s)                                         # node ids exist for the replay
    assert iv.n_nodes == tr.capacity


# --- outages, statistics -----------------------------------------------------------------------
def test_mask_outages_cuts_long_fully_idle_periods():
    # 10 nodes; all idle 1000..6000 (an outage), node 0 also idle 0..500
    iv = IdleIntervals.build([f"n{i}" for i in range(10)], [0, *range(10)], [0] + [1000] * 10,
                             [500] + [6000] * 10, t0=0, t1=10000)
    m = mask_outages(iv, threshold=0.9, min_duration=3600)
    assert m.masked == [(1000.0, 6000.0)]
    assert m.idle_node_seconds() == 500
    st_ = idle_stats(iv, m)
    assert st_.idle_fraction == pytest.approx(500 / (10 * 5000))
    assert st_.idle_fraction_raw == pytest.approx((500 + 50000) / (10 * 10000))
    short = mask_outages(iv, min_duration=6000)
    assert short.masked == []


def test_parse_window():
    assert parse_window("+1d/+2h", 1000.0) == (1000 + 86400, 1000 + 86400 + 7200)
    assert parse_window("2022-01-01/2022-01-02", 0)[1] - parse_window("2022-01-01/2022-01-02", 0)[0] == 86400
    with pytest.raises(ValueError, match="not a duration"):
        parse_window("+1x", 0)


@pytest.mark.slow
def test_theta_2022_near_published_idle_fraction(shared_data):
    src = load_source(shared_data / "traces" / "theta_2022.swf.gz")
    m = mask_outages(src.intervals)
    st_ = idle_stats(src.intervals, m, src.schedule)
    # data README: ~10% of the machine idle while jobs wait, after masking
    assert 0.08 < st_.idle_while_waiting < 0.13
    assert st_.idle_fraction_raw > 0.2                           # unmasked, outages inflate it
    assert 100 < st_.hole_duration_s["p50"] < 600


# --- CLI ---------------------------------------------------------------------------------------
def test_cli_idle_json_and_plot(tmp_path):
    out = tmp_path / "s.json"
    png = tmp_path / "s.png"
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "idle", str(FIXTURES / "summit_idle_head.csv"),
                        "--json", str(out), "--plot", str(png), "--nodes", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["nodes"] == 3 and 0 < d["idle_fraction_raw"] <= 1
    assert png.stat().st_size > 10_000


def test_cli_error_is_clear(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("node,idle_start,idle_end\na,5,1\n")
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "idle", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{p}:2: field 'idle_end'" in r.stderr and "Traceback" not in r.stderr


def test_swf_module_still_exports_the_schedule_and_assignment_names():
    # parsing, scheduling and node assignment live in separate modules; callers import them all from swf
    from parsl_bft.idle import node_assignment, schedule, swf, swf_format
    assert swf.Schedule is schedule.Schedule and swf.recorded_schedule is schedule.recorded_schedule
    assert swf.peak_usage is schedule.peak_usage and swf.assign_nodes is node_assignment.assign_nodes
    assert swf.SwfTrace is swf_format.SwfTrace and swf.MAX_NODES == swf_format.MAX_NODES


def _jobs_swf(path, rows):
    path.write_text(SWF_HEAD + "".join(f"{i + 1} {i} 0 10 1 -1 -1 1 20 -1 1 1 1 1 1 -1 -1 -1\n" for i in range(rows)))
    return path


def test_a_big_log_is_parsed_in_bounded_memory_a_line(tmp_path):
    """A 1.1 GB log took `parsl-bft idle` to 11.5 GB (a tuple of float objects a job, ~490 bytes of memory a job
    at the parse's peak); now flat numbers (~150)."""
    import tracemalloc
    rows = 50_000
    log = _jobs_swf(tmp_path / "big.swf", rows)
    tracemalloc.start()
    try:
        trace = read_swf(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(trace.submit) == rows and trace.submit[-1] == rows - 1
    assert peak / rows < 250, f"{peak / rows:.0f} bytes a job at the peak"


def test_a_log_past_the_caps_is_one_line_not_a_memory_error(tmp_path, monkeypatch):
    """More job lines than any log holds, or one endless line (a damaged or binary file, read whole before):
    an InputError naming the file and line, before memory runs out."""
    from parsl_bft import csvio
    from parsl_bft.idle import swf
    monkeypatch.setattr(swf, "MAX_JOB_LINES", 3)
    with pytest.raises(InputError, match=r"big.swf:6: more than 3 job lines: beyond any log this replays"):
        read_swf(_jobs_swf(tmp_path / "big.swf", 4))
    monkeypatch.setattr(csvio, "MAX_LINE", 1000)
    (tmp_path / "bin.swf").write_text(SWF_HEAD + "1 " * 5000 + "\n")
    with pytest.raises(InputError, match=r"bin.swf:3: a line longer than 1,000 characters: not a line of this "
                                         r"format"):
        read_swf(tmp_path / "bin.swf")
    assert len(read_swf(_jobs_swf(tmp_path / "ok.swf", 3)).submit) == 3
