"""Every ```python block of README.md and docs/*.md runs as written, on both backends.

The blocks of one page run in order in one namespace (a page builds its example up), so a
page is one test. A page whose blocks need torch is skipped, with the reason, without it.
(That the pages name nothing outside the repository is checked with the package, the
tests and the asv benchmarks, in test_self_contained.py.)
"""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page):
    return BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.mark.backend_free("reads the docs as text")
def test_the_pages_with_examples_are_found():
    with_examples = {page.name for page in PAGES if python_blocks(page)}
    assert {"README.md", "index.md", "install.md", "request.md", "executor.md", "connector.md",
            "threads-and-errors.md", "embedding.md", "models.md"} <= with_examples


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_python_blocks_run_as_written(backend, page, capsys):
    blocks = python_blocks(page)
    for module, extra in (("torch", "torch"), ("transformers", "models")):
        if any(re.search(rf"^\s*(import|from) {module}\b", block, re.MULTILINE) for block in blocks):
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"{page.name} has a {module} example and {module} is not installed "
                            f"(pip install 'tokcy[{extra}]')")
    namespace = {"__name__": f"docs_{page.stem}"}
    for number, block in enumerate(blocks, 1):
        code = compile(block, f"{page.name}, python block {number}", "exec")
        exec(code, namespace)  # noqa: S102  (the documentation's own examples)


@pytest.mark.backend_free("reads the docs as text")
def test_every_page_is_in_the_site():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    toctree = index[index.index("```{toctree}"):]
    assert ":glob:" in toctree and "\n*\n" in toctree  # pages added later are included too
