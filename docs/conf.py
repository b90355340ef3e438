"""Sphinx configuration of the parsl-bft documentation (MyST Markdown pages; the reference is generated from the
code by _ext/bft_reference.py and autodoc). Build: sphinx-build -W -b html docs docs/_build/html"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

project = "parsl-bft"
author = "the parsl-bft developers"
copyright = "2026, the parsl-bft developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "bft_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
html_theme = "alabaster"
html_title = "parsl-bft"
html_static_path: list[str] = []
nitpicky = False
