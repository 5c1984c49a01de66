"""`make` picks its Python: the newest installed 3.12.x (by version, not by name)."""

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chosen(pyenv_root):
    env = {**os.environ, "PYENV_ROOT": str(pyenv_root)}
    env.pop("PYTHON", None)
    out = subprocess.run(["make", "-s", "-C", REPO, "print-python"], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _versions(root, *names):
    for n in names:
        (root / "versions" / n / "bin").mkdir(parents=True)
        (root / "versions" / n / "bin" / "python3").touch()
    return root


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_prefers_the_newest_python_312(tmp_path):
    """3.12.10 beats 3.12.9 (a name sort would not) and any 3.13; without a 3.12 the
    newest later version is used."""
    root = _versions(tmp_path / "a", "3.12.9", "3.12.10", "3.13.1", "3.11.9")
    assert _chosen(root) == str(root / "versions" / "3.12.10" / "bin" / "python3")
    root = _versions(tmp_path / "b", "3.13.1", "3.13.10", "3.11.9")
    assert _chosen(root) == str(root / "versions" / "3.13.10" / "bin" / "python3")
