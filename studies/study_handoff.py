"""Handing a study's work from one device call to the next (issue 12).

Device calls start on a fresh machine unless the previous call ended moments before, so
``run --handoff DIR`` also writes into ``DIR`` (the device tool's ``$OUT``) the results,
the checkpoint of a unit cut off by the budget if small enough, and the compilation-cache
entries that save the most compile time in what is left (`pack_handoff`); ``unpack``
(`unpack`) puts them back here (results into the study's folder, the rest into
``studies/handoff/``, which the next call carries and ``run --resume-from`` reads:
`restore_handoff`). The files pass the device tool's limits as tar archives in numbered
parts (`handoff`).

Example:
  >>> import tempfile
  >>> import study_specs
  >>> tmp = Path(tempfile.mkdtemp())
  >>> pack_handoff(study_specs.STUDIES["smoke"], tmp / "results", tmp / "out")
  ['handoff: 0 results in results-smoke.tar.gz']
  >>> sorted(p.name for p in (tmp / "out").iterdir())
  ['results-smoke.tar.gz']
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from study_specs import StudySpec, Unit  # first: it puts examples/ on sys.path

# isort: split
import handoff
from unit_runs import finished, work_dir

from fp4jax.checkpoint import Checkpointer

HANDOFF_FILES = 8
"""Files a device call returns at most."""

HANDOFF_BYTES = 60 * 2**20
"""Bytes to hand off at most: a call returns 64 MiB, and the next carries them in its
64 MiB working tree (with the repository)."""


def _checkpoint_members(results: Path, unit: Unit) -> tuple[int, list[tuple[Path, str]]] | None:
    """A cut-off unit's latest checkpoint and metrics as (file, name in the archive)."""
    work = work_dir(results, unit)
    ckpt = work / "ckpt"
    if finished(results, unit) or not ckpt.exists():
        return None
    with Checkpointer(ckpt) as c:
        step = c.latest_step()
    if step is None:
        return None
    files = [p for p in work.iterdir() if p.is_file()]
    files += [p for p in ckpt.iterdir() if p.is_file()]
    files += [p for p in (ckpt / str(step)).rglob("*") if p.is_file()]
    return step, [(p, p.relative_to(work.parent).as_posix()) for p in files]


def pack_handoff(spec: StudySpec, results: Path, out: Path,
                 cache_dir: Path | None = None) -> list[str]:
    """Writes into ``out`` what the next call needs, within `HANDOFF_FILES` and
    `HANDOFF_BYTES`: the finished results (``results-STUDY.tar.gz``); the checkpoint and
    metrics of each cut-off unit that fits (``partial-STUDY-UNIT-stepN.tar.partK``); then
    the compilation-cache entries that save most within the rest (`pack_cache`).
    Returns notes to print."""
    results, out = Path(results), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = sorted(results.glob("*.json"))
    with tarfile.open(out / f"results-{spec.name}.tar.gz", "w:gz") as tar:
        for p in done:
            tar.add(p, arcname=p.name)
    notes = [f"handoff: {len(done)} results in results-{spec.name}.tar.gz"]
    files_left = HANDOFF_FILES - 1
    bytes_left = HANDOFF_BYTES - (out / f"results-{spec.name}.tar.gz").stat().st_size
    for unit in spec.units():
        found = _checkpoint_members(results, unit)
        if found is None:
            continue
        step, members = found
        size = handoff.archive_bytes([p.stat().st_size for p, _ in members])
        k = None
        if size <= bytes_left:
            k = handoff.pack(members, out, f"partial-{spec.name}-{unit.name}-step{step}.tar",
                             max_parts=files_left)
        if k is None:
            notes.append(f"handoff: {unit.name} at step {step} ({size / 2**20:.0f} MiB) does not "
                         "fit: it restarts unless the next call finds this machine warm")
            continue
        files_left, bytes_left = files_left - k, bytes_left - size
        notes.append(f"handoff: {unit.name} at step {step} ({size / 2**20:.1f} MiB, {k} parts)")
    if cache_dir is not None:
        notes += pack_cache(spec, Path(cache_dir), out, max_bytes=bytes_left,
                            max_files=files_left)
    return notes


def recorded_compile_s(entry: Path) -> int | None:
    """The compile time, in whole seconds, that JAX recorded in a persistent-cache entry,
    or None where the file is not one it can read.

    JAX 0.11.2 (``jax/_src/compilation_cache.py``, ``combine_executable_and_time``)
    writes an entry as the compressed bytes of a 4-byte big-endian compile time followed
    by the serialized executable; zlib where zstandard is not installed (the device
    machine's case), so only the first bytes are inflated. A zstd entry reads as unknown.

    Example:
      >>> import tempfile, zlib
      >>> f = Path(tempfile.mkdtemp()) / "jit_step-cache"
      >>> _ = f.write_bytes(zlib.compress((23).to_bytes(4, "big") + b"executable"))
      >>> recorded_compile_s(f), recorded_compile_s(Path(__file__))
      (23, None)
    """
    try:
        with open(entry, "rb") as f:
            head = zlib.decompressobj().decompress(f.read(1 << 16), 4)
    except (OSError, zlib.error):
        return None
    return int.from_bytes(head, "big") if len(head) == 4 else None


def choose_cache_entries(sizes: dict[Path, int], seconds: dict[Path, int | None],
                         mtimes: dict[Path, float], fits: Callable[[list[int]], bool]
                         ) -> list[Path]:
    """The entries to hand off: those whose recorded compile seconds a next call saves
    most within what ``fits`` (given the chosen sizes) allows. Greedy by seconds per byte
    (an unknown time counts as 0 s; newest first among equals), set against the entry
    that saves most on its own plus that same fill: the 0/1 knapsack's classic guard
    (at least half the best subset's seconds), so that a large program that compiles
    long (the NVFP4 training step) does not lose to small ones that fill the bytes first.

    Example:
      >>> a, b, c = Path("a"), Path("b"), Path("c")
      >>> fits = lambda chosen: sum(chosen) <= 10
      >>> choose_cache_entries({a: 9, b: 2, c: 2}, {a: 20, b: 3, c: 3},
      ...                      {a: 0, b: 1, c: 2}, fits)
      [PosixPath('a')]
    """
    secs = {p: seconds[p] or 0 for p in sizes}
    order = sorted(sizes, key=lambda p: (secs[p] / max(sizes[p], 1), mtimes[p]), reverse=True)

    def fill(chosen: list[Path]) -> list[Path]:
        for p in order:
            if p not in chosen and fits([sizes[q] for q in chosen + [p]]):
                chosen = chosen + [p]
        return chosen

    def saved(chosen: list[Path]) -> int:
        return sum(secs[p] for p in chosen)

    best = fill([])
    single = [p for p in sizes if fits([sizes[p]])]
    if single:
        alone = max(single, key=lambda p: (secs[p], mtimes[p]))
        other = fill([alone])
        if saved(other) > saved(best):
            best = other
    return best


def pack_cache(spec: StudySpec, cache_dir: Path, out: Path, *, max_bytes: int,
               max_files: int) -> list[str]:
    """Writes the compilation-cache entries of ``cache_dir`` that save a next call the
    most compile time (`choose_cache_entries`) within ``max_bytes`` in at most
    ``max_files`` parts, as ``out/cache-STUDY.tar.partK`` (replacing older parts).
    Returns notes to print, naming the entries left out.

    Example:
      >>> import tempfile, study_specs
      >>> cache, out = (Path(tempfile.mkdtemp()) for _ in range(2))
      >>> _ = (cache / "old").write_bytes(b"o" * 4000)
      >>> _ = (cache / "new").write_bytes(b"n" * 100)
      >>> pack_cache(study_specs.STUDIES["smoke"], cache, out, max_bytes=20000, max_files=1)
      ['handoff: 2 of 2 compilation-cache files, 0.0 MiB (1 parts)']
      >>> for note in pack_cache(study_specs.STUDIES["smoke"], cache, out, max_bytes=0,
      ...                        max_files=1):
      ...     print(note)
      handoff: no compilation-cache file fits 0.0 MiB in 1 files
        left out: old (0.0 MiB, compiled in ? s)
        left out: new (0.0 MiB, compiled in ? s)
    """
    stem = f"cache-{spec.name}.tar"
    for parts in handoff.find_parts(out, stem).values():
        for old in parts:
            old.unlink()
    if not Path(cache_dir).is_dir() or max_files <= 0:
        return []
    stats = {p: p.stat() for p in Path(cache_dir).rglob("*") if p.is_file()}
    sizes = {p: st.st_size for p, st in stats.items()}
    seconds = {p: recorded_compile_s(p) for p in stats}

    def fits(chosen: list[int]) -> bool:
        size = handoff.archive_bytes(chosen)
        return size <= max_bytes and -(-size // handoff.PART_BYTES) <= max_files

    mtimes = {p: st.st_mtime for p, st in stats.items()}
    chosen = choose_cache_entries(sizes, seconds, mtimes, fits)
    notes = []
    if chosen:
        k = handoff.pack([(p, p.relative_to(cache_dir).as_posix()) for p in chosen], out, stem,
                         max_parts=max_files)
        notes.append(f"handoff: {len(chosen)} of {len(stats)} compilation-cache files, "
                     f"{sum(sizes[p] for p in chosen) / 2**20:.1f} MiB ({k} parts)")
    elif stats:
        notes.append(f"handoff: no compilation-cache file fits {max_bytes / 2**20:.1f} MiB in "
                     f"{max_files} files")
    left = sorted(set(stats) - set(chosen), key=lambda p: (sizes[p], mtimes[p], p.name),
                  reverse=True)  # largest first; set order varies with the hash seed
    notes += [f"  left out: {p.name[:40]} ({sizes[p] / 2**20:.1f} MiB, compiled in "
              f"{'?' if seconds[p] is None else seconds[p]} s)" for p in left[:4]]
    if len(left) > 4:
        notes.append(f"  left out: {len(left) - 4} more")
    return notes


def hand_off_cache(spec: StudySpec, cache_dir: Path, out: Path, *, max_bytes: int
                   ) -> list[str]:
    """A device call's last step for a study: `pack_cache` into ``out/STUDY`` (``out``:
    the call's ``$OUT``) within what the call has left of ``max_bytes`` (less the cache
    parts earlier studies of the call handed off) and of the `HANDOFF_FILES` the device
    tool returns (less every file already in ``out``). This study's own older parts,
    which `pack_cache` replaces, count for neither.

    Example:
      >>> import tempfile, study_specs
      >>> cache, out = (Path(tempfile.mkdtemp()) for _ in range(2))
      >>> _ = (cache / "entry").write_bytes(b"e" * 100)
      >>> for name in ["logs/1-smoke.log", "logs/2-smoke.log", "smoke/results-smoke.tar.gz"]:
      ...     (out / name).parent.mkdir(exist_ok=True)
      ...     _ = (out / name).write_bytes(b"")
      >>> hand_off_cache(study_specs.STUDIES["smoke"], cache, out, max_bytes=2**20)
      ['handoff: 1 of 1 compilation-cache files, 0.0 MiB (1 parts)']
      >>> sorted(p.name for p in (out / "smoke").iterdir())
      ['cache-smoke.tar.part0', 'results-smoke.tar.gz']
    """
    out = Path(out)
    own = {p for parts in handoff.find_parts(out / spec.name, f"cache-{spec.name}.tar").values()
           for p in parts}
    others = [p for p in out.rglob("*") if p.is_file() and p not in own]
    cache_parts = {p for d in {q.parent for q in others}
                   for parts in handoff.find_parts(d, "cache-").values() for p in parts}
    used = sum(p.stat().st_size for p in cache_parts - own)
    return pack_cache(spec, cache_dir, out / spec.name, max_bytes=max_bytes - used,
                      max_files=HANDOFF_FILES - len(others))


def _partial_key(spec: StudySpec, stem: str) -> tuple[str, int]:
    """``partial-STUDY-UNIT-stepN.tar`` -> (UNIT, N)."""
    name, _, step = stem[len(f"partial-{spec.name}-"):-len(".tar")].rpartition("-step")
    return name, int(step)


def restore_handoff(spec: StudySpec, results: Path, src: Path,
                    cache_dir: Path | None = None) -> list[str]:
    """Unpacks what `pack_handoff` wrote (and `unpack` carried) in ``src``: each
    checkpoint into the work folder, unless its unit is finished or has a checkpoint as
    far; the compilation-cache entries into ``cache_dir``. Returns notes to print."""
    notes = []
    units = {u.name: u for u in spec.units()}
    for stem, parts in handoff.find_parts(src, f"partial-{spec.name}-").items():
        name, step = _partial_key(spec, stem)
        unit = units.get(name)
        if unit is None or finished(results, unit):
            continue
        ckpt = work_dir(results, unit) / "ckpt"
        if ckpt.exists():
            with Checkpointer(ckpt) as c:
                if (c.latest_step() or -1) >= step:
                    continue
        shutil.rmtree(work_dir(results, unit), ignore_errors=True)
        handoff.unpack_parts(parts, Path(results) / "work")
        notes.append(f"resumed {name} from the handed-off checkpoint at step {step}")
    for parts in handoff.find_parts(src, f"cache-{spec.name}.").values():
        if cache_dir is not None:
            t0 = time.perf_counter()
            # Extracted beside the cache, on its filesystem, so its files move in by renaming.
            Path(cache_dir).parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=Path(cache_dir).parent) as tmp:
                try:  # all or nothing: a half-extracted entry would be a broken cache file
                    handoff.unpack_parts(parts, Path(tmp))
                except (OSError, EOFError, tarfile.TarError) as e:  # parts cut short
                    notes.append(f"compilation cache: handed-off parts unreadable ({e}); "
                                 "ignored, the programs compile")
                    continue
                for f in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
                    dest = Path(cache_dir) / f.relative_to(tmp)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(f, dest)
            notes.append(f"compilation cache: {len(parts)} handed-off parts into {cache_dir} "
                         f"in {time.perf_counter() - t0:.1f}s")
    return notes


def unpack(spec: StudySpec, results: Path, src: Path, carry: Path) -> list[str]:
    """After a device call, here: the results from ``src`` into ``results``; the handed-off
    checkpoints of unfinished units and the compilation cache into ``carry`` (replacing
    this study's older ones there), for the next call to carry."""
    results, src, carry = Path(results), Path(src), Path(carry)
    notes = []
    tar_path = src / f"results-{spec.name}.tar.gz"
    if tar_path.exists():
        results.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar_path) as tar:
            names = [m for m in tar.getmembers()
                     if m.isfile() and "/" not in m.name and m.name.endswith(".json")]
            tar.extractall(results, members=names, filter="data")
        notes.append(f"{len(names)} results in {results}")
    for prefix in (f"partial-{spec.name}-", f"cache-{spec.name}."):
        for parts in handoff.find_parts(carry, prefix).values():
            for old in parts:
                old.unlink()
    units = {u.name: u for u in spec.units()}
    for prefix in (f"partial-{spec.name}-", f"cache-{spec.name}."):
        for stem, parts in handoff.find_parts(src, prefix).items():
            if prefix.startswith("partial"):
                unit = units.get(_partial_key(spec, stem)[0])
                if unit is None or finished(results, unit):
                    continue
            carry.mkdir(parents=True, exist_ok=True)
            for p in parts:
                shutil.copyfile(p, carry / p.name)
            notes.append(f"{stem}: {len(parts)} parts in {carry} (carry it)")
    return notes

