"""Site files: options parsl-bft manages are refused in scheduler_options (naming the item and the field to use),
the constraint / mem / reservation fields become directives, and an unknown field gets a "did you mean"."""
import pytest

from parsl_bft.cli import main
from parsl_bft.sites import SiteError, load_site

SLURM = "name: s\nscheduler: slurm\npartition: debug\nnode: {cores: 4}\n"
PBS = "name: p\nscheduler: pbs\nqueue: workq\nnode: {cores: 32, gpus: 4}\n"


def _load(tmp_path, text):
    f = tmp_path / "site.yaml"
    f.write_text(text)
    return load_site(f)


@pytest.mark.parametrize("base, options, words", [
    (SLURM, ["--nodes=4"], ["item [0] '--nodes=4' sets --nodes", "sizes each pilot to its hole"]),
    (SLURM, ["-N 4"], ["item [0] '-N 4' sets --nodes"]),
    (SLURM, ["--time=600"], ["sets --time: use pilot_walltime.min_minutes / max_minutes"]),
    (SLURM, ["-t 10"], ["sets --time"]),
    (SLURM, ["--time-min=5"], ["sets --time-min"]),
    (SLURM, ["--qos=regular"], ["item [0] '--qos=regular' sets --qos: use the site field 'preemptable_qos'"]),
    (SLURM, ["-q", "regular"], ["item [0] '-q' sets --qos"]),
    (SLURM, ["--partition=big"], ["use the site field 'partition'"]),
    (SLURM, ["-pbig"], ["sets --partition"]),
    (SLURM, ["--part=big"], ["sets --partition"]),             # sbatch takes an unambiguous abbreviation
    (SLURM, ["--signal=B:USR1@5"], ["use holes.notice_seconds"]),
    (SLURM, ["--job-name=x", "-J x"], ["item [0] '--job-name=x' sets --job-name", "item [1] '-J x' sets"]),
    (SLURM, ["--output=/tmp/x", "-o x"], ["item [0]", "item [1]", "--output"]),
    (SLURM, ["--exclusive"], ["sets --exclusive"]),
    (SLURM, ["--nodelist=n1", "-w n1"], ["item [0]", "item [1]", "--nodelist"]),
    (SLURM, ["--requeue"], ["sets --requeue"]),
    (SLURM, ["--no-requeue"], ["sets --no-requeue"]),
    (SLURM + "account: p1\n", ["--account=p2", "-A p2"], ["item [0]", "item [1]", "the site sets 'account'"]),
    (SLURM + "constraint: gpu\n", ["-C a100"], ["the site sets 'constraint'"]),
    (SLURM + "mem: 64G\n", ["--mem=1G"], ["the site sets 'mem'"]),
    (SLURM, ["--gpus-per-node=4 --nodes=2"], ["'--gpus-per-node=4 --nodes=2' sets --nodes"]),
    (SLURM, ["#SBATCH --constraint=gpu"], ["item [0] '#SBATCH --constraint=gpu': write the option without "
                                           "'#SBATCH'"]),
    (PBS, ["-l select=2:ncpus=64"], ["item [0] '-l select=2:ncpus=64' sets -l select=", "node.cores"]),
    (PBS, ["-l walltime=01:00:00"], ["sets -l walltime=: use pilot_walltime"]),
    (PBS, ["-l filesystems=home,walltime=1:00:00"], ["sets -l walltime="]),
    (PBS, ["-q prod"], ["sets -q: use the site field 'queue'"]),
    (PBS, ["-N name", "-o /tmp/x"], ["item [0] '-N name' sets -N", "item [1] '-o /tmp/x' sets -o"]),
    (PBS + "account: p1\n", ["-A other"], ["the site sets 'account'"]),
    (PBS, ["#PBS -l filesystems=home"], ["write the option without '#PBS'"]),
])
def test_options_parsl_bft_manages_are_refused_naming_each_item(tmp_path, base, options, words):
    import json
    with pytest.raises(SiteError) as e:
        _load(tmp_path, base + f"scheduler_options: {json.dumps(options)}\n")
    msg = str(e.value)
    assert "field 'scheduler_options'" in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("base, options", [
    (SLURM, ["--constraint=gpu", "-C a100", "--gres=gpu:4", "--mem-per-cpu=2G", "--exclude=n3", "--licenses=scratch",
             "--mail-type=END", "--comment=x", "--export=ALL", "--acctg-freq=30"]),
    (SLURM, ["--account=p1", "--mem=4G", "--reservation=r1"]),     # no site field says them: the site's own
    (PBS, ["-l filesystems=home:eagle", "-l place=scatter", "-m n", "-A p1", "-W group_list=g"]),
])
def test_ordinary_options_pass(tmp_path, base, options):
    import json
    assert _load(tmp_path, base + f"scheduler_options: {json.dumps(options)}\n").scheduler_options == options


def test_cli_validate_names_the_colliding_options(tmp_path, capsys):
    """What a facility engineer runs: one line on stderr naming every offending item, exit 1."""
    f = tmp_path / "site.yaml"
    f.write_text(SLURM + 'scheduler_options: ["--nodes=4", "--constraint=gpu", "--qos=regular"]\n')
    assert main(["sites", "validate", str(f)]) == 1
    err = capsys.readouterr().err
    assert "item [0] '--nodes=4' sets --nodes" in err and "item [2] '--qos=regular' sets --qos" in err
    assert "item [1]" not in err and "delete them" in err


def test_constraint_mem_and_reservation_become_directives(tmp_path):
    from parsl_bft.execution.site_runtime import SiteRuntime
    site = _load(tmp_path, SLURM + "constraint: gpu&hbm80g\nmem: 64gb\nreservation: maint_r1\n")
    assert site.mem == "64G"                                   # one spelling, Slurm's
    prov = SiteRuntime.of(site).pilot_provider()
    lines = prov.script("worker", "parsl.bft", 10).splitlines()
    for want in ("#SBATCH --constraint=gpu&hbm80g", "#SBATCH --mem=64G", "#SBATCH --reservation=maint_r1"):
        assert want in lines
    pbs = SiteRuntime.of(_load(tmp_path, PBS + "mem: 200G\n")).pilot_provider()
    assert "#PBS -l select=1:ncpus=32:ngpus=4:mem=200gb" in pbs.script("worker", "parsl.bft", 10).splitlines()


@pytest.mark.parametrize("extra, words", [
    ("mem: lots", "a size with its unit K, M, G or T"),
    ("mem: 64", "a size with its unit"),
    ("constraint: 'gpu; rm -rf'", "a Slurm feature expression"),
    ("reservation: 'a b'", "must be one token"),
])
def test_bad_values_of_the_new_fields_are_refused(tmp_path, extra, words):
    with pytest.raises(SiteError, match=words):
        _load(tmp_path, SLURM + extra + "\n")


@pytest.mark.parametrize("base, extra, words", [
    (PBS, "constraint: gpu", "scheduler 'pbs' does not use constraint"),
    (PBS, "reservation: R12", "on PBS a reservation is a queue"),
    ("name: l\nscheduler: local\nnode: {cores: 2}\n", "mem: 4G", "scheduler 'local' does not use mem"),
])
def test_the_new_fields_belong_to_their_schedulers(tmp_path, base, extra, words):
    with pytest.raises(SiteError, match=words):
        _load(tmp_path, base + extra + "\n")


def test_a_laptop_site_needs_no_node_shape_a_facility_site_does(tmp_path):
    """A Globus Compute (laptop) site describes no nodes: the facility's own site file does."""
    laptop = _load(tmp_path, "name: gc\nscheduler: local\nglobus_compute_endpoint: local\n")
    assert laptop.node is None
    from parsl_bft.execution.site_runtime import SiteRuntime
    assert SiteRuntime.of(laptop).ranks_per_node == 1
    for base in ("name: l\nscheduler: local\n", "name: s\nscheduler: slurm\npartition: p\n"):
        with pytest.raises(SiteError, match=r"field '\(site\)': scheduler '(local|slurm)' needs 'node' \(what one "
                                            r"node has"):
            _load(tmp_path, base)


@pytest.mark.parametrize("extra, words", [
    ("partiton: debug2", "field 'partiton': unknown field; did you mean 'partition'? allowed here: name,"),
    ("node: {cores: 4, gpu: 4}", "field 'node.gpu': unknown field; did you mean 'gpus'?"),
    ("holes: {poll_secs: 10}", "did you mean 'poll_seconds'?"),
    ("colour: blue", "field 'colour': unknown field; allowed here:"),
])
def test_an_unknown_field_gets_a_did_you_mean(tmp_path, extra, words):
    text = SLURM.replace("node: {cores: 4}\n", "") if extra.startswith("node") else SLURM
    with pytest.raises(SiteError) as e:
        _load(tmp_path, text + extra + "\n")
    assert words in str(e.value)
    if "colour" in extra:
        assert "did you mean" not in str(e.value)
