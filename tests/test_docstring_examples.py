"""The docstring examples of examples/ and benchmarks/ run as written.

`make test` runs those of fp4jax/ and pallas_kernels/ (``--doctest-modules``); these
two folders are scripts on sys.path rather than packages under test, so their modules
are collected here: every one whose source holds an example.
"""

import doctest
import importlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(REPO / "examples"))


def _modules_with_examples():
    """The modules whose docstrings hold an example (a ``>>>`` elsewhere, e.g. in a
    template string, does not count)."""
    finder = doctest.DocTestFinder()
    found = []
    for folder, prefix in (("examples", ""), ("benchmarks", "benchmarks.")):
        for path in sorted((REPO / folder).glob("*.py")):
            if ">>>" not in path.read_text():
                continue
            module = importlib.import_module(prefix + path.stem)
            if any(t.examples for t in finder.find(module)):
                found.append(prefix + path.stem)
    return found


MODULES = _modules_with_examples()


def test_the_scan_finds_the_modules_with_examples():
    """The collection below is not empty by accident: it holds the example models and a
    benchmark whose docstrings carry examples."""
    assert {"llama", "train_llama", "benchmarks.autotune_picks"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    """Each example of the module's docstrings gives the output it shows."""
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
