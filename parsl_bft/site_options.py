"""What a site file's ``scheduler_options`` may not say: the batch directives parsl-bft writes itself.

sbatch and qsub take the *last* of a repeated option, and the site's options are written after the generated
ones: ``--nodes=4``, ``--time=600`` or ``--qos=regular`` there would silently make pilots no longer hole-sized,
no longer preemptable or no longer told of their end. So each such item is refused at validation, naming the
item and the site field (or the reason) to use instead. An item written with its ``#SBATCH`` / ``#PBS`` prefix is
refused too: it would become ``#SBATCH #SBATCH ...``, which sbatch drops without a word.

Part of the site schema: it imports nothing of the runtime.
"""
from __future__ import annotations

import shlex
from collections.abc import Collection, Iterator

_SIZED = "parsl-bft sizes each pilot to its hole (holes.max_pilots caps the nodes held)"
_WALLTIME = "use pilot_walltime.min_minutes / max_minutes (a pilot asks for its hole's length within them)"
_NAMED = "parsl-bft names each pilot after its Parsl block (the pool tells its pilots apart by it)"
_OUTPUT = "parsl-bft writes pilot output beside the pilot scripts, in the run's state directory"

# long option -> what to do instead; (the short option, the site field that makes it managed: None = always)
SLURM_MANAGED: dict[str, tuple[str | None, str | None, str]] = {
    "nodes": ("N", None, _SIZED),
    "time": ("t", None, _WALLTIME),
    "time-min": (None, None, _WALLTIME),
    "partition": ("p", None, "use the site field 'partition'"),
    "qos": ("q", None, "use the site field 'preemptable_qos'"),
    "signal": (None, None, "use holes.notice_seconds (the pilot's --signal=B:USR1@notice is how it is told)"),
    "job-name": ("J", None, _NAMED),
    "output": ("o", None, _OUTPUT),
    "exclusive": (None, None, "pilots take whole nodes already (--exclusive)"),
    "nodelist": ("w", None, "parsl-bft aims each pilot at its hole's nodes"),
    "requeue": (None, None, "pilots are never requeued (--no-requeue): a requeued pilot would restart for nobody"),
    "no-requeue": (None, None, "pilots are never requeued: parsl-bft writes --no-requeue"),
    "account": ("A", "account", "the site sets 'account' already: keep one of them (the site field)"),
    "constraint": ("C", "constraint", "the site sets 'constraint' already: keep one of them (the site field)"),
    "mem": (None, "mem", "the site sets 'mem' already: keep one of them (the site field)"),
    "reservation": (None, "reservation", "the site sets 'reservation' already: keep one of them (the site field)"),
}
# sbatch takes an unambiguous abbreviation of a long option (getopt_long): '--part=x' is --partition. Options
# not managed that share a managed one's first letters, so their abbreviations are not taken for it
_SLURM_OTHERS = ("acctg-freq", "exclude", "export", "export-file", "nodefile", "no-kill", "parsable", "open-mode",
                 "mem-per-cpu", "mem-per-gpu", "mem-bind", "threads-per-core", "thread-spec", "contiguous",
                 "container", "quiet")

# PBS: option letter -> what to do instead (-l resources are checked one by one, below)
PBS_MANAGED: dict[str, tuple[str | None, str]] = {
    "q": (None, "use the site field 'queue'"),
    "N": (None, _NAMED),
    "o": (None, _OUTPUT),
    "e": (None, _OUTPUT),
    "j": (None, "parsl-bft joins a pilot's output and error (-j oe)"),
    "A": ("account", "the site sets 'account' already: keep one of them (the site field)"),
    "r": (None, "pilots are never rerun"),
}
PBS_RESOURCES: dict[str, tuple[str | None, str]] = {
    "select": (None, "parsl-bft writes each pilot's chunk from node.cores and node.gpus (and mem), sized to its "
               "hole"),
    "nodes": (None, _SIZED),
    "walltime": (None, _WALLTIME),
    "mem": ("mem", "the site sets 'mem' already: keep one of them (the site field)"),
}


def _long_name(word: str, managed: Collection[str]) -> str | None:
    """The managed long option ``word`` names, exactly or as an abbreviation sbatch would take for it."""
    if word in managed:
        return word
    hits = [m for m in managed if m.startswith(word)]
    others = [o for o in _SLURM_OTHERS if o.startswith(word)]
    return hits[0] if len(word) >= 3 and len(hits) == 1 and not others else None


def _slurm(tokens: list[str], site_fields: Collection[str]) -> Iterator[str]:
    live = {k: v for k, v in SLURM_MANAGED.items() if v[1] is None or v[1] in site_fields}
    shorts = {v[0]: k for k, v in live.items() if v[0]}
    for t in tokens:
        if t.startswith("--"):
            name = _long_name(t[2:].split("=", 1)[0], live)
        elif t.startswith("-") and len(t) > 1:
            name = shorts.get(t[1])
        else:
            continue
        if name is not None:
            yield f"--{name}: {live[name][2]}"


def _pbs(tokens: list[str], site_fields: Collection[str]) -> Iterator[str]:
    for i, t in enumerate(tokens):
        if not t.startswith("-") or len(t) < 2:
            continue
        letter = t[1]
        if letter == "l":                  # -l a=1,b=2 or -la=1
            value = t[2:] or (tokens[i + 1] if i + 1 < len(tokens) else "")
            for res in value.split(","):
                name = res.split("=", 1)[0].strip()
                field, why = PBS_RESOURCES.get(name, ("-", ""))
                if why and (field is None or field in site_fields):
                    yield f"-l {name}=: {why}"
        elif letter in PBS_MANAGED:
            field, why = PBS_MANAGED[letter]
            if field is None or field in site_fields:
                yield f"-{letter}: {why}"


def managed_options(scheduler: str, options: list[str], site_fields: Collection[str]) -> list[str]:
    """One line per ``scheduler_options`` item that sets what parsl-bft manages, naming the item and what to use
    instead; ``site_fields``: the site's fields that are set (an option is managed when its field is)."""
    prefix = {"slurm": "#SBATCH", "pbs": "#PBS"}.get(scheduler)
    if prefix is None:
        return []
    check = _slurm if scheduler == "slurm" else _pbs
    out = []
    for i, item in enumerate(options):
        if item.lstrip().startswith("#"):
            out.append(f"item [{i}] {item!r}: write the option without '{item.split()[0]}' (parsl-bft writes "
                       f"'{prefix} ' before each item; sbatch and qsub drop a doubled prefix without a word)")
            continue
        try:
            tokens = shlex.split(item)
        except ValueError:
            tokens = item.split()
        out += [f"item [{i}] {item!r} sets {why}" for why in check(tokens, site_fields)]
    return out
