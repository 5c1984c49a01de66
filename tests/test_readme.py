"""The README's usage example runs as written."""

import pathlib
import re


def test_readme_python_blocks_run():
    """Every ```python block in README.md executes without error."""
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
