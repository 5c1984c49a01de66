"""The device-call scripts of the validation study (`benchmarks/gpu_studies_call.sh`) pass
each study's restrictions and budget to `studies/validation.py run` as documented.

A stand-in ``python3`` on PATH records the command lines instead of training, so these
tests check the scripts' argument handling only; the runs themselves are
`tests/test_study.py`'s.
"""

import gzip
import os
import re
import shlex
import stat
import subprocess
import tarfile

import pytest

from benchmarks import autotune_picks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu_studies_call.sh")


def _stand_in(tmp_path, name, body):
    """Writes an executable bash script ``name`` with ``body`` into ``tmp_path/bin``, which
    `_script_env` puts first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / name
    fake.write_text(f"#!/usr/bin/env bash\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)


def _script_env(tmp_path, **extra):
    """The script's environment: the stand-ins first on PATH, $OUT under ``tmp_path``."""
    return dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                OUT=str(tmp_path / "out"), **extra)


def _tree(tmp_path):
    """The folder the script runs in: a stand-in repository holding the committed
    autotuning picks (a link), so what the script writes under studies/ stays in
    ``tmp_path``."""
    tree = tmp_path / "tree"
    (tree / "studies").mkdir(parents=True, exist_ok=True)
    picks = tree / "studies" / "autotune_picks.textproto"
    if not picks.exists():
        picks.symlink_to(os.path.join(REPO, "studies", "autotune_picks.textproto"))
    return tree


def _run(tmp_path, *args):
    """Runs the script with a recording ``python3``; returns (exit code, output, the
    recorded ``validation.py`` command lines as argument lists)."""
    log = tmp_path / "calls.txt"
    flags = shlex.quote(str(tmp_path / "xla_flags.txt"))
    _stand_in(tmp_path, "python3",
              f'printf "%q " "$@" >> {shlex.quote(str(log))}\n'
              f'echo >> {shlex.quote(str(log))}\n'
              f'if [ "$2" = run ]; then echo "$XLA_FLAGS" >> {flags}; fi\n'
              f'echo "ran $2 $3"')
    proc = subprocess.run(["bash", SCRIPT, *args], env=_script_env(tmp_path),
                          capture_output=True, text=True, cwd=_tree(tmp_path), timeout=60)
    calls = [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def _runs(calls):
    """The ``validation.py run`` command lines among the recorded ones."""
    return [c for c in calls if c[1] == "run"]


def _opt(call, name):
    return call[call.index(name) + 1]


def test_each_study_gets_its_restrictions_and_only_the_first_runs_unestimated(tmp_path):
    """Fields map to --variants, --corpora, --seeds, --seed-batch (default 3) and
    --tokens-per-param; each study hands off into $OUT/STUDY without cache entries (the
    default compilation cache, in the study's ignored work folder, stays for the next call
    on the machine); the first study without MIN may start an untimed batch (no
    --unestimated-min-s), a later one without MIN may not (1e9), and a given MIN is passed
    as is."""
    rc, out, calls = _run(tmp_path, "540", "hybrid:bf16::0,1,2",
                          "long_data:paper:python:0,1:4:150:10,100", "pure_llama")
    assert rc == 0, out
    calls = _runs(calls)
    assert [c[2] for c in calls] == ["hybrid", "long_data", "pure_llama"]
    first, second, third = calls
    assert _opt(first, "--variants") == "bf16" and _opt(first, "--seeds") == "0,1,2"
    assert _opt(first, "--seed-batch") == "3" and "--unestimated-min-s" not in first
    assert _opt(first, "--handoff") == str(tmp_path / "out" / "hybrid")
    assert all("--no-cache-handoff" in c and "--compile-cache" not in c for c in calls)
    assert _opt(second, "--corpora") == "python" and _opt(second, "--seed-batch") == "4"
    assert _opt(second, "--unestimated-min-s") == "150"
    assert _opt(second, "--tokens-per-param") == "10,100"
    assert _opt(third, "--unestimated-min-s") == "1e9" and _opt(third, "--variants") == ""
    budgets = [float(_opt(c, "--budget-s")) for c in calls]
    assert budgets[0] == 540 and all(0 < b <= 540 for b in budgets)


@pytest.mark.parametrize("k", ["0", "1"])
def test_a_batch_size_below_two_is_refused(tmp_path, k):
    """K < 2 would run unbatched units, whose checkpoints the one-file handoff cannot
    carry: the script exits 2 naming the study, before running anything."""
    rc, out, calls = _run(tmp_path, "540", f"hybrid:bf16::0,1:{k}")
    assert rc == 2 and "hybrid: K must be >= 2" in out and calls == []


def test_each_study_process_loads_the_committed_picks_and_dumps_its_own(tmp_path):
    """Each process loads the committed autotuning picks (a dump in XLA's format, read by
    `autotune_picks`) and gets --xla_gpu_dump_autotune_results_to the study's one dump
    file in its ignored work folder, after any XLA_FLAGS already set: the flag is part of
    the compilation cache's key, so every process of a study gets the same flags whatever
    its argument's place. The script moves each written dump to N-STUDY.textproto.gz (N:
    the argument's place; two processes of one study do not overwrite each other) and
    returns them all as one archive, $OUT/autotune.tar."""
    rc, out, calls = _run(tmp_path, "540", "pure_llama:paper", "pure_llama:bf16")
    assert rc == 0, out
    assert len(_runs(calls)) == 2
    flags = (tmp_path / "xla_flags.txt").read_text().splitlines()
    tree = _tree(tmp_path)
    assert autotune_picks.read_picks(str(tree / "studies" / "autotune_picks.textproto"))
    work = tree / "studies" / "results" / "pure_llama" / "work" / "autotune"
    before = os.environ.get("XLA_FLAGS", "")  # the suite's own CPU flags, if any
    assert flags == 2 * [f"{before + ' ' if before else ''}--xla_gpu_load_autotune_results_from="
                         f"{tree}/studies/autotune_picks.textproto "
                         f"--xla_gpu_dump_autotune_results_to={work}/picks.textproto"]
    assert not (tmp_path / "out" / "autotune.tar").exists()  # no process wrote picks
    _stand_in(tmp_path, "python3",  # one that writes the file, as XLA would
              'if [ "$2" = run ]; then f="${XLA_FLAGS##*dump_autotune_results_to=}"; '
              'a="$*"; v="${a##*--variants }"; echo "version: 3 ${v%% *}" > "$f"; fi')
    env = _script_env(tmp_path, XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true")
    subprocess.run(["bash", SCRIPT, "540", "pure_llama:paper", "pure_llama:bf16"], env=env,
                   check=True, capture_output=True, cwd=tree, timeout=60)
    assert not (work / "picks.textproto").exists()
    with tarfile.open(tmp_path / "out" / "autotune.tar") as tar:
        assert sorted(tar.getnames()) == [f"pure_llama/work/autotune/{n}-pure_llama"
                                          ".textproto.gz" for n in (1, 2)]
        for n, variant in ((1, "paper"), (2, "bf16")):
            dump = tar.extractfile(f"pure_llama/work/autotune/{n}-pure_llama.textproto.gz")
            assert gzip.decompress(dump.read()) == f"version: 3 {variant}\n".encode()


def test_a_study_process_gets_the_same_xla_flags_at_any_place_in_the_call(tmp_path):
    """The same study, first in one call and third in another (after other studies),
    gets byte-identical XLA_FLAGS: JAX hashes them into the compilation cache's key, so a
    batch finds the programs the same batch compiled at another place."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _run(tmp_path / "a", "540", "pure_llama:bf16")
    _run(tmp_path / "b", "540", "hybrid:bf16", "long_data:paper", "pure_llama:bf16")
    first = (tmp_path / "a" / "xla_flags.txt").read_text().splitlines()
    third = (tmp_path / "b" / "xla_flags.txt").read_text().splitlines()
    tree_a, tree_b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert first[0] == third[2].replace(str(tree_b), str(tree_a))  # the same tree on the device


def test_the_first_process_of_each_study_restores_the_carried_compilation_cache(tmp_path):
    """Where the call carries studies/handoff, each study's first process gets
    ``--resume-from studies/handoff`` (restoring the cache entries the previous call
    handed off) and its later processes do not (their cache is already filled); without
    the folder no process gets it."""
    _, _, calls = _run(tmp_path, "540", "pure_llama:paper", "pure_llama:bf16", "hybrid:bf16")
    assert all("--resume-from" not in c for c in calls)
    (_tree(tmp_path) / "studies" / "handoff").mkdir()
    (tmp_path / "calls.txt").unlink()
    rc, out, calls = _run(tmp_path, "540", "pure_llama:paper", "pure_llama:bf16",
                          "hybrid:bf16")
    assert rc == 0, out
    runs = _runs(calls)
    assert [c[2] for c in runs] == ["pure_llama", "pure_llama", "hybrid"]
    assert [_opt(c, "--resume-from") if "--resume-from" in c else None for c in runs] == [
        "studies/handoff", None, "studies/handoff"]


def test_the_call_ends_by_handing_off_each_studys_cache_within_the_files_left(tmp_path):
    """After the last process, each study that ran hands off its compilation cache once,
    in the order they ran, given $OUT and CACHE_MIB (`hand_off_cache` counts what $OUT
    already holds against them)."""
    rc, out, calls = _run(tmp_path, "540", "pure_llama:paper", "hybrid:bf16",
                          "pure_llama:bf16")
    assert rc == 0, out
    handoffs = [c for c in calls if c[1] == "hand-off-cache"]
    assert [c[2] for c in handoffs] == ["pure_llama", "hybrid"]
    assert calls[-2:] == handoffs  # after every run
    assert [_opt(c, "--out") for c in handoffs] == [str(tmp_path / "out")] * 2
    assert [_opt(c, "--max-mib") for c in handoffs] == [str(_cache_mib())] * 2


def _cache_mib():
    with open(SCRIPT) as f:
        return int(re.search(r"^CACHE_MIB=(\d+)", f.read(), re.M).group(1))


def test_the_carried_cache_and_the_repository_fit_the_device_tools_working_tree():
    """The next call carries up to CACHE_MIB of cache parts beside every tracked file;
    together they must stay under the device tool's 64 MiB working tree, with 2 MiB to
    spare (results and logs grow each session: lower CACHE_MIB when this fails)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.split(b"\0")
    size = sum(os.path.getsize(os.path.join(REPO, f.decode())) for f in tracked
               if f and os.path.isfile(os.path.join(REPO, f.decode())))
    assert size + _cache_mib() * 2**20 <= 62 * 2**20, (size / 2**20, _cache_mib())


def test_each_process_logs_into_out_so_a_stopped_call_keeps_its_log(tmp_path):
    """Each study process writes its output to $OUT/logs/N-STUDY.log (N: the argument's
    place), which comes back with the call's files even where the device tool stops the
    call at its limit; the call's own output ends with that log's tail."""
    rc, out, calls = _run(tmp_path, "540", "hybrid:bf16::0,1", "pure_llama:paper")
    assert rc == 0, out
    assert len(_runs(calls)) == 2
    logs = tmp_path / "out" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["1-hybrid.log", "2-pure_llama.log"]
    assert (logs / "1-hybrid.log").read_text() == "ran run hybrid\n"
    assert (logs / "2-pure_llama.log").read_text() == "ran run pure_llama\n"
    assert out.rstrip().endswith("ran run pure_llama\nran hand-off-cache hybrid\n"
                                 "ran hand-off-cache pure_llama")


def test_each_process_may_run_a_minute_past_its_budget(tmp_path):
    """`timeout` gives each process its budget plus 60 s: a batch starts where its training
    wall fits the budget less validation.py's 30 s reserve, and the process needs up to
    ~50 s beyond that wall to hand off, which a tighter limit would cut off."""
    _stand_in(tmp_path, "timeout", f'echo "$1" >> {shlex.quote(str(tmp_path / "t.txt"))}')
    subprocess.run(["bash", SCRIPT, "300", "pure_llama:paper"], env=_script_env(tmp_path),
                   check=True, capture_output=True, cwd=_tree(tmp_path), timeout=60)
    limit, cache_handoff = map(int, (tmp_path / "t.txt").read_text().split())
    assert 300 + 55 <= limit <= 300 + 60
    assert cache_handoff <= 15  # then the cache handoff: from BUDGET + 20 s at the latest


@pytest.mark.parametrize("budget", ["561", "596", "5.5", "soon"])
def test_a_budget_that_leaves_under_40_s_of_the_call_limit_is_refused(tmp_path, budget):
    """A call's last process may hand off up to ~25 s past the budget, so the script
    refuses a BUDGET that leaves less than 40 s of the device tool's 600 s limit (or is not
    whole seconds), before running anything: a call at 596 s ran into the limit during its
    last process's final handoff."""
    rc, out, calls = _run(tmp_path, budget, "pure_llama:paper")
    assert rc == 2 and "at most 560" in out and f"got '{budget}'" in out
    assert calls == []


def test_a_budget_of_560_runs(tmp_path):
    """560 s, the most the script accepts, runs its studies."""
    rc, out, calls = _run(tmp_path, "560", "pure_llama:paper")
    assert rc == 0, out
    assert float(_opt(calls[0], "--budget-s")) == 560


def test_a_session_call_stops_before_training_over_a_tree_without_the_last_results(
        tmp_path):
    """`expect_results.sh STUDY N` exits 3 and names both counts where the tree holds
    another number of the study's results than N (a call over it would train the last
    call's seeds again), 0 where they agree."""
    results = tmp_path / "studies" / "results" / "pure_llama"
    results.mkdir(parents=True)
    for i in range(2):
        (results / f"u{i}.json").write_text("{}")
    (results / "work").mkdir()  # not a result
    script = os.path.join(REPO, "benchmarks", "expect_results.sh")

    def check(n):
        return subprocess.run(["bash", script, "pure_llama", str(n)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=30)

    assert check(2).returncode == 0
    stale = check(3)
    assert stale.returncode == 3
    assert "holds 2 pure_llama results, not 3" in stale.stdout


REPLAY = os.path.join(REPO, "benchmarks", "gpu_replay_call.sh")


def _replay(tmp_path, *args):
    """Runs `gpu_replay_call.sh` over a stand-in tree holding a few committed units, with a
    ``python3`` that records each command line, the files its ``--results`` folder holds
    and its XLA flags, and for ``run`` writes the units it was asked for; returns (exit
    code, output, records, the committed folder)."""
    tree = _tree(tmp_path)
    committed = tree / "studies" / "results" / "pure_llama"
    committed.mkdir(parents=True, exist_ok=True)
    for unit in ("prose-tpp10-paper-s1", "prose-tpp10-paper-s2", "prose-tpp10-paper_tail-s1",
                 "prose-tpp10-bf16-s1", "python-tpp10-paper-s1"):
        (committed / f"{unit}.json").write_text('{"committed": true}')
    log = tmp_path / "calls.txt"
    _stand_in(tmp_path, "python3", f'''
results=; variant=; seeds=; prev=
for a in "$@"; do
  case $prev in --results) results=$a ;; --variants) variant=$a ;; --seeds) seeds=$a ;; esac
  prev=$a
done
{{ printf "%q " "$@"; echo; echo "files: $(ls "$results" | tr '\\n' ' ')"; \
  echo "flags: $XLA_FLAGS"; }} >> {shlex.quote(str(log))}
if [ "$2" = run ]; then
  for s in ${{seeds//,/ }}; do
    echo '{{"replayed": true}}' > "$results/prose-tpp10-$variant-s$s.json"
  done
fi''')
    (tmp_path / "tmp").mkdir(exist_ok=True)
    proc = subprocess.run(["bash", REPLAY, *args],
                          env=_script_env(tmp_path, TMPDIR=str(tmp_path / "tmp")),
                          capture_output=True, text=True, cwd=tree, timeout=60)
    lines = log.read_text().splitlines() if log.exists() else []
    records = [dict(argv=shlex.split(lines[i]), files=lines[i + 1].split()[1:],
                    flags=lines[i + 2][len("flags: "):]) for i in range(0, len(lines), 3)]
    return proc.returncode, proc.stdout + proc.stderr, records, committed


def test_a_replay_trains_exactly_the_named_units_again_beside_the_committed_ones(tmp_path):
    """Each VARIANT:SEEDS replay runs in a scratch copy of the committed results that lacks
    exactly its units (so the runner trains those and nothing else) with the study calls'
    XLA flags and compilation cache; the committed folder is never written; `repeats`
    then compares only the replayed units against the committed ones."""
    rc, out, records, committed = _replay(tmp_path, "400", "pure_llama", "prose", "3",
                                          "paper:1,2", "bf16:1")
    assert rc == 0, out
    runs = [r for r in records if r["argv"][1] == "run"]
    assert [(_opt(r["argv"], "--variants"), _opt(r["argv"], "--seeds")) for r in runs] == [
        ("paper", "1,2"), ("bf16", "1")]
    first, second = (set(r["files"]) for r in runs)
    assert "prose-tpp10-paper-s1.json" not in first and "prose-tpp10-paper-s2.json" not in first
    assert {"prose-tpp10-paper_tail-s1.json", "prose-tpp10-bf16-s1.json",
            "python-tpp10-paper-s1.json"} <= first
    assert "prose-tpp10-bf16-s1.json" not in second and "prose-tpp10-paper-s1.json" in second
    for r in runs:
        argv = r["argv"]
        assert _opt(argv, "--seed-batch") == "3" and _opt(argv, "--corpora") == "prose"
        assert _opt(argv, "--results") == str(tmp_path / "tmp" / "replay")
        assert _opt(argv, "--compile-cache") == "studies/results/pure_llama/work/jax_cache"
        assert "--xla_gpu_load_autotune_results_from=" in r["flags"]
        assert r["flags"].endswith("studies/results/pure_llama/work/autotune/picks.textproto")
    (rep,) = [r for r in records if r["argv"][1] == "repeats"]
    assert _opt(rep["argv"], "--against") == "studies/results/pure_llama"
    assert sorted(rep["files"]) == ["prose-tpp10-bf16-s1.json", "prose-tpp10-paper-s1.json",
                                    "prose-tpp10-paper-s2.json"]
    assert all(f.read_text() == '{"committed": true}' for f in committed.glob("*.json"))


@pytest.mark.parametrize("args, message", [
    (("600", "pure_llama", "prose", "3", "paper:1"), "at most 560"),
    (("400", "pure_llama", "prose", "3"), "one or more VARIANT:SEEDS"),
    (("400", "pure_llama", "prose", "3", "paper"), "VARIANT:SEEDS"),
    (("400", "pure_llama", "prose", "3", "paper:1;2"), "VARIANT:SEEDS"),
    (("400", "pure_llama", "prose", "3", "paper:7"), "no committed pure_llama unit prose paper s7"),
])
def test_a_replay_of_bad_arguments_or_uncommitted_units_is_refused(tmp_path, args, message):
    """A budget over 560 s, no replay, a malformed VARIANT:SEEDS or a seed without a
    committed unit exits 2, naming the fault, before any run."""
    rc, out, records, _ = _replay(tmp_path, *args)
    assert rc == 2 and message in out
    assert not [r for r in records if r["argv"][1] == "run"]
