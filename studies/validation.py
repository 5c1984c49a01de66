"""Multi-seed, resumable validation study: does NVFP4 train as well as BF16? (issue 12)

    PYTHONPATH=. python studies/validation.py plan pure_llama          # sizes, epochs, status
    PYTHONPATH=. python studies/validation.py run pure_llama --budget-s 500 --handoff $OUT
    PYTHONPATH=. python studies/validation.py hand-off-cache pure_llama --out $OUT \
        --max-mib 38                        # a call's last step: its compilations, for the next
    PYTHONPATH=. python studies/validation.py unpack pure_llama --from DIR  # after a call
    PYTHONPATH=. python studies/validation.py adopt pure_llama --from-study noise_pilot
    PYTHONPATH=. python studies/validation.py repeats pure_llama --results REPLAY  # bit for bit?
    PYTHONPATH=. python studies/validation.py report                   # docs/STUDY.md + PNGs

The study's command line. Its parts are modules of their own: the studies and their
units (`study_specs`), running the units within a budget (`unit_runs`; what a result
records besides its numbers: `unit_records`), handing the work from one device call to
the next (`study_handoff`), the report (`study_report`, on the results read and paired
by `study_results`, their intervals from `study_stats`, its figures from
`study_figures`); ``run --seed-batch K`` trains a variant's seeds K at a time as one
program (`seed_batch`; which batches a call runs: `batch_plans`). docs/STUDY.md says how
to run each study in device calls.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from study_specs import CORPORA, REPO, STUDIES, VARIANTS  # first: it puts examples/ on sys.path

# isort: split
import data as data_lib
import jax
from seed_batch import run_seed_batches
from study_handoff import hand_off_cache, pack_handoff, restore_handoff, unpack
from study_results import load_results, repeats
from unit_runs import adopt_units, finished, run_study, status_lines


def _only(a: argparse.Namespace) -> dict[str, set]:
    only: dict[str, set] = {}
    if a.variants:
        only["variant"] = set(a.variants.split(","))
    if a.corpora:
        only["corpus"] = set(a.corpora.split(","))
    if a.seeds:
        only["seed"] = {int(s) for s in a.seeds.split(",")}
    if a.tokens_per_param:
        only["tokens_per_param"] = {float(t) for t in a.tokens_per_param.split(",")}
    return only


def _compile_cache(a: argparse.Namespace, results: Path) -> str:
    """`run`'s and `hand-off-cache`'s persistent compilation cache ('none': off)."""
    return a.compile_cache or str(results / "work" / "jax_cache")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    t_begin = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run", "unpack", "hand-off-cache"):
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
    r.add_argument("--tokens-per-param", default="", help="only these run lengths")
    r.add_argument("--handoff", default=None,
                   help="write results and a cut-off unit's checkpoint here ($OUT)")
    r.add_argument("--resume-from", default=None,
                   help="a folder of handed-off checkpoints (the carried studies/handoff)")
    r.add_argument("--compile-cache", default=None,
                   help="JAX persistent compilation cache (default RESULTS/work/jax_cache; "
                        "'none': off)")
    r.add_argument("--no-cache-handoff", action="store_true",
                   help="hand off results only: the compilation cache stays on this "
                        "machine for a later call on it")
    r.add_argument("--progress", action="store_true")
    r.add_argument("--seed-batch", type=int, default=0, metavar="K",
                   help="train up to K seeds of a variant as one vmapped program "
                        "(`seed_batch`; no checkpoints: a batch finishes within the call)")
    r.add_argument("--unestimated-min-s", type=float, default=None, metavar="S",
                   help="a seed batch with no timed batch to go by starts only with S "
                        "seconds or more left (default: only as the call's first batch)")
    hc = sub.choices["hand-off-cache"]
    hc.add_argument("--out", required=True,
                    help="the device tool's $OUT: the parts go into $OUT/STUDY, in the "
                         "files it has left of the 8 a call returns")
    hc.add_argument("--max-mib", type=float, required=True,
                    help="at most this many MiB of the call's cache parts, all studies' "
                         "together (the next call carries them in its 64 MiB working "
                         "tree, beside the repository)")
    hc.add_argument("--compile-cache", default=None,
                    help="default RESULTS/work/jax_cache, as `run`'s")
    u = sub.choices["unpack"]
    u.add_argument("--from", dest="src", required=True, help="the files a device call returned")
    u.add_argument("--carry", default=str(REPO / "studies" / "handoff"),
                   help="where handed-off checkpoints wait for the next call")
    ad = sub.add_parser("adopt", help="take another study's finished units that are "
                        "exactly units of this one (same run, model, steps, corpus)")
    ad.add_argument("study", choices=sorted(STUDIES))
    ad.add_argument("--from-study", required=True, choices=sorted(STUDIES))
    ad.add_argument("--results-root", default=str(REPO / "studies" / "results"))
    rp = sub.add_parser("repeats", help="whether the runs in a results folder repeat the "
                        "committed runs of the same units bit for bit (a replay)")
    rp.add_argument("study", choices=sorted(STUDIES))
    rp.add_argument("--results", required=True, help="the replay's results folder")
    rp.add_argument("--against", default=None,
                    help="the earlier runs' folder (default studies/results/STUDY)")
    rep = sub.add_parser("report", help="docs/STUDY.md and its figures from the results")
    rep.add_argument("studies", nargs="*", help="default: every study in the report")
    rep.add_argument("--results", default=None, help="with one study: its results folder")
    rep.add_argument("--results-root", default=str(REPO / "studies" / "results"))
    rep.add_argument("--replays-root", default=str(REPO / "studies" / "replays"),
                     help="units trained again in other seed batches, a folder per study")
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
        replays = {n: Path(a.replays_root) / n for n in names
                   if (Path(a.replays_root) / n).is_dir()}
        text = study_report.write_report([STUDIES[n] for n in names], dirs, Path(a.doc),
                                         Path(a.figures), command=command, replays=replays)
        print(text)
        return 0

    if a.cmd == "adopt":
        spec, source = STUDIES[a.study], STUDIES[a.from_study]
        root = Path(a.results_root)
        for line in adopt_units(spec, root / spec.name, source, root / source.name):
            print(line)
        return 0

    spec = STUDIES[a.study]
    committed = REPO / "studies" / "results" / spec.name
    results = Path(a.results) if a.results else committed
    if a.cmd == "repeats":
        against = Path(a.against) if a.against else committed
        print("\n".join(repeats(load_results(spec, results), load_results(spec, against))))
        return 0
    if a.cmd == "unpack":
        for line in unpack(spec, results, Path(a.src), Path(a.carry)):
            print(line)
        return 0
    if a.cmd == "hand-off-cache":
        for line in hand_off_cache(spec, Path(_compile_cache(a, results)), Path(a.out),
                                   max_bytes=int(a.max_mib * 2**20)):
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
    cache = _compile_cache(a, results)
    if cache != "none":
        jax.config.update("jax_compilation_cache_dir", cache)
    t_backend = time.perf_counter()
    device = jax.devices()[0]  # starts the backend: CUDA, and loading the autotuning picks
    print(f"  device {device.device_kind} ({jax.default_backend()}, started in "
          f"{time.perf_counter() - t_backend:.0f}s, {t_backend - t_begin:.0f}s into the run), "
          f"jax {jax.__version__}, compilation cache {cache}",
          flush=True)
    if a.resume_from:
        for line in restore_handoff(spec, results, Path(a.resume_from),
                                    None if cache == "none" else Path(cache)):
            print(line, flush=True)
    # `timeout` (the call scripts' guard) sends SIGTERM: exit through the `finally` below,
    # so what finished is handed off even when a call is cut off.
    previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if a.seed_batch:
            def hand_off_results() -> None:
                if a.handoff:  # results only: the compilation cache waits for the end
                    pack_handoff(spec, results, Path(a.handoff))

            batched = run_seed_batches(spec, results, size=a.seed_batch,
                                       budget_s=a.budget_s - a.reserve_s, only=_only(a),
                                       command=command, progress=a.progress, t_begin=t_begin,
                                       after_batch=hand_off_results,
                                       unestimated_min_s=a.unestimated_min_s)
            print(f"[{spec.name}] this call: {len(batched)} units finished in seed batches; "
                  f"{time.perf_counter() - t_begin:.0f}s", flush=True)
        else:
            outcomes = run_study(spec, results, budget_s=a.budget_s, reserve_s=a.reserve_s,
                                 only=_only(a), command=command, progress=a.progress,
                                 t_begin=t_begin)
            done = sum(o.finished for o in outcomes)
            print(f"[{spec.name}] this call: {done} units finished, {len(outcomes) - done} "
                  f"cut off; {time.perf_counter() - t_begin:.0f}s", flush=True)
    finally:
        if a.handoff:
            cache_stays = cache == "none" or a.no_cache_handoff
            for line in pack_handoff(spec, results, Path(a.handoff),
                                     None if cache_stays else Path(cache)):
                print(line, flush=True)
        signal.signal(signal.SIGTERM, previous_sigterm)
    left = [u for u in spec.units() if not finished(results, u)]
    print(f"[{spec.name}] {len(spec.units()) - len(left)} of {len(spec.units())} units done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
