"""Folders through the device tool's file limits: a tar archive split into numbered parts.

A device call returns at most 8 files of at most 16 MiB (64 MiB together) from ``$OUT``,
and the next call carries at most 64 MiB of ignored files. `pack` writes files as one tar
archive cut into parts of `PART_BYTES` (``STEM.part0``, ``STEM.part1``, ...) and refuses
an archive of more parts than allowed; `unpack_parts` joins and extracts them (tar's
``data`` filter: no absolute paths, links or files outside the destination).

Example:
  >>> import pathlib, tempfile
  >>> src, out, dest = (pathlib.Path(tempfile.mkdtemp()) for _ in range(3))
  >>> _ = (src / "a.txt").write_text("hello")
  >>> pack([(src / "a.txt", "x/a.txt")], out, "demo.tar", max_parts=1)
  1
  >>> unpack_parts(find_parts(out, "demo")["demo.tar"], dest)
  >>> (dest / "x" / "a.txt").read_text()
  'hello'
"""

from __future__ import annotations

import math
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

PART_BYTES = 15 * 2**20
"""Size of one part (the device tool returns files of up to 16 MiB)."""


def pack(members: Sequence[tuple[Path, str]], out: Path, stem: str, *,
         max_parts: int) -> int | None:
    """Writes ``members`` (file, name in the archive) as ``out/STEM.partK``.

    Returns:
      The number of parts written, or None (nothing written) when the archive would
      need more than ``max_parts``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "archive.tar"
        with tarfile.open(archive, "w") as tar:
            for path, name in members:
                tar.add(path, arcname=name, filter=_whole_second_mtime)
        size = archive.stat().st_size
        if math.ceil(size / PART_BYTES) > max_parts:
            return None
        k = 0
        with open(archive, "rb") as f:
            while chunk := f.read(PART_BYTES):
                (out / f"{stem}.part{k}").write_bytes(chunk)
                k += 1
    return k


def _whole_second_mtime(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A fractional mtime would take an extended header of its own for every file."""
    info.mtime = int(info.mtime)
    return info


def archive_bytes(sizes: Sequence[int]) -> int:
    """At least the size of a tar archive of files of these sizes: a header, padding and
    room for an extended (PAX) header each (a name over 100 characters takes one), and
    the end of the archive, rounded up to whole records."""
    return sum(1536 + -(-s // 512) * 512 for s in sizes) + 10240


def find_parts(src: Path, prefix: str) -> dict[str, list[Path]]:
    """``{stem: its parts in order}`` for the parts in ``src`` whose name starts with
    ``prefix``."""
    found: dict[str, list[tuple[int, Path]]] = {}
    if Path(src).is_dir():
        for p in Path(src).iterdir():
            stem, sep, k = p.name.rpartition(".part")
            if sep and k.isdigit() and p.name.startswith(prefix):
                found.setdefault(stem, []).append((int(k), p))
    return {stem: [p for _, p in sorted(v)] for stem, v in sorted(found.items())}


def unpack_parts(parts: Sequence[Path], dest: Path) -> None:
    """Joins the parts of one archive and extracts it into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "archive.tar")
        with open(archive, "wb") as f:
            for p in parts:
                f.write(Path(p).read_bytes())
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
