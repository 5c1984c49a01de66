"""The dependency direction of docs/ARCHITECTURE.md, enforced.

Static: every import in fp4jax/ and pallas_kernels/ points down a floor (or within its
own group), there is no cycle, no private name crosses modules, no sys.modules tricks.
Dynamic: importing fp4jax, its core API or a kernel in a fresh interpreter loads no
flax, optax or orbax, and a kernel loads nothing of fp4jax beyond fp4jax.numerics.
"""

import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import fp4jax
from tests import import_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_repository_has_no_layering_violation():
    """No upward or sideways import, cycle, private import or sys.modules lookup."""
    assert import_graph.check_layering(ROOT) == []


def test_every_module_has_a_floor():
    for name in import_graph.modules(ROOT):
        import_graph.group_of(name)


def _planted_copy(tmp_path, module_file, line):
    for pkg in import_graph.PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / module_file, "a") as f:
        f.write(textwrap.dedent(line))
    return import_graph.check_layering(tmp_path)


def test_a_planted_upward_import_is_caught(tmp_path):
    """A numerics module importing the training layer is reported as upward."""
    plant = "\nfrom fp4jax import train\n"
    problems = _planted_copy(tmp_path, "fp4jax/numerics/rounding.py", plant)
    assert problems[0] == (
        "fp4jax.numerics.rounding (floor 0) imports fp4jax.train (floor 6): upward")
    # train reaches numerics through the flax layer, so the plant also closes a cycle
    assert len(problems) == 2 and problems[1].startswith("import cycle: ")


def test_a_planted_kernel_to_dispatch_import_is_caught(tmp_path):
    """A kernel reaching the implementation choice, even inside a function, is caught."""
    kernel = sorted(p.name for p in (ROOT / "pallas_kernels").glob("*.py")
                    if p.name != "__init__.py")[0]
    problems = _planted_copy(tmp_path, f"pallas_kernels/{kernel}",
                             "\ndef helper():\n    from fp4jax import implementation\n")
    assert "upward, in helper()" in problems[0]
    assert all("upward" in p or p.startswith("import cycle: ") for p in problems)


def test_a_planted_cycle_and_private_import_are_caught(tmp_path):
    for pkg in import_graph.PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "fp4jax/numerics/layout.py").write_text(
        (ROOT / "fp4jax/numerics/layout.py").read_text()
        + "\nfrom fp4jax.numerics import checks\nfrom fp4jax.numerics.rounding import _U32\n")
    problems = import_graph.check_layering(tmp_path)
    assert any(p.startswith("import cycle:") and "fp4jax.numerics.layout" in p for p in problems)
    assert "fp4jax.numerics.layout imports the private name fp4jax.numerics.rounding._U32" \
        in problems


def test_no_public_function_shares_its_name_with_a_module():
    """`fp4jax.quantize` is a function, so there is no module fp4jax/quantize.py (etc.)."""
    pkg = ROOT / "fp4jax"
    for name in fp4jax.__all__:
        if name in fp4jax._SUBMODULES:
            continue
        assert not (pkg / f"{name}.py").exists() and not (pkg / name).is_dir(), name


def _loaded_after(statement: str) -> list[str]:
    code = (f"import sys\n{statement}\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fp4jax', 'pallas_kernels', 'flax', 'optax', 'orbax'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_import_fp4jax_and_its_core_api_load_no_flax_optax_orbax():
    loaded = _loaded_after("import fp4jax\nfp4jax.quantize, fp4jax.dot_general, fp4jax.Recipe")
    assert not [m for m in loaded if m.split(".")[0] in ("flax", "optax", "orbax")], loaded
    assert "fp4jax.quantized_dot" in loaded  # the API really was loaded


def test_import_fp4jax_alone_loads_nothing_else_of_ours():
    assert _loaded_after("import fp4jax") == ["fp4jax"]


def test_kernels_load_only_numerics():
    """Importing every kernel module loads fp4jax.numerics and nothing above it."""
    kernels = sorted(p.stem for p in (ROOT / "pallas_kernels").glob("*.py")
                     if p.name != "__init__.py")
    loaded = _loaded_after("\n".join(f"import pallas_kernels.{k}" for k in kernels))
    ours = [m for m in loaded if m.startswith("fp4jax")]
    assert all(m in ("fp4jax", "fp4jax.numerics") or m.startswith("fp4jax.numerics.")
               for m in ours), ours
    assert not [m for m in loaded if m.split(".")[0] in ("flax", "optax", "orbax")], loaded


@pytest.mark.parametrize("name", ["flax", "train"])
def test_flax_and_train_are_explicit_imports(name):
    """`fp4jax.flax` / `fp4jax.train` load flax (optax) on first access, not before."""
    loaded = _loaded_after(f"import fp4jax\nfp4jax.{name}")
    assert f"fp4jax.{name}" in loaded and "flax" in loaded
