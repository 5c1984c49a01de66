"""docs/TESTING.md's example runs as written."""

import pathlib
import re


def test_testing_docs_python_blocks_run():
    """The ```python blocks of docs/TESTING.md execute in order, in one namespace (they
    continue one example), without error: every fp4jax.testing assertion in them passes."""
    text = (pathlib.Path(__file__).parent.parent / "docs" / "TESTING.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 3
    namespace = {}
    for code in blocks:
        exec(compile(code, "docs/TESTING.md", "exec"), namespace)
    assert set(namespace["stats"]) == {f"{layer}.{p}.value" for layer in ("up", "down")
                                       for p in ("kernel", "bias")}
