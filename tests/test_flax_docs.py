"""docs/FLAX.md ("Flax recipes"): every python block runs as written."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).parent.parent / "docs" / "FLAX.md"
_BLOCK = re.compile(r"(?:<!-- test: (?P<marker>[^\n]*?) -->\n)?```python\n(?P<code>.*?)```",
                    re.DOTALL)


def _blocks():
    text = DOC.read_text()
    params = []
    for m in _BLOCK.finditer(text):
        line = text[: m.start("code")].count("\n") + 1
        marks = []
        marker = m.group("marker") or ""
        if marker.startswith("xfail "):  # a block that needs a change not made yet
            marks.append(pytest.mark.xfail(strict=True, raises=ValueError,
                                           reason=marker[len("xfail "):]))
        params.append(pytest.param(m.group("code"), line, id=f"FLAX.md:{line}", marks=marks))
    return params


BLOCKS = _blocks()


def test_the_page_covers_the_recipes():
    text = DOC.read_text()
    for title in ("## nnx", "## linen", "## Dropout and BatchNorm", "## Scanned",
                  "## Evaluation and inference", "## Checkpoints", "## Diagnostics"):
        assert title in text
    assert len(BLOCKS) >= 9


@pytest.mark.parametrize("code,line", BLOCKS)
def test_flax_md_block_runs(code, line):
    """The block at ``line`` executes without error (fresh namespace; line numbers in
    tracebacks point into the page)."""
    exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), {})  # noqa: S102
