import numpy as np
import pytest

from parsl_bft.errors import InputError
from parsl_bft.jobs import JobSpec, load_jobset, read_jobs_csv, read_jobset_yaml, write_jobs_csv
from parsl_bft.scaling import ScalingCurve, read_scaling_csv, write_scaling_csv

HEADER = "name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n"


def test_reads_the_real_imagenet_mix(shared_data):
    js = load_jobset(shared_data / "jobs" / "imagenet_mix.jobs.csv")
    assert len(js.jobs) == 1001
    assert sorted(js.curves) == ["AlexNet", "DenseNet", "mnasnet1", "mobilenet", "resnet18", "shufflenet", "vgg16"]
    j = js.jobs[0]
    assert (j.name, j.model, j.min_nodes, j.max_nodes, j.samples) == ("J00000-AlexNet", "AlexNet", 1, 64, 1.3e8)
    # data README: scaling efficiency at 64 nodes from 0.44 (AlexNet) to 0.92 (VGG16)
    assert js.curves["AlexNet"].speedup(64) / 64 == pytest.approx(0.44, abs=0.01)
    assert js.curves["vgg16"].speedup(64) / 64 == pytest.approx(0.92, abs=0.01)


def test_jobs_roundtrip(tmp_path, shared_data):
    jobs = read_jobs_csv(shared_data / "jobs" / "hpo_shufflenet.jobs.csv")[:20]
    write_jobs_csv(tmp_path / "x.jobs.csv", jobs)
    assert read_jobs_csv(tmp_path / "x.jobs.csv") == jobs


def test_scaling_roundtrip(tmp_path, shared_data):
    curves = read_scaling_csv(shared_data / "jobs" / "imagenet_mix.scaling.csv")
    write_scaling_csv(tmp_path / "x.scaling.csv", curves)
    again = read_scaling_csv(tmp_path / "x.scaling.csv")
    for m in curves:
        assert again[m].points == pytest.approx(curves[m].points, rel=1e-5)


def test_a_curve_slower_on_more_nodes_is_named(tmp_path, shared_data, recwarn):
    p = tmp_path / "s.scaling.csv"
    p.write_text("model,nodes,samples_per_sec\nm,1,100\nm,2,180\nm,4,150\nok,1,10\nok,2,19\n")
    with pytest.warns(UserWarning, match=r"m trains slower on 4 nodes \(150 samples/s\) than on 2 \(180\)"):
        read_scaling_csv(p)
    recwarn.clear()
    read_scaling_csv(shared_data / "jobs" / "imagenet_mix.scaling.csv")    # the shipped mix: no warning
    assert not [w for w in recwarn if "slower" in str(w.message)]


@pytest.mark.parametrize("row,line,field,words", [
    ("a,m,4,2,1,1,10,0\n", 2, "max_nodes", "min_nodes 4 > max_nodes 2"),
    ("a,m,-1,2,1,1,10,0\n", 2, "min_nodes", ">= 1"),
    ("a,m,1,2,1,1,-5,0\n", 2, "samples", "> 0"),
    ("a,m,1,2,x,1,10,0\n", 2, "t_up", "not a number"),
    ("a,m,1.5,2,1,1,10,0\n", 2, "min_nodes", "integer"),
    ("a,m,1,2,1,1,10\n", 2, None, "expected 8 fields"),
    ("a,m,1,2,-3,1,10,0\n", 2, "t_up", ">= 0"),
])
def test_bad_job_rows_name_file_line_field(tmp_path, row, line, field, words):
    p = tmp_path / "bad.jobs.csv"
    p.write_text(HEADER + row)
    with pytest.raises(InputError) as e:
        read_jobs_csv(p)
    assert e.value.path == str(p) and e.value.line == line and e.value.field == field
    assert words in str(e.value)
    assert f"{p}:{line}" in str(e.value)


def test_missing_column_and_duplicates(tmp_path):
    p = tmp_path / "x.jobs.csv"
    p.write_text("name,model,min_nodes,max_nodes,t_up,samples,submit\na,m,1,2,1,10,0\n")
    with pytest.raises(InputError, match=r"missing column.*t_down"):
        read_jobs_csv(p)
    p.write_text(HEADER + "a,m,1,2,1,1,10,0\na,m,1,2,1,1,10,0\n")
    with pytest.raises(InputError, match=r"duplicate job name 'a'.*line 2") as e:
        read_jobs_csv(p)
    assert e.value.line == 3


def test_lenient_skips_bad_rows_and_says_how_many(tmp_path):
    p = tmp_path / "x.jobs.csv"
    p.write_text(HEADER + "a,m,1,2,1,1,10,0\nb,m,3,2,1,1,10,0\nc,m,1,2,1,1,10\nd,m,1,2,1,1,10,5\n")
    with pytest.warns(UserWarning, match="skipped 2 bad row"):
        jobs = read_jobs_csv(p, lenient=True)
    assert [j.name for j in jobs] == ["a", "d"]


def test_job_needs_a_curve(tmp_path):
    (tmp_path / "x.jobs.csv").write_text(HEADER + "a,unknown,1,2,1,1,10,0\n")
    (tmp_path / "x.scaling.csv").write_text("model,nodes,samples_per_sec\nm,1,10\n")
    with pytest.raises(InputError, match="no scaling curve for model 'unknown'"):
        load_jobset(tmp_path / "x.jobs.csv")


def test_yaml_jobset_equivalent(tmp_path, shared_data):
    p = tmp_path / "set.yaml"
    p.write_text(f"""
jobs:
  - {{name: a, model: resnet18, min_nodes: 1, max_nodes: 8, t_up: 18, t_down: 11, samples: 1.0e6}}
  - {{name: b, model: tiny, min_nodes: 2, max_nodes: 4, t_up: 5, t_down: 5, samples: 1000, weight: 2}}
scaling_csv: {shared_data / "jobs" / "imagenet_mix.scaling.csv"}
scaling:
  tiny: {{1: 10, 4: 30}}
""")
    js = read_jobset_yaml(p)
    assert [j.name for j in js.jobs] == ["a", "b"] and js.jobs[1].weight == 2
    assert js.curve(js.jobs[0]).rate(4) == pytest.approx(20436.0)
    p.write_text("jobs:\n  - {name: a, model: m, min_nodes: 3, max_nodes: 1, t_up: 1, t_down: 1, samples: 1}\n")
    with pytest.raises(InputError, match="max_nodes"):
        read_jobset_yaml(p)
    p.write_text("jobs:\n  - {name: a, model: m, min_nodes: 1, max_nodes: 1, t_up: 1, t_down: 1, samples: 1, "
                 "gpus: 3}\n")
    with pytest.raises(InputError, match="unknown job field") as e:
        read_jobset_yaml(p)
    assert e.value.field == "gpus"


def test_python_jobspec_validates():
    with pytest.raises(ValueError, match="min_nodes 5 > max_nodes 2"):
        JobSpec("a", "m", 5, 2, 1, 1, 10)


def test_curve_exact_at_measured_points_and_interpolated(shared_data):
    c = read_scaling_csv(shared_data / "jobs" / "imagenet_mix.scaling.csv")["resnet18"]
    for n, r in c.points.items():
        assert c.rate(n) == pytest.approx(r, rel=1e-12)
    t = c.table(64)
    assert t[0] == 0 and np.all(np.diff(t) > 0)  # monotone for this model
    assert c.points[16] < c.rate(20) < c.points[32]
    assert c.speedup(1) == 1.0


def test_sparse_table_follows_amdahl():
    s = 0.02
    true = lambda n: 100 * n / (1 + s * (n - 1))  # noqa: E731
    c = ScalingCurve("m", {1: true(1), 8: true(8), 64: true(64)})
    assert c.serial_fraction == pytest.approx(s, abs=2e-3)
    for n in (2, 4, 16, 32, 48, 100):
        assert c.rate(n) == pytest.approx(true(n), rel=0.01)
    # linear interpolation between 8 and 64 would be far off at 16 nodes
    lin = true(8) + (true(64) - true(8)) * (16 - 8) / 56
    assert abs(c.rate(16) - true(16)) < abs(lin - true(16)) / 5


def test_curve_rejects_bad_points():
    with pytest.raises(ValueError):
        ScalingCurve("m", {0: 5.0})
    with pytest.raises(ValueError):
        ScalingCurve("m", {1: -5.0})


def test_a_layer_count_beyond_any_model_is_refused_before_anything_is_allocated(tmp_path):
    from parsl_bft.errors import InputError
    from parsl_bft.scaling import read_scaling_table
    f = tmp_path / "x.scaling.csv"
    f.write_text("model,nodes,samples_per_sec,freeze,layers,frozen_compute,frozen_params\nm,1,10,0,1e12,0,0\n")
    with pytest.raises(InputError, match=r"field 'layers'.*beyond any model"):
        read_scaling_table(f)
