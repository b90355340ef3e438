"""Reference pages generated from the code, so they cannot drift from it:

- ``{bft-cli}``: every ``parsl-bft`` command, from the argparse parser (parsl_bft.cli.build_parser);
- ``{bft-site-schema}``: every site-file field, from the pydantic models (parsl_bft.site_schema.reference);
- ``{bft-job-columns}``: the columns of a job set, from parsl_bft.jobs.COLUMN_DOCS.

Each directive renders Markdown and hands it to the page's own (MyST) parser."""
from __future__ import annotations

import argparse

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from parsl_bft.site_schema import markdown_cell


class _Markdown(SphinxDirective):
    """A directive whose body is Markdown made by ``markdown()``."""

    def markdown(self) -> str:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(self.markdown().splitlines(), self.content_offset, container)
        return container.children


def _option(action: argparse.Action) -> tuple[str, str, str]:
    """(how it is written, default, help) of one argument."""
    if action.option_strings:
        names = ", ".join(action.option_strings)
        takes = action.nargs != 0
        form = f"{names} {action.metavar or action.dest.upper()}" if takes else names
    else:
        form = action.metavar or action.dest
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        form += " {" + ",".join(map(str, action.choices)) + "}"
    default = "" if action.default in (None, False, argparse.SUPPRESS) or action.required else f"`{action.default}`"
    return f"`{form}`", default, markdown_cell(action.help)


def cli_markdown(parser: argparse.ArgumentParser, level: int = 2, prefix: str = "parsl-bft") -> str:
    """One section per subcommand (nested ones too: ``sites validate``): its one-line purpose, usage line and a
    table of its arguments."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = []
    for name, p in sorted(sub.choices.items()):
        out += [f"{'#' * level} `{prefix} {name}`", "", helps.get(name) or "", ""]
        nested = any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
        if nested:
            out.append(cli_markdown(p, level + 1, f"{prefix} {name}"))
            continue
        rows = [_option(a) for a in p._actions
                if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        out += ["```text", " ".join(p.format_usage().split()), "```", ""]
        if rows:
            out += ["| argument | default | what it does |", "|---|---|---|",
                    *(f"| {a} | {d} | {h} |" for a, d, h in rows), ""]
    return "\n".join(out)


class CliReference(_Markdown):
    def markdown(self) -> str:
        from parsl_bft.cli import build_parser
        return cli_markdown(build_parser())


class SiteSchema(_Markdown):
    def markdown(self) -> str:
        from parsl_bft.site_schema import fields_markdown
        return fields_markdown()


class JobColumns(_Markdown):
    def markdown(self) -> str:
        from parsl_bft.jobs import COLUMN_DOCS, JOB_COLUMNS
        rows = [f"| `{c}` | {'required' if c in JOB_COLUMNS else 'optional'} | {markdown_cell(d)} |"
                for c, d in COLUMN_DOCS.items()]
        return "\n".join(["| column | | what it holds |", "|---|---|---|", *rows])


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("bft-cli", CliReference)
    app.add_directive("bft-site-schema", SiteSchema)
    app.add_directive("bft-job-columns", JobColumns)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
