"""Multi-seed, resumable validation study: does NVFP4 train as well as BF16? (issue 12)

    PYTHONPATH=. python studies/validation.py plan pure_llama          # sizes, epochs, status
    PYTHONPATH=. python studies/validation.py run pure_llama --budget-s 500 --handoff $OUT
    PYTHONPATH=. python studies/validation.py unpack pure_llama --from DIR  # after a call
    PYTHONPATH=. python studies/validation.py report                   # docs/STUDY.md + PNGs

The studies and their units are specified in `study_specs`, run in `unit_runs`.

Device calls start on a fresh machine unless the previous call ended moments before, so
``run --handoff DIR`` also writes into ``DIR`` (the device tool's ``$OUT``) the results,
the checkpoint of a unit cut off by the budget if small enough, and the newest
compilation-cache entries that fit; ``unpack`` puts them back here (results into the
study's folder, the rest into ``studies/handoff/``, which the next call carries and
``run --resume-from`` reads).
docs/STUDY.md says how to run each study in device calls.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from pathlib import Path

from study_specs import CORPORA, REPO, STUDIES, VARIANTS, StudySpec, Unit

# isort: split
import data as data_lib
import handoff
import jax
from unit_runs import finished, run_study, status_lines, work_dir

from fp4jax.checkpoint import Checkpointer

# ---------------------------------------------------------------------------------------
# Handing work to the next device call

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
    as many of the newest compilation-cache entries as fit (``cache-STUDY.tar.partK``).
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
    if cache_dir is not None and Path(cache_dir).is_dir() and files_left > 0:
        entries = sorted((p for p in Path(cache_dir).rglob("*") if p.is_file()),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        chosen: list[Path] = []
        for p in entries:  # newest first: this call's compilations
            size = handoff.archive_bytes([q.stat().st_size for q in chosen + [p]])
            if size <= bytes_left and -(-size // handoff.PART_BYTES) <= files_left:
                chosen.append(p)
        if chosen:
            k = handoff.pack([(p, p.relative_to(cache_dir).as_posix()) for p in chosen], out,
                             f"cache-{spec.name}.tar", max_parts=files_left)
            notes.append(f"handoff: {len(chosen)} of {len(entries)} compilation-cache files "
                         f"({k} parts)")
    return notes


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
            handoff.unpack_parts(parts, cache_dir)
            notes.append(f"compilation cache: {len(parts)} handed-off parts into {cache_dir}")
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


# ---------------------------------------------------------------------------------------
# The study loop


# ---------------------------------------------------------------------------------------
# CLI


def _only(a: argparse.Namespace) -> dict[str, set]:
    only: dict[str, set] = {}
    if a.variants:
        only["variant"] = set(a.variants.split(","))
    if a.corpora:
        only["corpus"] = set(a.corpora.split(","))
    if a.seeds:
        only["seed"] = {int(s) for s in a.seeds.split(",")}
    return only


def main(argv: list[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    t_begin = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run", "unpack"):
        s = sub.add_parser(name)
        s.add_argument("study", choices=sorted(STUDIES))
        s.add_argument("--results", default=None,
                       help="the study's results folder (default studies/results/STUDY)")
    sub.choices["plan"].add_argument("--no-corpus", action="store_true",
                                     help="do not load the corpora (no epochs)")
    r = sub.choices["run"]
    r.add_argument("--budget-s", type=float, required=True,
                   help="wall-clock seconds for this call (keep ~60 s under the call's limit)")
    r.add_argument("--reserve-s", type=float, default=30.0,
                   help="kept from the budget for a cut-off unit's last evaluation and save")
    r.add_argument("--variants", default="", help="only these variants (comma-separated)")
    r.add_argument("--corpora", default="", help="only these corpora")
    r.add_argument("--seeds", default="", help="only these seeds")
    r.add_argument("--handoff", default=None,
                   help="write results and a cut-off unit's checkpoint here ($OUT)")
    r.add_argument("--resume-from", default=None,
                   help="a folder of handed-off checkpoints (the carried studies/handoff)")
    r.add_argument("--compile-cache", default=None,
                   help="JAX persistent compilation cache (default RESULTS/work/jax_cache; "
                        "'none': off)")
    r.add_argument("--progress", action="store_true")
    u = sub.choices["unpack"]
    u.add_argument("--from", dest="src", required=True, help="the files a device call returned")
    u.add_argument("--carry", default=str(REPO / "studies" / "handoff"),
                   help="where handed-off checkpoints wait for the next call")
    rep = sub.add_parser("report", help="docs/STUDY.md and its figures from the results")
    rep.add_argument("studies", nargs="*", help="default: every study in the report")
    rep.add_argument("--results", default=None, help="with one study: its results folder")
    rep.add_argument("--results-root", default=str(REPO / "studies" / "results"))
    rep.add_argument("--doc", default=str(REPO / "docs" / "STUDY.md"))
    rep.add_argument("--figures", default=str(REPO / "docs" / "study"))
    a = p.parse_args(argv)
    command = "python studies/validation.py " + " ".join(argv)

    if a.cmd == "report":
        import study_report  # noqa: PLC0415 - matplotlib only for the report

        names = a.studies or [n for n, s in STUDIES.items() if s.in_report]
        bad = [n for n in names if n not in STUDIES]
        if bad:
            p.error(f"unknown studies {bad}; choose from {sorted(STUDIES)}")
        if a.results and len(names) != 1:
            p.error("--results needs exactly one study")
        dirs = {n: Path(a.results) if a.results else Path(a.results_root) / n for n in names}
        text = study_report.write_report([STUDIES[n] for n in names], dirs, Path(a.doc),
                                   Path(a.figures), command=command)
        print(text)
        return 0

    spec = STUDIES[a.study]
    results = Path(a.results) if a.results else REPO / "studies" / "results" / spec.name
    if a.cmd == "unpack":
        for line in unpack(spec, results, Path(a.src), Path(a.carry)):
            print(line)
        return 0
    print(f"[{spec.name}] {spec.title}\n  {spec.describe()}", flush=True)
    if a.cmd == "plan":
        if not a.no_corpus:
            for c in spec.corpora:
                corpus = data_lib.load_corpus(**CORPORA[c])
                print(f"  [{c}] {corpus.describe()}")
                for t in spec.tokens_per_param:
                    b = data_lib.Batches(corpus.train, batch=spec.batch, seq=spec.seq, seed=0)
                    ep = b.epochs(spec.steps(t))
                    flag = "" if ep < spec.max_epochs else f"  TOO LONG (max {spec.max_epochs})"
                    print(f"    {t:g} tokens/param: {ep:.3f} epochs{flag}")
        print(f"  {len(spec.units())} units; keep-last of the paper recipe: "
              f"{VARIANTS['paper'].keep_last(spec.num_blocks)} of {spec.num_blocks} blocks")
        print("\n".join(status_lines(spec, results)))
        return 0

    # run
    cache = a.compile_cache or str(results / "work" / "jax_cache")
    if cache != "none":
        jax.config.update("jax_compilation_cache_dir", cache)
    print(f"  device {jax.devices()[0].device_kind} ({jax.default_backend()}), jax "
          f"{jax.__version__}, compilation cache {cache}", flush=True)
    if a.resume_from:
        for line in restore_handoff(spec, results, Path(a.resume_from),
                                    None if cache == "none" else Path(cache)):
            print(line, flush=True)
    try:
        outcomes = run_study(spec, results, budget_s=a.budget_s, reserve_s=a.reserve_s,
                             only=_only(a), command=command, progress=a.progress,
                             t_begin=t_begin)
        done = sum(o.finished for o in outcomes)
        print(f"[{spec.name}] this call: {done} units finished, "
              f"{len(outcomes) - done} cut off; {time.perf_counter() - t_begin:.0f}s", flush=True)
    finally:
        if a.handoff:
            for line in pack_handoff(spec, results, Path(a.handoff),
                                     None if cache == "none" else Path(cache)):
                print(line, flush=True)
    left = [u for u in spec.units() if not finished(results, u)]
    print(f"[{spec.name}] {len(spec.units()) - len(left)} of {len(spec.units())} units done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
