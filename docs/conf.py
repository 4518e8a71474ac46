"""Sphinx configuration: Markdown pages (MyST) and an API reference from the docstrings.

Build offline, warnings as errors (what CI runs):
    python -m sphinx -W --keep-going -b html docs docs/_build/html
Every ``docs/*.md`` page is part of the site (index.md's toctree takes them by glob).
"""

import os
import re
import sys
from pathlib import Path

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
# The reference documents the pure-Python twin: the same API and docstrings as the compiled
# core, with signatures Sphinx can read, and it needs no build.
os.environ["TOKCY_PURE_PYTHON"] = "1"

import tokcy  # noqa: E402

project = "tokcy"
author = "The tokcy authors"
copyright = "2026, The tokcy authors"
release = version = tokcy.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "none"  # the signatures are the docstrings' own; types live in the .pyi stubs
autoclass_content = "class"

try:
    import furo  # noqa: F401

    html_theme = "furo"
except ImportError:  # the theme is optional: the default one builds the same pages
    html_theme = "alabaster"
html_title = f"tokcy {release}"


def _glob_only_when_needed(app, docname, source):
    """index.md's toctree names its pages, then "*" for every other docs/*.md page. When
    there is no other page, drop the "*": Sphinx would warn that it matched nothing (and
    its warning cannot be suppressed). A page in no toctree still fails the -W build."""
    if docname != "index":
        return
    pages = {path.stem for path in Path(app.srcdir).glob("*.md")} - {"index"}
    listed = set(re.findall(r"^([\w-]+)$", source[0], re.MULTILINE))
    if not pages - listed:
        source[0] = re.sub(r"^\*\n", "", source[0], flags=re.MULTILINE)


def setup(app):
    app.connect("source-read", _glob_only_when_needed)
