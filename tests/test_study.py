"""studies/: the validation study's harness — resume, handoff, interval math, report, corpus."""

import dataclasses
import doctest
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import types
import zlib
from pathlib import Path

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.join(REPO, "studies"))

import batch_plans  # noqa: E402
import data  # noqa: E402
import handoff  # noqa: E402
import study_handoff  # noqa: E402
import study_report  # noqa: E402
import study_results  # noqa: E402
import study_specs  # noqa: E402
import study_stats  # noqa: E402
import train_llama  # noqa: E402
import unit_records  # noqa: E402
import unit_runs  # noqa: E402
import validation  # noqa: E402
from llama import LlamaConfig  # noqa: E402

DOWN_ONLY = study_specs.Variant("down_only", "nvfp4",
                                keep_patterns=(r".*\.attn\..*", r".*\.mlp\.(gate|up)"))
"""Recipe.nvfp4() (RHT, SR, 2D weights) on the MLP's down projection only: one NVFP4
layer compiles in a few seconds on a CPU, seven take three times as long."""

TINY = study_specs.StudySpec(
    name="tiny", title="test", item="-", model=LlamaConfig(dim=64, layers=1, heads=2),
    corpora=("python",), tokens_per_param=(0.003,), variants=("bf16", "down_only"),
    seeds=(0,), batch=2, seq=16, evals=2, eval_batches=2, diag_samples=0, checkpoints=2,
    eval_bf16_forward=False, custom_variants=(DOWN_ONLY,),
)
"""8 steps of a 1-block Llama with one NVFP4 layer."""


def _corpus():
    rng = np.random.default_rng(0)
    return data.Corpus(train=rng.integers(0, 256, 6000).astype(np.uint8),
                       val=rng.integers(0, 256, 600).astype(np.uint8), roots=(),
                       files_train=1, files_val=1, duplicates=0, seconds=0.0)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_resume_through_a_handoff_is_bitwise_the_straight_run(tmp_path):
    """NVFP4 (SR gradients) unit: 8 steps straight == 4 steps, checkpoint, handoff
    (pack -> unpack -> carry -> restore into a fresh results folder), 4 more steps —
    bitwise on every parameter, and the same validation curve, training curve and final
    loss. Only a restored state reaches step 8: the cut-off call stops at 4."""
    unit = study_specs.Unit("python", 0.003, "down_only", 0)
    assert TINY.steps(unit.tokens_per_param) == 8
    corpus = _corpus()
    trainer = train_llama.Trainer(TINY.model_config(), TINY.run_config(unit), 8)
    straight = unit_runs.run_unit(TINY, unit, tmp_path / "a", corpus, trainer=trainer)
    assert straight.finished and straight.steps == 8 and trainer.report is not None

    cut = unit_runs.run_unit(TINY, unit, tmp_path / "b", corpus, trainer=trainer, stop_at=4)
    assert not cut.finished and cut.steps == 4
    assert not unit_runs.result_path(tmp_path / "b", unit).exists()
    cache = tmp_path / "cache"  # stands for the persistent compilation cache
    (cache / "sub").mkdir(parents=True)
    (cache / "jit_step-1-cache").write_bytes(b"x" * 3000)
    (cache / "sub" / "autotune").write_bytes(b"y" * 10)
    notes = study_handoff.pack_handoff(TINY, tmp_path / "b", tmp_path / "out", cache)
    assert any("step 4" in n for n in notes) and any("2 of 2" in n for n in notes), notes
    study_handoff.unpack(TINY, tmp_path / "here", tmp_path / "out", tmp_path / "carry")
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == [
        "cache-tiny.tar.part0", f"partial-tiny-{unit.name}-step4.tar.part0"]
    notes = study_handoff.restore_handoff(TINY, tmp_path / "c", tmp_path / "carry",
                                          tmp_path / "cache2")
    assert len(notes) == 2 and (tmp_path / "cache2" / "sub" / "autotune").read_bytes() == b"y" * 10
    resumed = unit_runs.run_unit(TINY, unit, tmp_path / "c", corpus, trainer=trainer)
    assert resumed.finished and resumed.steps == 8

    a, c = _leaves(straight.state.params), _leaves(resumed.state.params)
    assert all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    ra, rc = straight.result, resumed.result
    assert ra["val_curve"] == rc["val_curve"] and [s for s, *_ in ra["val_curve"]] == [4, 8]
    assert ra["train_curve"] == rc["train_curve"] and ra["final_val_bpb"] == rc["final_val_bpb"]
    assert [(s["from"], s["to"]) for s in rc["segments"]] == [(0, 4), (4, 8)]
    assert json.loads(unit_runs.result_path(tmp_path / "c", unit).read_text())[
        "final_val_bpb"] == rc["final_val_bpb"]
    assert not (unit_runs.work_dir(tmp_path / "c", unit) / "ckpt").exists()  # done: dropped
    assert rc["quantized_layers"] == 1  # the property is checked on an NVFP4 run


def test_cache_handoff_keeps_the_newest_entries_that_fit_and_a_cut_copy_changes_nothing(
        tmp_path, monkeypatch):
    """Among entries of unknown compile time (not JAX's format), `pack_cache` hands off
    the newest within its bytes and parts, naming those it left out (older parts
    of the same archive removed, so no stale part joins a new archive); restoring parts
    of which one is missing leaves the cache as it was (no half-extracted entry) and says
    so, and whole parts restore every entry byte for byte."""
    monkeypatch.setattr(handoff, "PART_BYTES", 6000)  # tar: 8704 bytes a file, in records of 10240
    cache, out = tmp_path / "cache", tmp_path / "out"
    (cache / "xla").mkdir(parents=True)
    for i, name in enumerate(["oldest", "middle", "xla/tuned"]):
        (cache / name).write_bytes(bytes([65 + i]) * 8000)
        os.utime(cache / name, (1000 + i, 1000 + i))
    notes = study_handoff.pack_cache(TINY, cache, out, max_bytes=40000, max_files=7)
    assert notes == ["handoff: 3 of 3 compilation-cache files, 0.0 MiB (6 parts)"]
    notes = study_handoff.pack_cache(TINY, cache, out, max_bytes=20000, max_files=7)
    assert notes == ["handoff: 1 of 3 compilation-cache files, 0.0 MiB (2 parts)",
                     "  left out: middle (0.0 MiB, compiled in ? s)",
                     "  left out: oldest (0.0 MiB, compiled in ? s)"]
    assert sorted(p.name for p in out.iterdir()) == ["cache-tiny.tar.part0",
                                                     "cache-tiny.tar.part1"]
    (out / "cache-tiny.tar.part1").unlink()  # a call stopped inside the entry's parts
    into = tmp_path / "into"
    notes = study_handoff.restore_handoff(TINY, tmp_path / "r", out, into)
    assert len(notes) == 1 and "unreadable" in notes[0], notes
    assert not any(p.is_file() for p in into.rglob("*"))
    study_handoff.pack_cache(TINY, cache, out, max_bytes=30000, max_files=5)
    notes = study_handoff.restore_handoff(TINY, tmp_path / "r", out, into)
    assert "4 handed-off parts" in notes[0], notes
    assert sorted(p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file()) == [
        "middle", "xla/tuned"]
    assert (into / "xla" / "tuned").read_bytes() == b"C" * 8000


def _jax_cache_entry(path, compile_s, size):
    """A file in JAX 0.11.2's persistent-cache format (zlib, no zstandard): a 4-byte
    big-endian compile time, then an executable (here random, so it does not shrink)."""
    path.write_bytes(zlib.compress(compile_s.to_bytes(4, "big") + os.urandom(size)))
    return path


def test_cache_handoff_keeps_the_entries_that_save_the_most_compile_time(tmp_path):
    """Where the bytes do not hold every entry, `pack_cache` hands off the old training
    step that took 30 s to compile before newer entries that took 8 s and 3 s (what
    newest-first did: the paper step left out on the H200), and names what it left
    out with its size and recorded compile time."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    for i, (name, secs, size) in enumerate([("jit_batched-step", 30, 60000),
                                            ("jit_lambda-eval", 8, 30000),
                                            ("jit_lambda-init", 3, 5000)]):
        os.utime(_jax_cache_entry(cache / name, secs, size), (1000 + i, 1000 + i))
    assert study_handoff.recorded_compile_s(cache / "jit_batched-step") == 30
    notes = study_handoff.pack_cache(TINY, cache, out, max_bytes=80000, max_files=7)
    assert notes[0].startswith("handoff: 2 of 3 compilation-cache files"), notes
    assert notes[1:] == ["  left out: jit_lambda-eval (0.0 MiB, compiled in 8 s)"]
    into = tmp_path / "into"
    study_handoff.restore_handoff(TINY, tmp_path / "r", out, into)
    assert sorted(p.name for p in into.iterdir()) == ["jit_batched-step", "jit_lambda-init"]


def test_hand_off_cache_counts_what_out_holds_but_not_the_studys_own_older_parts(
        tmp_path, monkeypatch):
    """`hand_off_cache` leaves `pack_cache` the device tool's 8 files less every file in
    $OUT (logs, archives, another study's cache parts) and the bytes less the other
    studies' cache parts; this study's older parts, which the new ones replace, count for
    neither."""
    out = tmp_path / "out"
    files = {"logs/1-tiny.log": 10, "logs/2-hybrid.log": 10, "autotune.tar": 10,
             "tiny/results-tiny.tar.gz": 10, "hybrid/cache-hybrid.tar.part0": 3000,
             "tiny/cache-tiny.tar.part0": 5000, "tiny/cache-tiny.tar.part1": 5000}
    for name, size in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(b"x" * size)
    seen = {}
    monkeypatch.setattr(study_handoff, "pack_cache",
                        lambda spec, cache, to, **kw: seen.update(to=to, **kw) or [])
    study_handoff.hand_off_cache(TINY, tmp_path / "cache", out, max_bytes=10000)
    assert seen == {"to": out / "tiny", "max_bytes": 7000, "max_files": 3}


def test_recorded_compile_s_reads_an_entry_jax_wrote(tmp_path):
    """An entry JAX itself writes to its persistent cache (a subprocess with the cache on
    and no compile-time or size floor) reads back a compile time: the format
    `recorded_compile_s` assumes is the one this JAX writes."""
    code = ("import jax, jax.numpy as jnp; jax.jit(lambda x: jnp.sin(x) @ x)"
            "(jnp.ones((8, 8))).block_until_ready()")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp_path),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    entries = [p for p in tmp_path.iterdir() if p.name.endswith("-cache")]
    assert entries
    for p in entries:
        secs = study_handoff.recorded_compile_s(p)
        assert isinstance(secs, int) and 0 <= secs < 60, (p.name, secs)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.integers(1, 50),
                                     st.one_of(st.none(), st.integers(0, 40))),
                           min_size=1, max_size=8),
                  st.integers(0, 120))
@hypothesis.example(entries=[(1, 2), (50, 40)], capacity=50)  # greedy by density alone: 2 s
def test_chosen_cache_entries_fit_cannot_grow_and_save_half_the_best(entries, capacity):
    """For any entries (size, recorded seconds or unknown) and capacity, the chosen ones
    fit; no entry left out would still fit beside them; and they save at least half the
    compile seconds of the best subset that fits (checked by brute force)."""
    paths = [Path(f"e{i}") for i in range(len(entries))]
    sizes = {p: size for p, (size, _) in zip(paths, entries)}
    seconds = {p: secs for p, (_, secs) in zip(paths, entries)}
    mtimes = {p: float(i) for i, p in enumerate(paths)}

    def fits(chosen):
        return sum(chosen) <= capacity

    chosen = study_handoff.choose_cache_entries(sizes, seconds, mtimes, fits)
    assert len(set(chosen)) == len(chosen) and fits([sizes[p] for p in chosen])
    assert not any(fits([sizes[q] for q in chosen + [p]]) for p in paths if p not in chosen)
    best = max(sum(seconds[p] or 0 for p in subset)
               for k in range(len(paths) + 1) for subset in itertools.combinations(paths, k)
               if fits([sizes[p] for p in subset]))
    assert 2 * sum(seconds[p] or 0 for p in chosen) >= best


def test_run_study_leaves_a_unit_that_cannot_fit_to_the_next_call(tmp_path):
    """A unit whose estimate (from a finished seed of its variant) exceeds the time left
    but fits a whole call is not started; the call ends without training anything."""
    spec = dataclasses.replace(TINY, seeds=(0, 1))
    done = study_specs.Unit("python", 0.003, "bf16", 0)
    (tmp_path / f"{done.name}.json").write_text(json.dumps(
        {"compile_s": 5.0, "train_wall_s": 45.0, "steps": 4, "final_val_bpb": 1.0}))
    est = unit_runs.estimate_s(spec, study_specs.Unit("python", 0.003, "bf16", 1), tmp_path)
    assert est == 5.0 + 8 * 10.0
    assert unit_runs.estimate_s(spec, study_specs.Unit("python", 0.003, "bf16", 1), tmp_path,
                                compiled=True) == 8 * 10.0  # a reused trainer: no compile
    begun = time.perf_counter() - 50.0  # 40 s left: too few for 85, enough for a new call
    out = unit_runs.run_study(spec, tmp_path, budget_s=100.0, reserve_s=10.0,
                              corpora={"python": _corpus()}, t_begin=begun)
    assert out == []


@pytest.mark.parametrize("flag", [[], ["--no-cache-handoff"]])
def test_cli_run_hands_off_the_compilation_cache_unless_told_to_keep_it(
        tmp_path, monkeypatch, capsys, flag):
    """``validation.py run --handoff OUT`` packs the compilation cache's entries beside
    the results; with ``--no-cache-handoff`` it hands off the results only (the call
    scripts keep the cache on the device machine for its next call). Its log says how
    long the backend took to start."""
    monkeypatch.setattr(validation, "run_seed_batches", lambda *_, **__: [])
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "jit_step-1-cache").write_bytes(b"x" * 100)
    before = jax.config.jax_compilation_cache_dir
    try:
        assert validation.main(["run", "smoke", "--budget-s", "60", "--seed-batch", "2",
                                "--results", str(tmp_path / "results"), "--handoff",
                                str(tmp_path / "out"), "--compile-cache", str(cache),
                                *flag]) == 0
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert re.search(r"\n  device .* \(cpu, started in \d+s, \d+s into the run\), jax ",
                     capsys.readouterr().out)
    handed = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert handed == ([] if flag else ["cache-smoke.tar.part0"]) + ["results-smoke.tar.gz"]


def test_cli_plan_prints_the_study_and_each_units_state(tmp_path, capsys):
    """``validation.py plan STUDY --no-corpus``, the command line over the study modules:
    the study's title, a finished unit with its final loss, every other unit not started."""
    spec = study_specs.STUDIES["smoke"]
    done = spec.units()[0]
    (tmp_path / f"{done.name}.json").write_text(json.dumps({"final_val_bpb": 1.25}))
    assert validation.main(["plan", "smoke", "--no-corpus", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[smoke] {spec.title}"
    assert f"  {done.name:<34} done: val 1.2500 bpb" in out
    assert sum(line.endswith(" not started") for line in out) == len(spec.units()) - 1

def test_t_table_is_the_student_t_quantile():
    """Each tabulated t(0.975, df) has CDF 0.975 (regularized incomplete beta from JAX:
    an independent computation), and the 3-value interval matches the textbook value."""
    for df, t in study_stats.T_975.items():
        x = df / (df + t * t)
        cdf = 1.0 - 0.5 * float(jax.scipy.special.betainc(df / 2.0, 0.5, np.float64(x)))
        assert abs(cdf - 0.975) < 1e-6, (df, cdf)
    iv = study_stats.mean_interval([1.0, 2.0, 3.0])  # sd 1, t(0.975, 2) = 4.302653
    assert iv.mean == 2.0 and iv.n == 3 and math.isclose(iv.half_width, 4.302653 / 3**0.5,
                                                         rel_tol=1e-6)
    assert study_stats.mean_interval([0.5]).half_width is None
    assert study_stats.mean_interval([0.01, 0.0101, 0.0099]).wide is False  # ±0.025 pp
    assert study_stats.mean_interval([0.01, 0.02, 0.0]).wide is True
    for df in (31, 47, 100, 400):  # beyond the table: the Cornish-Fisher expansion
        t = study_stats.t_critical(df)
        x = df / (df + t * t)
        cdf = 1.0 - 0.5 * float(jax.scipy.special.betainc(df / 2.0, 0.5, np.float64(x)))
        assert abs(cdf - 0.975) < 2e-5, (df, cdf)
    with pytest.raises(ValueError, match="degrees of freedom"):
        study_stats.t_critical(0)
    with pytest.raises(ValueError, match="finite"):
        study_stats.mean_interval([1.0, float("nan")])


def test_difference_interval_is_welch_with_its_degrees_of_freedom_rounded_down():
    """The run-length growth interval: mean difference of two independent samples, Welch
    standard error, t at ⌊Welch-Satterthwaite ν⌋, checked against scipy's Student t (an
    independent implementation) on unequal sizes and spreads; equal spreads of n = 3
    give ν = 4 exactly."""
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n1, n2, s1, s2 in ((3, 3, 0.26, 0.73), (3, 8, 1.0, 0.1), (5, 4, 0.5, 0.5)):
        a, b = rng.normal(0.03, s1, n1), rng.normal(0.05, s2, n2)
        va, vb = a.var(ddof=1) / n1, b.var(ddof=1) / n2
        nu = (va + vb) ** 2 / (va**2 / (n1 - 1) + vb**2 / (n2 - 1))
        want = scipy_stats.t.ppf(0.975, math.floor(nu)) * math.sqrt(va + vb)
        iv = study_stats.difference_interval(a, b)
        assert math.isclose(iv.mean, b.mean() - a.mean(), rel_tol=1e-12)
        assert math.isclose(iv.half_width, want, rel_tol=1e-6), (n1, n2, iv, want)
        assert iv.n == min(n1, n2)
    iv = study_stats.difference_interval([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    assert math.isclose(iv.half_width, scipy_stats.t.ppf(0.975, 4) * math.sqrt(2 / 3),
                        rel_tol=1e-6)
    with pytest.raises(ValueError, match="second: need two or more"):
        study_stats.difference_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="first: need two or more finite"):
        study_stats.difference_interval([1.0, float("inf")], [1.0, 2.0])


SEEDS = (0, 1, 2)
BF16_VALS = {0: 2.00, 1: 2.02, 2: 1.98}
GAPS = {"paper": {0: 0.0150, 1: 0.0160, 2: 0.0170}, "no_sr": {0: 0.01, 1: 0.05, 2: 0.03}}


def _fake_result(spec, variant, seed, val):
    """A result file with the fields the report reads (a test fixture, not a result)."""
    unit = study_specs.Unit("python", 10.0, variant, seed)
    diag = [{"step": s, "layers": 2, "summary": {
        "w/flush_to_zero": {"mean": 0.01, "max": 0.02 * (i + 1), "max_layer": "blocks.0.mlp.up"},
        "w/rel_error": {"mean": 0.1, "max": 0.12, "max_layer": "blocks.0.mlp.up"}}}
        for i, s in enumerate((50, 100))] if variant != "bf16" and seed == 0 else []
    return {
        "study": spec.name, "unit": unit.name, "corpus": "python", "variant": variant,
        "seed": seed, "tokens_per_param_planned": 10.0, "tokens_per_param": 10.0,
        "steps": 100, "tokens": 100 * 64 * 512, "epochs": 0.25, "model": "Llama tiny",
        "params": {"total": 3_276_800}, "run_config": {"batch": 64, "seq": 512},
        "corpus_info": {"train_bytes": 10**8, "val_bytes": 10**6, "files_train": 10,
                        "prose": False},
        "val_curve": [[50, 50 * 32768, val + 0.5], [100, 100 * 32768, val]],
        "final_val_bpb": val, "final_val_bpb_bf16_forward": None, "step_time_s": 0.05,
        "train_wall_s": 9.0, "diagnostics": diag,
        "health": {"nonfinite_train_losses": 0, "final_val_finite": True},
        "segments": [{"environment": {"device": "fake", "jax": "0"}}],
    }


def test_goals_section_reads_each_goal_from_the_intervals(tmp_path):
    """The three goals' verdicts follow the 95% intervals: a full-recipe gap above the
    published span, an ablation worse than the full recipe, the lowest-gap variant
    within 0.5% of BF16; a gap whose interval reaches zero is flagged as a bug signal;
    a straddling interval is "not resolved"; no results give no section. The full
    recipe's half-width is read against ±0.3 pp, and where wider the seeds its sd needs."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="goals", seeds=SEEDS,
                               variants=("bf16", "paper", "no_sr", "no_2d", "paper_tail"))

    def results(gaps):
        out = []
        for sd in SEEDS:
            out.append(_fake_result(spec, "bf16", sd, BF16_VALS[sd]))
            out += [_fake_result(spec, v, sd, BF16_VALS[sd] * (1 + g[sd]))
                    for v, g in gaps.items()]
        return {"goals": out}

    text = study_report.goals_section([spec], results({
        "paper": {0: 0.030, 1: 0.031, 2: 0.032}, "no_sr": {0: 0.040, 1: 0.042, 2: 0.041},
        "no_2d": {0: 0.01, 1: 0.05, 2: 0.03}, "paper_tail": {0: 0.001, 1: 0.002, 2: 0.0015}}))
    lines = text.splitlines()
    assert [ln for ln in lines if ln.startswith("  - goals") and "+3.10%" in ln][0].endswith(
        ": above the published span")
    assert [ln for ln in lines if ", no_sr:" in ln][0].endswith(": worse than the full recipe")
    assert [ln for ln in lines if ", no_2d:" in ln][0].endswith(": not resolved")
    best = [ln for ln in lines if ": paper_tail, " in ln]
    assert len(best) == 1 and best[0].endswith(": within 0.5% of BF16")
    # Gaps 3.0%, 3.1%, 3.2%: sd 0.1 pp, half-width 4.30 * 0.1 / sqrt(3) = 0.25 pp.
    assert [ln for ln in lines if ", seed sd " in ln] == [
        "  - goals, python, 10 tokens/param: ±0.25 pp, n=3, seed sd 0.10 pp: narrower"]
    zero = study_report.goals_section([spec], results({"paper": {0: -0.01, 1: 0.0, 2: 0.012}}))
    assert "not distinguishable from zero: a bug signal" in zero
    # sd 1.10 pp: ±0.3 pp takes the n with t(n-1) * 1.10 / sqrt(n) <= 0.3, which is 55.
    wide = [ln for ln in zero.splitlines() if ", seed sd " in ln]
    assert wide == ["  - goals, python, 10 tokens/param: ±2.74 pp, n=3, seed sd 1.10 pp: "
                    "wider; ±0.3 pp would take 55 seeds at that sd"]
    assert "the quantization is active" not in zero  # no run measured its forward cost
    assert "nothing measured yet" in zero  # no ablation, no second variant
    assert study_report.goals_section([spec], {"goals": []}) == ""


def test_the_quantized_forwards_cost_is_reported_per_seed_and_checks_a_zero_gap():
    """Each quantized run's val / val_bf16_forward - 1 on its own weights: the gap table
    gives its range over seeds (a dash for BF16, 0 for a variant ending with a BF16
    forward); a full-recipe gap whose interval reaches zero is said to come with active
    quantization only where every seed's cost is above zero."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="costs", seeds=SEEDS,
                               variants=("bf16", "paper", "paper_tail"))

    def results(costs):
        out = []
        for sd, gap in zip(SEEDS, (-0.01, 0.0, 0.012)):
            out.append(_fake_result(spec, "bf16", sd, BF16_VALS[sd]))
            for v, cost in (("paper", costs[sd]), ("paper_tail", 0.0)):
                r = _fake_result(spec, v, sd, BF16_VALS[sd] * (1 + gap))
                r["final_val_bpb_bf16_forward"] = r["final_val_bpb"] / (1 + cost)
                out.append(r)
        return out

    active = results({0: 0.004, 1: 0.006, 2: 0.008})
    variants = study_results.by_group(active)[("python", 10.0)]
    table = study_report.gap_table(spec, variants, "python").splitlines()
    assert "| +0.40% .. +0.80% |" in next(ln for ln in table if ln.startswith("| paper |"))
    assert "| 0 (ends with a BF16 forward) |" in next(
        ln for ln in table if ln.startswith("| paper_tail |"))
    assert next(ln for ln in table if ln.startswith("| bf16 |")).split(" | ")[3] == "—"
    text = study_report.goals_section([spec], {"costs": active})
    assert "bug signal" in text and "+0.40% to +0.80%" in text
    assert "the quantization is active" in text
    one_free = study_report.goals_section([spec], {"costs": results({0: 0.004, 1: 0.0, 2: 0.008})})
    assert "bug signal" in one_free and "the quantization is active" not in one_free


def test_the_full_recipe_comparison_says_through_which_step_the_runs_are_equal():
    """The last column of the table against the full recipe: the last evaluation through
    which the shared seeds' validation curves equal the full recipe's (the earliest over
    seeds), counting the seeds that do where some part from the first evaluation, and a
    dash where none does."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="alike", seeds=SEEDS,
                               variants=("bf16", "paper", "paper_tail"))

    def row(parted):
        out = []
        for sd in SEEDS:
            out.append(_fake_result(spec, "bf16", sd, BF16_VALS[sd]))
            paper = _fake_result(spec, "paper", sd, BF16_VALS[sd] * 1.03)
            tail = _fake_result(spec, "paper_tail", sd, BF16_VALS[sd] * 1.02)
            tail["val_curve"][0] = list(paper["val_curve"][0])  # equal through step 50
            if sd in parted:
                tail["val_curve"][0][2] += 1e-4
            out += [paper, tail]
        variants = study_results.by_group(out)[("python", 10.0)]
        table = study_report.against_full_recipe(spec, variants, "python")
        return next(ln for ln in table.splitlines() if ln.startswith("| paper_tail |"))

    assert row(()).endswith("| step 50 |")
    assert row((2,)).endswith("| step 50 (2 of 3 seeds) |")
    assert row(SEEDS).endswith("| — |")


def test_goals_section_reads_the_growth_with_run_length_from_its_welch_interval():
    """Item 4's verdict: the full recipe's gap at the longest run length minus at the
    shortest, with `difference_interval`'s Welch interval, "grows" when it lies above
    zero and "not resolved" when it straddles it; a study of one run length has none."""
    spec = dataclasses.replace(study_specs.STUDIES["long_data"], name="growth", seeds=SEEDS)

    def results(long_gaps):
        out = []
        for tpp, gaps in ((10.0, {0: 0.030, 1: 0.031, 2: 0.029}), (100.0, long_gaps)):
            for sd in SEEDS:
                for v, val in (("bf16", BF16_VALS[sd]), ("paper", BF16_VALS[sd] * (1 + gaps[sd]))):
                    r = _fake_result(spec, v, sd, val)
                    r["tokens_per_param_planned"] = tpp
                    out.append(r)
        return {"growth": out}

    grows = {0: 0.050, 1: 0.052, 2: 0.051}
    line = [ln for ln in study_report.goals_section([spec], results(grows)).splitlines()
            if "10 → 100 tokens/param" in ln]
    d = study_stats.difference_interval([0.030, 0.031, 0.029], list(grows.values()))
    lo, hi = d.mean - d.half_width, d.mean + d.half_width
    assert line == [f"  - growth, python, 10 → 100 tokens/param: {d.mean * 100:+.2f} pp "
                    f"[{lo * 100:+.2f}, {hi * 100:+.2f}] pp, n=3 and 3: grows"]
    straddles = study_report.goals_section([spec], results({0: 0.0, 1: 0.06, 2: 0.03}))
    assert [ln for ln in straddles.splitlines() if "10 → 100" in ln][0].endswith(
        ": not resolved")
    one_length = dataclasses.replace(spec, tokens_per_param=(10.0,))
    assert "10 → 100" not in study_report.goals_section([one_length], results(grows))


def test_report_tables_intervals_and_figures_from_result_files(tmp_path):
    """The report pairs seeds, prints each gap's mean and 95% interval as the interval math
    gives them (in its study's table and in the headline table), flags the wide one,
    reports a diverged run apart, draws the figures; with no results it says so."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake",
                               variants=("bf16", "paper", "no_sr", "all_nvfp4"), seeds=SEEDS)
    res = tmp_path / "results"
    res.mkdir()
    for s in SEEDS:
        for v, val in [("bf16", BF16_VALS[s])] + [(v, BF16_VALS[s] * (1 + GAPS[v][s]))
                                                  for v in GAPS]:
            r = _fake_result(spec, v, s, val)
            (res / f"{r['unit']}.json").write_text(json.dumps(r))
    r = _fake_result(spec, "all_nvfp4", 0, float("nan"))
    r["health"] = {"nonfinite_train_losses": 3, "final_val_finite": False}
    (res / f"{r['unit']}.json").write_text(json.dumps(r))
    empty = dataclasses.replace(spec, name="empty")
    doc = tmp_path / "docs" / "STUDY.md"
    text = study_report.write_report([spec, empty], {"fake": res, "empty": tmp_path / "none"},
                                     doc, tmp_path / "docs" / "study", command="report")
    assert doc.read_text() == text
    rows = {}  # each variant's row of the gap table, its first row in the study's section
    for line in text[text.index("## fake"):].splitlines():
        if line.startswith("| ") and line.split("|")[1].strip() in ("bf16", "paper", "no_sr"):
            rows.setdefault(line.split("|")[1].strip(), line)
    paper = study_stats.mean_interval(list(GAPS["paper"].values()))
    assert "+1.60% (n=3)" in rows["paper"] and f"±{paper.half_width * 100:.2f} pp" in rows[
        "paper"]
    lo, hi = paper.mean - paper.half_width, paper.mean + paper.half_width
    assert f"[{lo * 100:+.2f}%, {hi * 100:+.2f}%]" in rows["paper"]
    assert "too wide" not in rows["paper"] and "too wide" in rows["no_sr"]
    headline = text[text.index("## Headline"):text.index("## fake")]
    assert f"| fake | python | 10 | paper | +1.60% | [{lo * 100:+.2f}%, {hi * 100:+.2f}%] | 3 |" \
        in headline
    assert "| fake | python | 10 | no_sr | +3.00% |" in headline and "**too wide**" in headline
    assert "all_nvfp4" not in headline  # its one seed diverged: no pair with BF16
    hidden = dataclasses.replace(spec, headline=False)
    assert study_report.headline_table([hidden], {"fake": study_results.load_results(
        hidden, res)}) == ""
    assert "+3.00% (n=3)" in rows["no_sr"] and "2.0000 ± 0.0200" in rows["bf16"]
    figs = sorted(p.name for p in (tmp_path / "docs" / "study").iterdir())
    assert figs == ["fake-python-tpp10-curves.png", "fake-python-tpp10-gaps.png",
                    "fake-python-tpp10-health.png"]
    assert "](study/fake-python-tpp10-gaps.png)" in text
    assert "| all_nvfp4 | 0 | — (1 diverged) | — | no finished pair with BF16" in text
    assert "**python-tpp10-all_nvfp4-s0**: 3 non-finite training losses" in text
    assert "2.00e-02 → 4.00e-02" in text
    empty_section = text[text.index("## empty"):text.index("## How to run")]
    assert "**No results yet**: none of the 12 units" in empty_section
    assert "| " not in empty_section  # no table, no number from nowhere


def test_replay_comparison_reads_how_far_each_pair_moved_in_another_batch(tmp_path):
    """A pair trained again in another seed batch gets a row with both gaps and how far
    each run moved; a seed with only one side trained again has none; the summary gives
    the gap's change, the runs' root-mean-square change, the correlation (from three
    pairs) and the summation-order share of the committed gaps' spread as the formulas
    give them; the report shows the section only where a replay folder is given."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake",
                               variants=("bf16", "paper"), seeds=tuple(range(6)))

    def run(variant, seed, val, seeds):
        r = _fake_result(spec, variant, seed, val)
        r["seed_batch"] = {"seeds": list(seeds), "index": list(seeds).index(seed)}
        return r

    gaps = [0.01, 0.05, 0.02, 0.03, 0.00, 0.04]
    committed = {"bf16": {s: run("bf16", s, 2.0, range(6)) for s in range(6)},
                 "paper": {s: run("paper", s, 2.0 * (1 + g), range(6))
                           for s, g in enumerate(gaps)}}
    moved = {0: (0.004, -0.002), 1: (-0.003, 0.001), 2: (0.0, 0.0)}  # (paper, bf16)
    again = {"bf16": {s: run("bf16", s, 2.0 * (1 + moved[s][1]), (0, 1, 2)) for s in moved},
             "paper": {s: run("paper", s, 2.0 * (1 + gaps[s]) * (1 + moved[s][0]), (0, 1, 2))
                       for s in moved}}
    again["paper"][3] = run("paper", 3, 2.1, (3,))  # its BF16 run was not trained again
    text = study_report.replay_comparison(committed, again)
    rows = [ln for ln in text.splitlines() if ln.startswith("| paper |")]
    assert [ln.split("|")[2].strip() for ln in rows] == ["0", "1", "2"]
    assert "| place 0 of 6; place 0 of 6 | place 0 of 3; place 0 of 3 | +1.00% |" in rows[0]
    assert rows[2].endswith("| +2.00% | +2.00% | +0.00% | +0.00% |")
    then = np.array(gaps[:3])
    now = np.array([(1 + gaps[s]) * (1 + moved[s][0]) / (1 + moved[s][1]) - 1
                    for s in range(3)])
    change = now - then
    runs = np.array([m for s in range(3) for m in moved[s]])
    part = change.std(ddof=1) / np.sqrt(2)
    spread = np.std(gaps, ddof=1)
    summary = text.splitlines()[-1]
    assert summary == (
        f"paper: 3 pairs trained again; the gap moved by {change.mean() * 100:+.2f} pp on "
        f"average (sd {change.std(ddof=1) * 100:.2f} pp), each run's final loss by "
        f"{np.sqrt(np.mean(runs ** 2)) * 100:.2f}% (root mean square); committed and "
        f"replayed gaps correlate {np.corrcoef(then, now)[0, 1]:.2f}; a gap's part from its "
        f"runs' summation order, sd {part * 100:.2f} pp, would be {(part / spread) ** 2:.0%} "
        f"of the spread of the 6 committed gaps (sd {spread * 100:.2f} pp).")
    assert study_report.replay_comparison(committed, {"paper": again["paper"]}) == ""
    # Wired into the report: the section appears with a replay folder and not without.
    res, rep = tmp_path / "results", tmp_path / "replays" / "fake"
    for folder, variants in ((res, committed), (rep, again)):
        folder.mkdir(parents=True)
        for runs_of in variants.values():
            for r in runs_of.values():
                (folder / f"{r['unit']}.json").write_text(json.dumps(r))
    kwargs = {"doc": tmp_path / "STUDY.md", "figures": tmp_path / "fig", "command": "report"}
    with_replays = study_report.write_report([spec], {"fake": res}, replays={"fake": rep},
                                             **kwargs)
    assert "Pairs trained again in a seed batch of another size" in with_replays
    assert summary in with_replays
    assert "trained again" not in study_report.write_report([spec], {"fake": res}, **kwargs)


def test_gap_table_marks_a_tail_variants_step_time_that_holds_the_switchs_compilation():
    """A BF16-forward-tail variant's ms/step is marked where its runs did not time the
    tail's first step apart (results from before `train_llama.ModeSwitches`), and not
    where they did; a variant without the tail is never marked."""
    spec = study_specs.STUDIES["pure_llama"]
    runs = {v: {s: _fake_result(spec, v, s, 1.0 + s / 100) for s in (0, 1)}
            for v in ("bf16", "paper", "paper_tail")}

    def row(variants, name):
        table = study_report.gap_table(spec, variants, "python")
        return next(ln for ln in table.splitlines() if ln.startswith(f"| {name} |"))

    assert "with the tail's compilation" in row(runs, "paper_tail")
    assert "with the tail's compilation" not in row(runs, "paper")
    for r in runs["paper_tail"].values():
        r["segments"][0]["mode_switch_s"] = 30.0
    assert "with the tail's compilation" not in row(runs, "paper_tail")


def _py(body_doc, extra=""):
    licence = "# Copyright the authors.\n# Licensed under the same licence as everything.\n"
    return f'{licence}"""{body_doc}"""\n\nimport os\n\n\ndef f(x):\n{extra}    return x\n'


def test_prose_corpus_keeps_prose_drops_code_and_repeated_blocks(tmp_path):
    """The prose corpus holds the docstrings and comment runs, not the code; a block seen
    in another file (the licence header) appears once; the split is by content hash, so
    the same files under other names and folders give the same streams."""
    src = tmp_path / "a"
    (src / "pkg").mkdir(parents=True)
    for i in range(30):
        extra = f"    # step {i}: add nothing to the value\n" if i % 2 else ""
        (src / "pkg" / f"m{i}.py").write_text(_py(f"Module {i} does thing number {i}.", extra))
    c = data.load_corpus([str(src)], val_fraction=0.25, prose=True)
    text = bytes(c.train).decode() + "\0" + bytes(c.val).decode()
    assert c.prose and "prose of the files" in c.describe()
    assert text.count("Licensed under the same licence") == 1
    assert "import os" not in text and "return x" not in text and "def f" not in text
    assert all(f"Module {i} does thing number {i}." in text for i in range(30))
    assert "step 7: add nothing to the value" in text
    assert c.files_train + c.files_val == 30
    shutil.copytree(src, tmp_path / "b" / "other" / "names")
    c2 = data.load_corpus([str(tmp_path / "b")], val_fraction=0.25, prose=True)
    assert np.array_equal(c.train, c2.train) and np.array_equal(c.val, c2.val)
    plain = data.load_corpus([str(src)], val_fraction=0.25)
    assert b"import os" in bytes(plain.train) + bytes(plain.val)


def _prose_blocks_by_line_anchors(source: bytes, min_words: int = 3) -> list[bytes]:
    """An independent transcription of `data.prose_blocks`: comment runs anchored with
    ``(?m)^``, either quote by a backreference, one scan trying every byte (the rule the
    study's prose corpus was first built with)."""
    scan = re.compile(rb'("""|\'\'\')(.*?)\1|(?m:(?:^[ \t]*#[^\n]*(?:\n|\Z))+)', re.S)
    out = []
    for m in scan.finditer(source):
        if m.group(1):
            text = m.group(2)
        else:
            text = re.sub(rb"(?m)^[ \t]*#[ \t]?", b"", m.group(0))
        text = b"\n".join(line.strip() for line in text.splitlines()).strip()
        if len(text.split()) >= min_words:
            out.append(text)
    return out


@hypothesis.given(st.lists(st.sampled_from(
    [b'"""', b"'''", b'"', b"'", b"#", b"# ", b"\n", b"\r\n", b" ", b"\t", b"x = 1",
     b"word", b"two words", b"\\", b"a b c"]), max_size=40))
def test_prose_blocks_equal_the_line_anchored_scan(pieces):
    """The fast scan finds exactly the blocks of the line-anchored one on any mix of
    quotes, comment marks, newlines and words: the prose corpus the study trained on is
    unchanged (a source's first line included)."""
    source = b"".join(pieces)
    assert data.prose_blocks(source) == _prose_blocks_by_line_anchors(source)
    assert data.prose_blocks(source, min_words=1) == _prose_blocks_by_line_anchors(source, 1)


def test_docstring_examples_of_the_study_modules_run():
    import seed_batch  # noqa: PLC0415

    for mod in (study_specs, unit_records, unit_runs, study_handoff, study_stats,
                study_results, study_report, handoff, seed_batch, batch_plans):
        failed, tried = doctest.testmod(mod, verbose=False)
        assert tried > 0 and failed == 0, mod.__name__
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for t in finder.find(data.prose_blocks, "prose_blocks", globs=dict(vars(data))):
        runner.run(t)
    assert runner.failures == 0 and runner.tries > 0


def test_a_trainer_reused_for_another_seed_trains_as_a_fresh_one_without_recompiling(
        tmp_path):
    """`Trainer.for_run` with seed 1 on a seed-0 trainer: the unit's parameters after 2
    steps equal a fresh seed-1 trainer's bitwise, its step is not traced again, and a
    change to a compiled field (the learning rate) is refused."""
    seed0, seed1 = (study_specs.Unit("python", 0.003, "bf16", s) for s in (0, 1))
    corpus = _corpus()
    first = train_llama.Trainer(TINY.model_config(), TINY.run_config(seed0), 8)
    unit_runs.run_unit(TINY, seed0, tmp_path / "a", corpus, trainer=first, stop_at=2)
    traced = first.step.jitted._cache_size()
    reused = first.for_run(TINY.run_config(seed1))
    got = unit_runs.run_unit(TINY, seed1, tmp_path / "b", corpus, trainer=reused, stop_at=2)
    assert reused.step.jitted._cache_size() == traced
    fresh = train_llama.Trainer(TINY.model_config(), TINY.run_config(seed1), 8)
    want = unit_runs.run_unit(TINY, seed1, tmp_path / "c", corpus, trainer=fresh, stop_at=2)
    a, b = _leaves(got.state.params), _leaves(want.state.params)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(
        _leaves(reused.params0), _leaves(first.params0), strict=True))  # seed 1's own init
    with pytest.raises(ValueError, match="lr"):
        first.for_run(dataclasses.replace(TINY.run_config(seed1), lr=1e-3))


def test_seeds_for_half_width_is_the_fewest_that_reach_the_target():
    """The returned n meets the half-width target and n - 1 does not; a zero sd needs two
    seeds."""
    def half(n, sd):
        return study_stats.t_critical(n - 1) * sd / math.sqrt(n)

    for sd in (0.001, 0.004, 0.0103, 0.02):
        n = study_stats.seeds_for_half_width(sd, 0.003)
        assert half(n, sd) <= 0.003 and (n == 2 or half(n - 1, sd) > 0.003), (sd, n)
    assert study_stats.seeds_for_half_width(0.0, 0.003) == 2
    with pytest.raises(ValueError, match="target"):
        study_stats.seeds_for_half_width(0.01, 0.0)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.floats(-0.05, 0.05), min_size=2, max_size=40),
                  st.sampled_from((0.001, 0.003, 0.01)))
def test_stein_seeds_is_the_fewest_count_whose_first_stage_interval_reaches_the_target(
        stage_one, target):
    """The count is at least the first stage's, its two-stage half-width t(n₁-1) · s₁ / √N
    is within the target, and one seed fewer (above the first stage) is not."""
    n1 = len(stage_one)
    s1 = float(np.std(stage_one, ddof=1))

    def half(n):
        return study_stats.t_critical(n1 - 1) * s1 / math.sqrt(n)

    n = study_stats.stein_seeds(stage_one, target)
    assert n >= n1 and half(n) <= target * (1 + 1e-9)
    assert n == n1 or half(n - 1) > target


def test_stein_interval_keeps_the_first_stage_sd_and_is_the_t_interval_without_a_second():
    """The half-width is t(n₁-1) · s₁ / √n with the first stage's sd however the later
    values spread, the mean is over all values, and with no second stage it equals
    `mean_interval`; a first stage of one value or beyond the values is a ValueError."""
    first, later = [0.030, 0.031, 0.032], [0.050, -0.020]
    iv = study_stats.stein_interval(first + later, first_stage=3)
    assert iv.n == 5 and iv.mean == pytest.approx(np.mean(first + later))
    assert iv.sd == pytest.approx(0.001) and iv.half_width == pytest.approx(
        study_stats.t_critical(2) * 0.001 / math.sqrt(5))
    alone, plain = study_stats.stein_interval(first, 3), study_stats.mean_interval(first)
    assert (alone.mean, alone.half_width, alone.n) == pytest.approx(
        (plain.mean, plain.half_width, plain.n))
    for bad in (1, 6, 3.0):
        with pytest.raises(ValueError, match="first_stage"):
            study_stats.stein_interval(first + later, bad)
    with pytest.raises(ValueError, match="two or more first-stage values"):
        study_stats.stein_seeds([0.01], 0.003)


def test_stein_two_stage_interval_covers_the_mean_95_percent_of_the_time():
    """Over 4000 simulated studies of normal gaps (first stage of 8, target ±0.5 sd), the
    two-stage interval on the count its first stage fixes covers the true mean 95% of the
    time (binomial sd 0.34 pp) and never exceeds the target width."""
    rng = np.random.default_rng(12)
    hits, mean, sd, target = 0, 0.02, 0.01, 0.005
    for _ in range(4000):
        first = rng.normal(mean, sd, 8)
        n = study_stats.stein_seeds(first, target)
        values = np.concatenate([first, rng.normal(mean, sd, n - 8)])
        iv = study_stats.stein_interval(values, 8)
        assert iv.half_width <= target * (1 + 1e-9)
        hits += abs(iv.mean - mean) <= iv.half_width
    assert abs(hits / 4000 - 0.95) < 0.012, hits


def test_each_committed_first_stage_fixes_the_pairs_its_study_plans():
    """Every study naming a first stage plans, on that corpus, the pairs Stein's rule
    fixes from the committed results of its first stage (all of them in), so an edit of
    the plan or of those results that breaks the rule fails here."""
    checked = 0
    for spec in study_specs.STUDIES.values():
        groups = study_results.by_group(study_results.load_results(
            spec, Path(REPO) / "studies" / "results" / spec.name))
        for corpus, n1 in spec.stage_one:
            gaps = study_results.paired_gaps(groups[(corpus, spec.tokens_per_param[0])])
            first = [gaps["paper"][s] for s in sorted(gaps["paper"])[:n1]]
            assert len(first) == n1 and sorted(gaps["paper"])[:n1] == list(range(n1))
            planned = set(spec.seeds_of(corpus, "bf16")) & set(spec.seeds_of(corpus, "paper"))
            assert study_stats.stein_seeds(first, study_stats.WIDE_PP / 100) == len(planned)
            checked += 1
    assert checked == 1  # pure_llama's prose pairs


def test_a_study_with_a_first_stage_reports_its_two_stage_interval_and_the_count_it_fixes():
    """Where a spec names a first stage on a corpus, the goals give the count its sd fixes,
    say where the plan holds another, and the two-stage interval over every pair (the
    first stage's sd), which the headline table adds once pairs beyond the first stage
    are in; a first stage not all in gives neither. A first stage on a corpus the study
    does not run, of one seed, beyond the planned seeds or named twice is a ValueError."""
    base = study_specs.STUDIES["hybrid"]
    seeds = (0, 1, 2, 3)
    spec = dataclasses.replace(base, name="stein", seeds=seeds, variants=("bf16", "paper"),
                               stage_one=(("python", 3),))
    gaps = {0: 0.030, 1: 0.031, 2: 0.032, 3: 0.050}
    bf16 = {**BF16_VALS, 3: 2.01}

    def results(upto):
        return {"stein": [r for sd in seeds[:upto] for r in (
            _fake_result(spec, "bf16", sd, bf16[sd]),
            _fake_result(spec, "paper", sd, bf16[sd] * (1 + gaps[sd])))]}

    # First stage 3.0/3.1/3.2%: sd 0.1 pp, (t(2) · 0.1 / 0.3)² = 2.06, so three pairs.
    text = study_report.goals_section([spec], results(4))
    line = next(ln for ln in text.splitlines() if "two-stage" in ln)
    iv = study_stats.stein_interval([gaps[s] for s in seeds], 3)
    assert line == (
        "  - stein, python, 10 tokens/param, two-stage (Stein): the first 3 seeds' sd "
        "0.10 pp fixes 3 seeds (t(2) · sd / √3 <= 0.3 pp); **the plan holds 4 pairs, not "
        f"3**; over 4: +{iv.mean * 100:.2f}% [+{(iv.mean - iv.half_width) * 100:.2f}%, "
        f"+{(iv.mean + iv.half_width) * 100:.2f}%], ±{iv.half_width * 100:.2f} pp with the "
        "first stage's sd: narrower")
    row = next(ln for ln in study_report.headline_table([spec], results(4)).splitlines()
               if "| paper |" in ln)
    assert "**too wide**; two-stage (3 → 3 seeds): [" in row and row.endswith("| 4 |")
    three = study_report.headline_table([spec], results(3))
    assert "two-stage" not in three
    assert "two-stage" not in study_report.goals_section([spec], results(2))
    for bad, match in (((("prose", 3),), "not one of this study's corpora"),
                       ((("python", 1),), "int from 2 to the 4 seeds"),
                       ((("python", 5),), "int from 2 to the 4 seeds"),
                       ((("python", 2), ("python", 3)), "names a corpus twice")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(spec, stage_one=bad)


def test_the_goals_compare_the_pairs_beyond_a_first_stage_with_it():
    """With two or more pairs beyond a first stage, the goals give the later pairs' mean
    gap less the first stage's with its Welch interval and say which way it resolves (or
    that it does not); with fewer later pairs, or no first stage, there is no such line."""
    seeds = tuple(range(8))
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="stages", seeds=seeds,
                               variants=("bf16", "paper"), stage_one=(("python", 4),))

    def results(gaps):
        return {"stages": [r for sd, g in gaps.items() for r in (
            _fake_result(spec, "bf16", sd, 2.0), _fake_result(spec, "paper", sd, 2.0 * (1 + g)))]}

    def line(gaps, which=spec):
        found = [ln for ln in study_report.goals_section([which], results(gaps)).splitlines()
                 if "beyond the first stage" in ln]
        return found[0] if found else None

    first = {0: 0.020, 1: 0.021, 2: 0.019, 3: 0.020}
    higher = {**first, 4: 0.040, 5: 0.041, 6: 0.039, 7: 0.040}
    d = study_stats.difference_interval(list(first.values()), [0.040, 0.041, 0.039, 0.040])
    assert line(higher) == (
        "  - stages, python, 10 tokens/param, the pairs beyond the first stage against its "
        f"4: {d.mean * 100:+.2f} pp [{(d.mean - d.half_width) * 100:+.2f}, "
        f"{(d.mean + d.half_width) * 100:+.2f}] pp (Welch): the later pairs' gaps ran higher")
    lower = {**first, 4: 0.0, 5: 0.001, 6: -0.001, 7: 0.0}
    assert line(lower).endswith(": the later pairs' gaps ran lower")
    alike = {**first, 4: 0.030, 5: 0.010, 6: 0.025, 7: 0.015}
    assert line(alike).endswith(": no difference resolved")
    assert line({**first, 4: 0.04}) is None
    assert line(higher, dataclasses.replace(spec, stage_one=())) is None


def test_gap_along_training_pairs_seeds_at_each_evaluation_step():
    """Each column is the paired gap at one evaluation step (mean ± sd over seeds), and the
    last column is the seed count the final step's sd needs; a variant with one paired seed
    has no row."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake")
    variants = {"bf16": {s: _fake_result(spec, "bf16", s, BF16_VALS[s]) for s in SEEDS},
                "paper": {s: _fake_result(spec, "paper", s, BF16_VALS[s] * (1 + GAPS["paper"][s]))
                          for s in SEEDS},
                "no_sr": {0: _fake_result(spec, "no_sr", 0, 2.1)}}
    table = study_report.gap_along_training(variants)
    head, _, row, *rest = table.splitlines()
    assert "step 50" in head and "step 100" in head and not rest
    mid = study_stats.mean_interval(
        [(BF16_VALS[s] * (1 + GAPS["paper"][s]) + 0.5) / (BF16_VALS[s] + 0.5) - 1 for s in SEEDS])
    end = study_stats.mean_interval(list(GAPS["paper"].values()))
    need = study_stats.seeds_for_half_width(end.sd, study_stats.WIDE_PP / 100)
    assert row == (f"| paper (n=3) | {mid.mean * 100:+.2f}% ± {mid.sd * 100:.2f} | "
                   f"{end.mean * 100:+.2f}% ± {end.sd * 100:.2f} | {need} |")
    assert study_report.gap_along_training({"bf16": variants["bf16"]}) == ""


def test_against_full_recipe_pairs_each_variant_with_the_paper_recipe_by_seed():
    """Each row is the variant's loss over the full recipe's on the seeds both finished,
    with the interval's verdict; BF16, the full recipe itself and a variant with one
    shared seed have no row."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake",
                               variants=("bf16", "paper", "no_sr", "no_2d", "no_rht"))
    paper = {0: 2.00, 1: 2.10, 2: 1.90, 3: 2.05}
    variants = {"bf16": {s: _fake_result(spec, "bf16", s, 1.9) for s in paper},
                "paper": {s: _fake_result(spec, "paper", s, v) for s, v in paper.items()},
                "no_sr": {s: _fake_result(spec, "no_sr", s, paper[s] * (1 + d))
                          for s, d in {0: 0.010, 1: 0.012, 2: 0.011}.items()},
                "no_2d": {s: _fake_result(spec, "no_2d", s, paper[s] * (1 + d))
                          for s, d in {1: -0.02, 2: 0.03, 3: 0.001}.items()},
                "no_rht": {0: _fake_result(spec, "no_rht", 0, 1.0)}}
    table = study_report.against_full_recipe(spec, variants, "python")
    head, _, *rows = table.splitlines()
    assert [r.split("|")[1].strip() for r in rows] == ["no_sr", "no_2d"]
    iv = study_stats.mean_interval([0.010, 0.012, 0.011])
    assert rows[0] == (f"| no_sr | 0,1,2 | {iv.mean * 100:+.2f}% | "
                       f"[{(iv.mean - iv.half_width) * 100:+.2f}%, "
                       f"{(iv.mean + iv.half_width) * 100:+.2f}%] | worse than the full recipe "
                       "| — |")
    assert rows[1].startswith("| no_2d | 1,2,3 |") and rows[1].endswith("| not resolved | — |")
    better = {"bf16": variants["bf16"], "paper": variants["paper"],
              "no_sr": {s: _fake_result(spec, "no_sr", s, paper[s] * 0.98) for s in (0, 1)}}
    assert study_report.against_full_recipe(spec, better, "python").endswith(
        "| better than the full recipe | — |")
    # A late switch: the runs equal the full recipe's at the first evaluation on both
    # seeds; one of them also at the last (the column is the earliest over the seeds).
    tail = {s: _fake_result(spec, "no_sr", s, paper[s] * 0.99) for s in (0, 1)}
    for s in (0, 1):
        tail[s]["val_curve"][0] = list(variants["paper"][s]["val_curve"][0])
    tail[1]["val_curve"][1] = list(variants["paper"][1]["val_curve"][1])
    assert study_report.against_full_recipe(spec, {**better, "no_sr": tail}, "python"
                                            ).endswith("| better than the full recipe | step 50 |")
    assert study_report.against_full_recipe(spec, {"bf16": variants["bf16"]}, "python") == ""


def test_gap_spread_sources_compares_each_seeds_late_gap_range_with_the_seed_spread():
    """Per seed, the min and max of its paired gap over the evaluations from 75% of the run
    on (earlier ones left out), the mean of those ranges, and the sd of the final gaps; a
    variant with one paired seed has no row. The correlation of the gap half-way with the
    final gap needs `MIN_SEEDS_FOR_CORRELATION` seeds: it reads the evaluation nearest
    half the run (1 where the half-way gaps are the final ones shifted, -1 where they are
    mirrored)."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake")
    late = {0: (0.010, 0.012), 1: (0.040, 0.039), 2: (0.020, 0.025)}  # gaps at steps 75, 100

    def with_curve(variant, seed, vals):
        r = _fake_result(spec, variant, seed, vals[-1])
        r["val_curve"] = [[t, t * 32768, v] for t, v in zip((25, 50, 75, 100), vals)]
        return r

    variants = {"bf16": {s: with_curve("bf16", s, [3.0, 2.5, 2.2, 2.0]) for s in SEEDS},
                "paper": {s: with_curve("paper", s, [3.3, 3.0, 2.2 * (1 + late[s][0]),
                                                     2.0 * (1 + late[s][1])]) for s in SEEDS},
                "no_sr": {0: with_curve("no_sr", 0, [3.0, 2.5, 2.2, 2.1])}}
    table = study_report.gap_spread_sources(variants)
    head, _, row, *rest = table.splitlines()
    assert "from 75% of the run on" in head and not rest
    bands = ", ".join(f"s{s} {min(g) * 100:+.2f}% .. {max(g) * 100:+.2f}%" for s, g in late.items())
    within = sum(max(g) - min(g) for g in late.values()) / 3
    between = study_stats.mean_interval([g[1] for g in late.values()]).sd
    assert row == (f"| paper (n=3) | {bands} | {within * 100:.2f} pp | {between * 100:.2f} pp "
                   "| — |")
    assert study_report.gap_spread_sources({"bf16": variants["bf16"]}) == ""
    n = study_report.MIN_SEEDS_FOR_CORRELATION
    finals = [0.01 * (s + 1) for s in range(n)]
    for sign, want in ((1, "1.00"), (-1, "-1.00")):
        many = {"bf16": {s: with_curve("bf16", s, [3.0, 2.5, 2.2, 2.0]) for s in range(n)},
                "paper": {s: with_curve("paper", s, [3.3, 2.5 * (1 + 0.02 + sign * finals[s]),
                                                     2.2, 2.0 * (1 + finals[s])])
                          for s in range(n)}}
        assert study_report.gap_spread_sources(many).splitlines()[2].endswith(f"| {want} |")


def test_pairing_gain_shows_a_shared_seed_effect_cancelled_and_an_unshared_one_kept():
    """A variant that moves with BF16 over seeds (its runs a fixed fraction worse) has
    correlation 1 and a paired gap sd of 0 beside the unpaired sd of both sides' spreads;
    one whose values do not follow BF16's has a paired sd near the unpaired one. Each
    side's sd is relative to its mean. Fewer than `MIN_SEEDS_FOR_CORRELATION` paired
    seeds give no row."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake")
    n = study_report.MIN_SEEDS_FOR_CORRELATION + 3
    rng = np.random.default_rng(3)
    b = 1.5 + rng.normal(0.0, 0.03, n)
    loose = 1.53 + rng.normal(0.0, 0.03, n)
    variants = {"bf16": {s: _fake_result(spec, "bf16", s, b[s]) for s in range(n)},
                "paper": {s: _fake_result(spec, "paper", s, b[s] * 1.02) for s in range(n)},
                "no_sr": {s: _fake_result(spec, "no_sr", s, loose[s]) for s in range(n)},
                "no_2d": {s: _fake_result(spec, "no_2d", s, 1.6) for s in range(n - 4)}}
    head, _, tied, free, *rest = study_report.pairing_gain(variants).splitlines()
    assert not rest and "correlation" in head
    cv_b = b.std(ddof=1) / b.mean()
    assert tied == (f"| paper (n={n}) | {cv_b * 100:.2f}% | {cv_b * 100:.2f}% | 1.00 | 0.00 pp | "
                    f"{np.sqrt(2) * cv_b * 100:.2f} pp |")
    cells = free.split(" | ")
    gap_sd = np.std(loose / b - 1, ddof=1)
    corr = np.corrcoef(b, loose)[0, 1]
    assert cells[3] == f"{corr:.2f}" and cells[4] == f"{gap_sd * 100:.2f} pp"
    assert abs(corr) < 0.8 and gap_sd > 0.5 * float(cells[5].split()[0]) / 100
    assert study_report.pairing_gain({"bf16": variants["bf16"],
                                      "no_2d": variants["no_2d"]}) == ""


def test_clustered_interval_is_the_independent_one_for_singletons_and_widens_for_shared_shifts():
    """With every value its own cluster the cluster-robust interval is `mean_interval`'s;
    an offset shared within clusters (larger than the spread inside them) widens it, and
    the clusters' names and order do not matter. One cluster has no interval; a cluster
    list of another length is refused."""
    rng = np.random.default_rng(0)
    for n in (2, 5, 44):
        x = rng.normal(0.02, 0.01, n)
        got, want = study_stats.clustered_interval(x, list(range(n))), study_stats.mean_interval(x)
        assert got.mean == pytest.approx(want.mean, abs=1e-15)
        assert got.half_width == pytest.approx(want.half_width, rel=1e-12)
    labels = np.repeat(np.arange(6), 3)
    x = 0.02 + rng.normal(0.0, 0.01, 6)[labels] + rng.normal(0.0, 0.001, labels.size)
    shared = study_stats.clustered_interval(x, labels.tolist())
    assert shared.half_width > 2 * study_stats.mean_interval(x).half_width
    renamed = study_stats.clustered_interval(x, [f"b{9 - c}" for c in labels])
    assert renamed.half_width == pytest.approx(shared.half_width, rel=1e-12)
    assert study_stats.clustered_interval(x, [0] * x.size).half_width is None
    with pytest.raises(ValueError, match="one cluster per value"):
        study_stats.clustered_interval(x, [0, 1])


def test_cluster_permutation_p_is_uniform_without_clusters_and_small_with_shared_offsets():
    """Exchangeable values (no cluster shares anything) reject at 5% about 5% of the time,
    whatever their distribution (a heavy-tailed one here); offsets shared within clusters
    give a small p-value and a ratio above 1. Renaming clusters changes nothing, the same
    seed gives the same p, and bad input is refused by name."""
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(8), 4).tolist()
    ps = np.array([study_stats.cluster_permutation_p(rng.standard_t(3, 32), labels,
                                                     draws=499, seed=i)
                   for i in range(300)])
    # 300 tests at 5%: 15 expected; binomial 99.9% bounds are about 4 to 29.
    assert 4 <= np.sum(ps <= 0.05) <= 29
    assert 0.4 < np.median(ps) < 0.6
    x = rng.normal(0.0, 0.001, 32) + rng.normal(0.0, 0.01, 8)[np.array(labels)]
    assert study_stats.cluster_se_ratio(x, labels) > 1.5
    p = study_stats.cluster_permutation_p(x, labels, draws=999)
    assert p == pytest.approx(1 / 1000)  # no random deal reaches the observed ratio
    renamed = [f"b{9 - c}" for c in labels]
    assert study_stats.cluster_permutation_p(x, renamed, draws=999) == p
    assert (study_stats.cluster_permutation_p(x[::-1].copy(), labels[::-1], draws=999, seed=5)
            == study_stats.cluster_permutation_p(x[::-1].copy(), labels[::-1], draws=999,
                                                 seed=5))
    with pytest.raises(ValueError, match="one cluster per value"):
        study_stats.cluster_permutation_p(x, labels[:-1])
    with pytest.raises(ValueError, match="two or more clusters"):
        study_stats.cluster_permutation_p(x, [0] * x.size)
    with pytest.raises(ValueError, match="draws"):
        study_stats.cluster_permutation_p(x, labels, draws=0)
    with pytest.raises(ValueError, match="all equal"):
        study_stats.cluster_se_ratio([1.0] * 4, [0, 0, 1, 1])


def test_batch_independence_reads_the_batches_of_both_runs_of_each_pair():
    """Seeds are clustered by the batches of the variant's run and of BF16's (a chain of
    shared batches links them); a variant whose batches differ by more than their seeds
    gets a ratio of standard errors above 1 and a small permutation p, and the recipe
    whose batches shifted its runs shows it in its own losses' column; one whose runs all
    trained apart, or whose seeds span fewer than `MIN_BATCH_CLUSTERS` clusters, has no
    row."""
    spec = dataclasses.replace(study_specs.STUDIES["hybrid"], name="fake")
    batches = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    offset = {0: 0.00, 1: 0.03, 2: 0.01, 3: 0.04}  # each batch's shared gap
    noise = [0.001, -0.001, 0.0]

    def run(variant, seed, val, seeds):
        r = _fake_result(spec, variant, seed, val)
        r["seed_batch"] = {"seeds": list(seeds)}
        return r

    bf16 = {s: run("bf16", s, 2.0, b) for b in batches for s in b}
    paper = {s: run("paper", s, 2.0 * (1.02 + offset[i] + noise[j]), b)
             for i, b in enumerate(batches) for j, s in enumerate(b)}
    table = study_report.batch_independence({"bf16": bf16, "paper": paper})
    head, _, row, *rest = table.splitlines()
    assert "clusters as draws" in head and row.startswith("| paper | 12 | ") and not rest
    cell = dict(zip((c.strip() for c in head.split("|")), (c.strip() for c in row.split("|"))))
    assert float(cell["ratio of standard errors"]) > 1.5 and float(cell["permutation p"]) < 0.05
    # The shift is the paper batches' own: their losses cluster; BF16's (all equal) cannot.
    own_ratio, own_p = re.fullmatch(r"([\d.]+) \(p ([\d.]+)\)",
                                    cell["the variant's losses by its batches"]).groups()
    assert float(own_ratio) > 1.5 and float(own_p) < 0.05
    assert cell["BF16's losses by BF16's batches"] == "—"
    # Shifted BF16 batches instead: BF16's column clusters, the variant's has nothing to show.
    shifted = {s: run("bf16", s, 2.0 / (1.02 + offset[i] + noise[j]), b)
               for i, b in enumerate(batches) for j, s in enumerate(b)}
    flat = {s: run("paper", s, 2.0, b) for b in batches for s in b}
    head, _, row = study_report.batch_independence({"bf16": shifted, "paper": flat}).splitlines()
    cell = dict(zip((c.strip() for c in head.split("|")), (c.strip() for c in row.split("|"))))
    assert float(cell["BF16's losses by BF16's batches"].split()[0]) > 1.5
    assert cell["the variant's losses by its batches"] == "—"
    # The same gaps from runs that all trained apart: nothing shared, no row.
    apart = {v: {s: run(v, s, r["final_val_bpb"], (s,)) for s, r in runs.items()}
             for v, runs in (("bf16", bf16), ("paper", paper))}
    assert study_report.batch_independence(apart) == ""
    # BF16 batched across two of paper's batches: three clusters, too few to read.
    merged = {s: run("bf16", s, 2.0, tuple(range(6)) if s < 6 else b)
              for b in batches for s in b}
    want = {s: min(b) for b in ((0, 1, 2, 3, 4, 5), (6, 7, 8), (9, 10, 11)) for s in b}
    assert study_results.batch_clusters(paper, merged) == want
    assert study_report.batch_independence({"bf16": merged, "paper": paper}) == ""


@pytest.mark.fresh_compilation
def test_a_later_seed_batch_runs_on_the_earlier_ones_programs_and_diagnostics_change_no_bit(
        tmp_path):
    """Two seed batches of one variant, length and size in one call: the second compiles
    nothing (no XLA backend compilation: its step, diagnostics step and validation
    passes are the first's), and it trains its seeds bit for bit as the same seeds train
    on programs of their own without sampling diagnostics: neither the reuse nor the
    sampling (a read-only pass) changes training. (A seed that sampled diagnostics on the
    H200, long_data's seed 3 at 10 tokens/param, ended with a gap near zero; this rules
    out the sampling as its cause.) A seed trained beside another partner, at the same
    place in the batch, repeats its run bit for bit: seeds in a batch are independent."""
    import seed_batch  # noqa: PLC0415

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3), diag_samples=2, diag_seeds=(1, 3))
    units = [study_specs.Unit("python", 0.003, "down_only", s) for s in range(4)]
    corpus = _corpus()
    programs = seed_batch.BatchPrograms()
    first = seed_batch.run_seed_batch(spec, units[:2], tmp_path / "call", corpus,
                                      programs=programs)
    compiled = []

    def on_duration(event, _secs, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        second = seed_batch.run_seed_batch(spec, units[2:], tmp_path / "call", corpus,
                                           programs=programs)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert compiled == []
    assert [r["seed_batch"]["reused_programs"] for r in second] == [True, True]
    assert [len(r["diagnostics"]) for r in second] == [0, 2]
    plain = dataclasses.replace(spec, diag_samples=0)
    alone = seed_batch.run_seed_batch(plain, units[2:], tmp_path / "alone", corpus)
    assert [r["seed_batch"]["reused_programs"] for r in alone] == [False, False]
    assert [len(r["diagnostics"]) for r in alone] == [0, 0]
    for reused, own in zip(second, alone, strict=True):
        for key in ("train_curve", "val_curve", "final_val_bpb"):
            assert reused[key] == own[key], (own["seed"], key)
    # Seed 0 beside seed 3 instead of seed 1, at the same place in the batch: its run does
    # not depend on the seed it trains beside.
    beside = seed_batch.run_seed_batch(spec, [units[0], units[3]], tmp_path / "beside",
                                       corpus, programs=programs)
    assert beside[0]["seed_batch"]["seeds"] == [0, 3] and first[0]["seed_batch"]["seeds"] == [0, 1]
    for key in ("train_curve", "val_curve", "final_val_bpb"):
        assert beside[0][key] == first[0][key], key


@pytest.mark.fresh_compilation  # counts persistent-cache hits: the suite's cache is off
def test_a_seed_batch_trains_each_seed_as_its_own_run(tmp_path, capsys):
    """Two seeds of an NVFP4 variant trained as one vmapped program: each seed's result
    has the unbatched run's steps, curve points and (up to the batched GEMMs' summation
    order) final loss; the seed that samples diagnostics has them at the unbatched run's
    steps and layers, with close values, and the other seed has none; the JSON records
    the batch; the report reads it; a finished unit is not batched again."""
    import seed_batch  # noqa: PLC0415

    spec = dataclasses.replace(TINY, seeds=(0, 1), diag_samples=2, diag_seeds=(1,))
    units = [study_specs.Unit("python", 0.003, "down_only", s) for s in (0, 1)]
    corpus = _corpus()
    batched = seed_batch.run_seed_batch(spec, units, tmp_path / "b", corpus, progress=True)
    printed = capsys.readouterr().out.splitlines()
    # Progress says where the batch's time beyond its training wall went, once.
    phases = [ln for ln in printed if ln.startswith("  batch outside its training wall: ")]
    assert len(phases) == 1 and re.search(
        r": \d+s setup .*, -?\d+s initialization .*, \d+s results ", phases[0]), phases
    # Progress prints both seeds' validation at the evaluation that shares its step with
    # a diagnostics sample.
    progress = [ln for ln in printed if "val bpb" in ln]
    assert len(progress) == 1 and progress[0].startswith("  step 4/8: val bpb ")
    assert len(progress[0].split("val bpb ")[1].split()) == 2
    for unit, r in zip(units, batched, strict=True):
        single = unit_runs.run_unit(spec, unit, tmp_path / "s", corpus).result
        assert r["seed_batch"]["seeds"] == [0, 1] and r["seed"] == unit.seed
        assert r["seed_batch"]["compile_cache_hits"] == 0  # no persistent cache here
        assert [p[0] for p in r["val_curve"]] == [p[0] for p in single["val_curve"]] == [4, 8]
        assert [p[0] for p in r["train_curve"]] == [p[0] for p in single["train_curve"]]
        assert r["quantized_layers"] == single["quantized_layers"] == 1
        assert math.isclose(r["final_val_bpb"], single["final_val_bpb"], rel_tol=1e-4), (
            r["final_val_bpb"], single["final_val_bpb"])
        assert [d["step"] for d in r["diagnostics"]] == [
            d["step"] for d in single["diagnostics"]] == ([4, 8] if unit.seed == 1 else [])
        if unit.seed == 1:
            got, want = r["diagnostics"][-1]["per_layer"], single["diagnostics"][-1]["per_layer"]
            assert list(got) == list(want) and len(got) == 1
            for layer, ops in want.items():
                for op, stats in ops.items():
                    assert got[layer][op] == pytest.approx(stats, rel=1e-3, abs=1e-6), (layer, op)
        written = unit_runs.result_path(tmp_path / "b", unit).read_text()
        assert json.loads(written) == json.loads(json.dumps(r))
    assert batched[0]["final_val_bpb"] != batched[1]["final_val_bpb"]  # two runs, not one
    assert batch_plans.batch_plan(spec, tmp_path / "b", 2, {"variant": {"down_only"}}) == []
    with pytest.raises(ValueError, match="already finished"):
        seed_batch.run_seed_batch(spec, units, tmp_path / "b", corpus)
    cfg = spec.run_config(units[1])  # seed 1 samples diagnostics
    with pytest.raises(ValueError, match="differ in diag_every"):
        seed_batch.SeedBatch(train_llama.Trainer(spec.model_config(), cfg, 8),
                             [cfg, dataclasses.replace(cfg, seed=5, diag_every=3)])
    with pytest.raises(ValueError, match="differ only in their seed"):
        seed_batch.run_seed_batch(spec, [units[0], study_specs.Unit("python", 0.003, "bf16", 1)],
                                  tmp_path / "c", corpus)


@pytest.mark.fresh_compilation
def test_a_seed_batchs_switch_to_the_bf16_forward_tail_is_timed_apart_from_its_steps(
        tmp_path):
    """A batch of a variant with the BF16-forward tail compiles the tail's step at its
    first tail step: that step's time is the batch's ``mode_switch_s`` (each unit's
    segment a share), not spread over its ``step_time_s``."""
    import seed_batch  # noqa: PLC0415

    # Every layer kept in BF16: the two modes' programs compile fast, and the switch
    # still compiles the second.
    tail = dataclasses.replace(DOWN_ONLY, name="down_tail", bf16_forward_tail=0.5,
                               keep_patterns=(r".*",))
    spec = dataclasses.replace(TINY, seeds=(0, 1), variants=("bf16", "down_tail"),
                               custom_variants=(tail,))
    units = [study_specs.Unit("python", 0.003, "down_tail", s) for s in (0, 1)]
    results = seed_batch.run_seed_batch(spec, units, tmp_path, _corpus())
    sb = results[0]["seed_batch"]
    assert sb["mode_switch_s"] > 10 * sb["step_time_s"] > 0
    assert results[0]["segments"][0]["mode_switch_s"] == pytest.approx(sb["mode_switch_s"] / 2)


def test_a_forked_bf16_forward_tail_is_bit_for_bit_the_tail_variants_own_batch(
        tmp_path, capsys, monkeypatch):
    """`run_seed_batches` trains a variant's batch and, as a fork from the state before
    the switch, its BF16-forward-tail variant on the same seeds; the tail units are not
    run again. Each forked unit equals the tail variant's own batch bit for bit (training
    and validation curves, final loss, the precision mode of every logged step), shares
    the batch's curves up to the switch, and records where it was forked from; its times
    are those of the steps after the switch."""
    import seed_batch  # noqa: PLC0415

    tail = dataclasses.replace(DOWN_ONLY, name="down_only_tail", bf16_forward_tail=0.5)
    spec = dataclasses.replace(TINY, seeds=(0, 1), custom_variants=(DOWN_ONLY, tail),
                               variants=("bf16", "down_only", "down_only_tail"))
    assert batch_plans.tail_variant(spec, "down_only", "python") == "down_only_tail"
    only = {"variant": {"down_only", "down_only_tail"}}
    monkeypatch.setattr(seed_batch.data_lib, "load_corpus", lambda **_: _corpus())
    done = seed_batch.run_seed_batches(spec, tmp_path / "fork", size=2, budget_s=1e9,
                                       only=only)
    out = capsys.readouterr().out
    assert out.count("seed batch") == 1 and "forking python-tpp0.003-down_only_tail-s0" in out
    assert out.count("finished: val bpb") == out.count("finished (forks): val bpb") == 1
    forked = {r["seed"]: r for r in done if r["variant"] == "down_only_tail"}
    main = {r["seed"]: r for r in done if r["variant"] == "down_only"}
    assert sorted(forked) == sorted(main) == [0, 1]
    units = [study_specs.Unit("python", 0.003, "down_only_tail", s) for s in (0, 1)]
    own = seed_batch.run_seed_batch(spec, units, tmp_path / "own", _corpus())
    for r in own:
        f = forked[r["seed"]]
        for key in ("train_curve", "val_curve", "final_val_bpb", "final_val_bpb_bf16_forward"):
            assert f.get(key) == r.get(key), (r["seed"], key)
        assert [p[3] for p in f["train_curve"]][-1] == "bf16_forward"
        assert f["forked_from"] == {"unit": main[r["seed"]]["unit"], "variant": "down_only",
                                    "step": 4}
        assert study_results.alike_through(f, main[r["seed"]]) == 4
        assert f["final_val_bpb"] != main[r["seed"]]["final_val_bpb"]
        assert f["segments"][0]["from"] == 4 and f["compile_s"] is None
        assert f["seed_batch"]["mode_switch_s"] > 0 and f["seed_batch"]["forked_from_step"] == 4
    table = study_report.gap_table(spec, study_results.by_group(done)[("python", 0.003)],
                                   "python")
    row = next(ln for ln in table.splitlines() if ln.startswith("| down_only_tail |"))
    assert "| — | — (2 forked from down_only's runs at step 4: " in row  # no own timing
    with pytest.raises(ValueError, match="tail variant of down_only"):
        seed_batch.run_seed_batch(spec, [study_specs.Unit("python", 0.003, "down_only", 5),
                                         study_specs.Unit("python", 0.003, "down_only", 6)],
                                  tmp_path / "bad", _corpus(), forks=units)


def _write_fake_batch(results, spec, variant, seeds, wall, *, compile_s=None, **fields):
    """Result files of a finished seed batch of ``seeds`` (Python, 10 tokens/param) whose
    ``seed_batch`` record holds ``wall`` and ``fields``, each unit ``compile_s`` if given
    (a test fixture, not a result)."""
    for s in seeds:
        r = _fake_result(spec, variant, s, 1.0)
        if compile_s is not None:
            r["compile_s"] = compile_s
        r["seed_batch"] = {"seeds": list(seeds), "train_wall_s": wall, **fields}
        unit_runs.write_json(unit_runs.result_path(
            results, study_specs.Unit("python", 10.0, variant, s)), r)


def test_batch_plan_groups_a_variants_unfinished_seeds():
    """Seeds of one (length, variant, corpus) in batches of the given size; a lone
    leftover is not batched; sizes below two are refused."""

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3, 4))
    plan = batch_plans.batch_plan(spec, "/nonexistent", 2)
    assert [[u.name for u in b] for b in plan] == [
        [f"python-tpp0.003-{v}-s{a}", f"python-tpp0.003-{v}-s{a + 1}"]
        for v in ("bf16", "down_only") for a in (0, 2)]
    only = batch_plans.batch_plan(spec, "/nonexistent", 3, {"variant": {"bf16"}})
    assert [[u.seed for u in b] for b in only] == [[0, 1, 2], [3, 4]]
    with pytest.raises(ValueError, match="two or more"):
        batch_plans.batch_plan(spec, "/nonexistent", 1)


def test_batch_wall_estimate_reads_the_finished_batches_conservatively(tmp_path):
    """A variant's own batch of as many seeds or more gives its time; a variant never
    timed gets the slowest batch of the length and seed count, or else the slowest of the
    length scaled to its seed count, times the margin, from batches of its kind (BF16 or
    NVFP4) only; nothing of its kind timed at the length gives None (the batch runs
    unestimated, as a call's first)."""

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3, 4), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "four_over_six", "no_sr"),
                               custom_variants=())

    def batch(variant, seeds, wall):
        _write_fake_batch(tmp_path, spec, variant, seeds, wall)

    def units(variant, seeds):
        return [study_specs.Unit("python", 10.0, variant, s) for s in seeds]

    assert batch_plans.batch_wall_estimate(spec, tmp_path, units("paper", (0, 1))) is None
    batch("bf16", (0, 1), 90.0)
    assert batch_plans.batch_wall_estimate(  # only BF16 timed: no guide to NVFP4
        spec, tmp_path, units("paper", (0, 1))) is None
    batch("paper", (0, 1, 2), 200.0)
    assert batch_plans.batch_wall_estimate(spec, tmp_path, units("paper", (3, 4))) == 200.0
    margin = batch_plans.UNTIMED_VARIANT_MARGIN
    assert batch_plans.batch_wall_estimate(
        spec, tmp_path, units("four_over_six", (0, 1, 2))) == pytest.approx(200.0 * margin)
    assert batch_plans.batch_wall_estimate(  # 4 seeds: the 3-seed batch scaled by 4/3
        spec, tmp_path, units("four_over_six", (0, 1, 2, 3))) == pytest.approx(
            200.0 * 4 / 3 * margin)
    batch("no_sr", (0, 1, 2, 3, 4), 400.0)  # slower, but of more seeds than asked
    assert batch_plans.batch_wall_estimate(
        spec, tmp_path, units("four_over_six", (0, 1, 2))) == pytest.approx(200.0 * margin)
    assert batch_plans.batch_wall_estimate(  # no 4-seed batch: the 5-seed one bounds it
        spec, tmp_path, units("four_over_six", (0, 1, 2, 3))) == pytest.approx(400.0 * margin)


def test_forks_follow_the_calls_restrictions_and_are_estimated_from_a_timed_fork(tmp_path):
    """A batch forks the tail variant's unfinished units on its seeds that the call's
    ``only`` allows (none where it excludes the tail variant, none for a variant without
    one). Untimed, a fork is estimated as the tail's share of the batch plus the longest
    precision switch recorded at the length; once a fork of as many seeds ran, by its
    wall time; and a forked unit is never taken for a whole batch of its variant."""
    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "paper_tail", "no_sr"),
                               custom_variants=())
    units = [study_specs.Unit("python", 10.0, "paper", s) for s in (0, 1, 2)]
    tails = [study_specs.Unit("python", 10.0, "paper_tail", s) for s in (0, 1, 2)]
    _write_fake_batch(tmp_path, spec, "paper_tail", (0,), 250.0, mode_switch_s=30.0)
    assert batch_plans.fork_units(spec, tmp_path, units) == tails[1:]
    assert batch_plans.fork_units(spec, tmp_path, units, {"variant": {"paper"}}) == []
    assert batch_plans.fork_units(
        spec, tmp_path, [study_specs.Unit("python", 10.0, "no_sr", s) for s in (0, 1)]) == []
    share = spec.variant("paper_tail").bf16_forward_tail
    assert batch_plans.fork_wall_estimate(spec, tmp_path, units, 200.0) == pytest.approx(
        share * 200.0 + 30.0)
    _write_fake_batch(tmp_path, spec, "paper_tail", (1, 2, 3), 70.0, forked_from_step=8)
    for s in (1, 2, 3):
        path = unit_runs.result_path(tmp_path, study_specs.Unit("python", 10.0, "paper_tail", s))
        r = json.loads(path.read_text())
        r["forked_from"] = {"unit": f"python-tpp10-paper-s{s}", "variant": "paper", "step": 8}
        unit_runs.write_json(path, r)
    assert batch_plans.fork_wall_estimate(spec, tmp_path, units, 200.0) == 70.0
    # The 1-seed batch scaled to two (its switch counted once), not the 70 s fork.
    assert batch_plans.batch_wall_estimate(spec, tmp_path, tails[:2]) == pytest.approx(
        (250.0 + 220.0) * batch_plans.MORE_SEEDS_MARGIN)


def test_a_larger_batch_of_a_timed_variant_scales_its_own_batch_without_the_compilation(
        tmp_path):
    """A variant's batch of more seeds than any of its own finished batches is its
    largest own batch with all but the compilation scaled to the seed count, times
    `MORE_SEEDS_MARGIN`: an own batch, not the slowest of its kind (a slower variant's
    time is no guide where its own is known), and the compilation counted once; without
    it where the batch runs on compiled programs. A batch of fewer seeds takes the own
    batch of the closest larger or equal size."""

    spec = dataclasses.replace(TINY, seeds=tuple(range(12)), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "four_over_six"),
                               custom_variants=(), diag_samples=0)
    unit = lambda v, s: study_specs.Unit("python", 10.0, v, s)  # noqa: E731

    def batch(variant, seeds, wall, compile_s):
        _write_fake_batch(tmp_path, spec, variant, seeds, wall, compile_s=compile_s,
                          paused_s=5.0)

    batch("four_over_six", (0, 1, 2), 330.0, 100.0)
    batch("paper", (0, 1, 2), 200.0, 50.0)
    batch("paper", (3, 4, 5, 6, 7), 285.0, 60.0)  # the largest own batch: the guide
    six = [unit("paper", s) for s in range(6, 12)]
    margin = batch_plans.MORE_SEEDS_MARGIN
    assert batch_plans.batch_wall_estimate(spec, tmp_path, six) == pytest.approx(
        (60.0 + 225.0 * 6 / 5) * margin)
    assert batch_plans.batch_wall_estimate(spec, tmp_path, six, compiled=True) == (
        pytest.approx(225.0 * 6 / 5 * margin))
    assert batch_plans.batch_wall_estimate(  # as many seeds as an own batch: as it took
        spec, tmp_path, six[:5]) == 285.0
    assert batch_plans.batch_wall_estimate(  # fewer: the closest own size, not the last
        spec, tmp_path, six[:3]) == 200.0
    assert batch_plans.batch_wall_estimate(  # BF16, nothing of its kind timed: no guide
        spec, tmp_path, [unit("bf16", s) for s in range(3)]) is None


def test_scaling_a_batch_to_more_seeds_leaves_its_compilations_unscaled():
    """Only the training and evaluations grow with the seed count: the first step's
    compilation and the tail's (``mode_switch_s``) count once, and not at all on
    compiled programs; a batch without a tail (no ``mode_switch_s``) scales as before."""

    tail = {"seeds": [0, 1, 2], "train_wall_s": 300.0, "compile_s": 50.0,
            "mode_switch_s": 40.0}
    assert batch_plans.scaled_to_seeds(tail, 6) == 300.0 + 210.0
    assert batch_plans.scaled_to_seeds(tail, 6, compiled=True) == 420.0
    assert batch_plans.scaled_to_seeds(tail, 3) == 300.0
    plain = {"seeds": [0, 1, 2], "train_wall_s": 300.0, "compile_s": 50.0}
    assert batch_plans.scaled_to_seeds(plain, 6) == 550.0


def test_a_batch_that_samples_diagnostics_is_estimated_with_their_pause(tmp_path):
    """A batch with a seed that samples diagnostics, estimated from a batch that sampled
    none, adds the longest pause of a finished unit of its length that sampled them; with
    no such unit it has no estimate; from a batch that sampled them, nothing is added;
    a BF16 batch (no diagnostics) is estimated as before. Once a seed batch has sampled
    them, the allowance is its pause less that of its variant's batch that did not (the
    sampling's own cost), not the unbatched unit's whole pause."""

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3, 4, 5, 6), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "no_sr"), custom_variants=(),
                               diag_samples=8, diag_seeds=(3, 5))
    unit = lambda v, s: study_specs.Unit("python", 10.0, v, s)  # noqa: E731

    def write(variant, seed, *, seeds=None, wall=0.0, paused=0.0, diag=False):
        r = _fake_result(spec, variant, seed, 1.0)
        r["diagnostics"] = [{"step": 100}] if diag else []
        r["segments"] = [{"paused_s": paused}]
        if seeds:
            r["seed_batch"] = {"seeds": list(seeds), "train_wall_s": wall, "paused_s": paused,
                               "samples_diagnostics": diag}
        unit_runs.write_json(unit_runs.result_path(tmp_path, unit(variant, seed)), r)

    for s in (0, 1, 2):
        write("paper", s, seeds=(0, 1, 2), wall=200.0, paused=10.0)
        write("bf16", s, seeds=(0, 1, 2), wall=120.0, paused=8.0)
    assert spec.run_config(unit("paper", 3)).diag_every > 0
    assert spec.run_config(unit("bf16", 3)).diag_every == 0
    assert batch_plans.batch_wall_estimate(spec, tmp_path, [unit("paper", s) for s in (3, 4)]
                                          ) is None
    assert batch_plans.batch_wall_estimate(spec, tmp_path, [unit("bf16", s) for s in (3, 4)]
                                          ) == 120.0
    write("no_sr", 0, paused=130.0, diag=True)  # an unbatched unit that sampled them
    assert batch_plans.batch_wall_estimate(
        spec, tmp_path, [unit("paper", s) for s in (3, 4)]) == pytest.approx(330.0)
    assert batch_plans.batch_wall_estimate(  # no seed of this batch samples diagnostics
        spec, tmp_path, [unit("paper", s) for s in (4, 6)]) == 200.0
    for s in (3, 4, 5):
        write("paper", s, seeds=(3, 4, 5), wall=260.0, paused=70.0, diag=True)
    assert batch_plans.diag_pause_estimate(spec, tmp_path, 10.0) == 60.0  # 70 - 10
    assert batch_plans.batch_wall_estimate(  # the last own batch sampled them: as it took
        spec, tmp_path, [unit("paper", s) for s in (5, 6)]) == 260.0
    assert batch_plans.batch_wall_estimate(  # an untimed variant: slowest x margin, and
        spec, tmp_path, [unit("no_sr", s) for s in (3, 4, 5)]) == pytest.approx(
            260.0 * batch_plans.UNTIMED_VARIANT_MARGIN)  # the slowest sampled them


def test_a_batch_on_compiled_programs_is_estimated_without_the_compilation(tmp_path):
    """A batch that runs on an earlier batch's programs is estimated as its own variant's
    last batch less that batch's compilation; a fresh batch is never estimated from a
    batch that ran on reused programs (it compiled nothing)."""

    spec = dataclasses.replace(TINY, seeds=tuple(range(9)), tokens_per_param=(10.0,),
                               variants=("bf16", "paper"), custom_variants=(),
                               diag_samples=0)
    unit = lambda s: study_specs.Unit("python", 10.0, "paper", s)  # noqa: E731

    def write(seeds, wall, compile_s, reused):
        _write_fake_batch(tmp_path, spec, "paper", seeds, wall, compile_s=compile_s,
                          paused_s=5.0, reused_programs=reused)

    write((0, 1, 2), 200.0, 50.0, False)
    batch = [unit(s) for s in (6, 7, 8)]
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch) == 200.0
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch, compiled=True) == 150.0
    write((3, 4, 5), 151.0, 0.5, True)  # the last own batch, on the first one's programs
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch) == 200.0
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch, compiled=True) == 150.5


def test_a_batch_that_loaded_its_programs_from_the_cache_is_no_guide_to_a_fresh_one(
        tmp_path):
    """A batch whose process loaded its programs from the persistent compilation cache
    (``compile_cache_hits``) compiled next to nothing, so a fresh batch is estimated from
    the variant's last batch that compiled; on compiled programs it serves, less its
    first step, like any other."""
    spec = dataclasses.replace(TINY, seeds=tuple(range(12)), tokens_per_param=(10.0,),
                               variants=("bf16", "paper"), custom_variants=(),
                               diag_samples=0)
    unit = lambda s: study_specs.Unit("python", 10.0, "paper", s)  # noqa: E731
    _write_fake_batch(tmp_path, spec, "paper", (0, 1, 2), 200.0, compile_s=50.0,
                      paused_s=5.0, reused_programs=False, compile_cache_hits=0)
    _write_fake_batch(tmp_path, spec, "paper", (3, 4, 5), 152.0, compile_s=2.0,
                      paused_s=5.0, reused_programs=False, compile_cache_hits=3)
    batch = [unit(s) for s in (9, 10, 11)]
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch) == 200.0
    assert batch_plans.batch_wall_estimate(spec, tmp_path, batch, compiled=True) == 150.0


def test_compile_cache_hits_counts_the_caches_hits_within_its_block():
    """The counter sees the persistent cache's hit events recorded inside its block only,
    and stops listening when the block ends."""
    import seed_batch  # noqa: PLC0415

    event = "/jax/compilation_cache/cache_hits"
    with seed_batch.compile_cache_hits() as hits:
        jax.monitoring.record_event(event)
        jax.monitoring.record_event("/jax/compilation_cache/cache_misses")
        jax.monitoring.record_event(event)
    jax.monitoring.record_event(event)
    assert hits == [2]


def test_run_seed_batches_hands_off_each_batch_and_skips_one_that_cannot_fit(
        tmp_path, monkeypatch, capsys):
    """After each finished batch the hook runs (so a call cut off later keeps it) and,
    with progress, its time and the corpus's loading time are printed; a
    batch whose estimate exceeds the time left is not started, even for a variant not
    timed before (the failure that lost a finished batch on the H200: an untimed batch
    was started with 240 s left and killed), and a later batch that fits still runs."""
    import seed_batch  # noqa: PLC0415

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "four_over_six", "no_sr"),
                               custom_variants=())
    timed = _fake_result(spec, "no_sr", 2, 1.0)  # no_sr's own batch: 2 seeds in 50 s
    timed["seed_batch"] = {"seeds": [2, 3], "train_wall_s": 50.0, "step_time_s": 0.05}
    unit_runs.write_json(unit_runs.result_path(
        tmp_path, study_specs.Unit("python", 10.0, "no_sr", 2)), timed)
    clock = [0.0]
    monkeypatch.setattr(seed_batch.time, "perf_counter", lambda: clock[0])
    loads = []
    monkeypatch.setattr(seed_batch.data_lib, "load_corpus", lambda **kw: loads.append(
        kw) or types.SimpleNamespace(from_cache=False))

    def fake_batch(spec, units, results, corpus, **_):
        clock[0] += 100.0
        out = []
        for u in units:
            r = _fake_result(spec, u.variant, u.seed, 1.0)
            r["seed_batch"] = {"seeds": [v.seed for v in units], "train_wall_s": 100.0,
                               "step_time_s": 0.05}
            unit_runs.write_json(unit_runs.result_path(results, u), r)
            out.append(r)
        return out

    monkeypatch.setattr(seed_batch, "run_seed_batch", fake_batch)
    handed = []
    done = seed_batch.run_seed_batches(
        spec, tmp_path, size=2, budget_s=320.0, t_begin=0.0, progress=True,
        after_batch=lambda: handed.append(len(list(tmp_path.glob("*.json")))))
    printed = capsys.readouterr().out
    assert printed.count("  handed off in 0s\n") == 3
    # The corpus loads once, before the call's first batch, and says how long it took.
    assert printed.count("corpus python loaded in 0s\n") == 1
    # ... keeping it beside the compilation cache for the call's later processes.
    assert [kw["cache_dir"] for kw in loads] == [tmp_path / "work" / "corpus_cache"]
    # Each batch of seeds 0-1 (seed 2 alone is not batched) takes 100 s here. bf16, no
    # BF16 batch timed, runs unestimated as the call's first (to 100 s); paper needs
    # 1.25 x no_sr's 50 s (to 200 s); four_over_six 1.25 x paper's 100 s, more than the
    # 120 s left; no_sr's own 50 s fit (to 300 s).
    assert [r["variant"] for r in done] == ["bf16", "bf16", "paper", "paper", "no_sr", "no_sr"]
    assert handed == [3, 5, 7]
    # A length never timed: its first batch runs unestimated only as the call's first.
    two = dataclasses.replace(spec, tokens_per_param=(10.0, 100.0), variants=("bf16",),
                              seeds=(0, 1))
    done = seed_batch.run_seed_batches(two, tmp_path / "two", size=2, budget_s=1e6,
                                       t_begin=clock[0])
    assert [(r["variant"], r["seed"]) for r in done] == [("bf16", 0), ("bf16", 1)]
    clock[0] = 0.0  # a bound on the unestimated batch: it starts only with that much left
    assert seed_batch.run_seed_batches(two, tmp_path / "two", size=2, budget_s=300.0,
                                       t_begin=0.0, unestimated_min_s=301.0) == []
    done = seed_batch.run_seed_batches(two, tmp_path / "two", size=2, budget_s=300.0,
                                       t_begin=0.0, unestimated_min_s=300.0)
    assert len(done) == 2


def test_a_forking_batch_left_to_a_later_call_keeps_its_forks_for_it(tmp_path, capsys,
                                                                      monkeypatch):
    """Where a batch that would fork its tail variant does not fit the time left, the
    tail's units wait for it: the call does not train them from the start, although
    their own batch's estimate fits (a whole run each, where a fork is the tail's share).
    A call that excludes the forking variant still trains the tail's own batch."""
    import seed_batch  # noqa: PLC0415

    spec = dataclasses.replace(TINY, seeds=(0, 1, 2, 3), tokens_per_param=(10.0,),
                               variants=("bf16", "paper", "paper_tail"), custom_variants=())
    _write_fake_batch(tmp_path, spec, "paper", (2, 3), 200.0)
    _write_fake_batch(tmp_path, spec, "paper_tail", (2, 3), 100.0)
    monkeypatch.setattr(seed_batch.data_lib, "load_corpus",
                        lambda **_: types.SimpleNamespace(from_cache=False))
    trained = []

    def fake_batch(spec, units, results, corpus, **_):
        trained.append([u.name for u in units])
        return []

    monkeypatch.setattr(seed_batch, "run_seed_batch", fake_batch)
    both = {"variant": {"paper", "paper_tail"}}
    # paper s0-1 with its forks: 200 s plus the tail's share and a switch, over 250 s.
    assert seed_batch.run_seed_batches(spec, tmp_path, size=2, budget_s=250.0,
                                       only=both) == []
    out = capsys.readouterr().out
    assert "(forking python-tpp10-paper_tail-s0, python-tpp10-paper_tail-s1) needs" in out
    assert trained == []
    seed_batch.run_seed_batches(spec, tmp_path, size=2, budget_s=250.0,
                                only={"variant": {"paper_tail"}})
    assert trained == [["python-tpp10-paper_tail-s0", "python-tpp10-paper_tail-s1"]]


def test_adopt_units_takes_only_units_run_exactly_as_this_study_would(tmp_path):
    """A finished unit of another study is adopted when its recorded run config, model
    (dtype aside), steps and corpus are this study's; one at another learning rate is
    refused naming the field; a unit already finished here is left alone."""
    same = dataclasses.replace(TINY, name="same")
    other_lr = dataclasses.replace(TINY, name="other_lr", lr=TINY.lr / 2)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()

    def record(spec, unit):
        return json.loads(json.dumps({
            "study": spec.name, "unit": unit.name, "corpus": unit.corpus,
            "variant": unit.variant, "seed": unit.seed,
            "steps": spec.steps(unit.tokens_per_param), "final_val_bpb": 1.5,
            "model_config": dataclasses.asdict(spec.model_config("bfloat16")),
            "run_config": dataclasses.asdict(spec.run_config(unit))}))

    bf16, quant = TINY.units()
    unit_runs.write_json(unit_runs.result_path(src, bf16), record(same, bf16))
    unit_runs.write_json(unit_runs.result_path(src, quant), record(other_lr, quant))
    notes = unit_runs.adopt_units(TINY, dst, same, src)
    assert notes == [f"  {bf16.name}: adopted from same",
                     f"  {quant.name}: not adopted, run_config differ"]
    got = unit_runs.finished(dst, bf16)
    assert got["study"] == "tiny" and got["adopted_from"] == "same"
    assert got["final_val_bpb"] == 1.5 and unit_runs.finished(dst, quant) is None
    assert unit_runs.adopt_units(TINY, dst, same, src)[0].endswith("already finished in tiny")


def test_unit_seeds_give_a_corpus_variant_more_seeds_that_all_pair(tmp_path):
    """``unit_seeds`` replaces the seeds of one corpus's variant (the other corpus and
    variants keep ``seeds``); seeds the baseline does not run there (unpaired), a
    variant or corpus the study does not run, an empty or repeated list, and a pair
    named twice are refused by name."""
    spec = dataclasses.replace(TINY, corpora=("python", "prose"), seeds=(0, 1),
                               unit_seeds=(("python", "bf16", (0, 1, 2, 3)),
                                           ("python", "down_only", (0, 1, 2))))
    names = [u.name for u in spec.units()]
    assert names == ([f"python-tpp0.003-bf16-s{s}" for s in range(4)]
                     + [f"prose-tpp0.003-bf16-s{s}" for s in range(2)]
                     + [f"python-tpp0.003-down_only-s{s}" for s in range(3)]
                     + [f"prose-tpp0.003-down_only-s{s}" for s in range(2)])
    assert spec.seeds_of("prose", "bf16") == (0, 1)
    assert "(python bf16: 0-3) (python down_only: 0-2)." in study_report.study_section(
        spec, [], tmp_path, tmp_path)
    bf16 = ("python", "bf16", (0, 1, 2, 3))
    for bad, match in [((("python", "down_only", (0, 5)),), r"seeds \[5\] that 'bf16'"),
                       ((bf16, ("python", "down_only", (0, 1, 4))), r"seeds \[4\]"),
                       ((("code", "bf16", (0,)),), "names 'bf16' on 'code'"),
                       ((("python", "no_sr", (0,)),), "names 'no_sr' on 'python'"),
                       ((("python", "bf16", ()),), "non-empty without repeats"),
                       ((("python", "bf16", (0, 0)),), "non-empty without repeats"),
                       ((bf16, bf16), "twice")]:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(spec, unit_seeds=bad)


def test_corpus_variants_restrict_a_corpus_to_some_variants():
    """``corpus_variants`` runs a corpus's units for its variants only (the others run on
    every corpus), the report's table of that corpus lists only them, and a restriction
    that names an unknown corpus, leaves out the baseline or names another variant is
    refused by name."""
    spec = dataclasses.replace(TINY, corpora=("python", "prose"),
                               variants=("bf16", "down_only", "paper"),
                               custom_variants=(DOWN_ONLY,),
                               corpus_variants=(("prose", ("paper", "bf16")),))
    names = [u.name for u in spec.units()]
    assert [n for n in names if n.startswith("prose")] == [
        "prose-tpp0.003-bf16-s0", "prose-tpp0.003-paper-s0"]
    assert sum(n.startswith("python") for n in names) == 3
    assert spec.variants_of("prose") == ("bf16", "paper")
    table = study_report.gap_table(spec, {}, "prose")
    assert "| paper | 0 | not run yet" in table and "down_only" not in table
    assert "| down_only | 0 | not run yet" in study_report.gap_table(spec, {}, "python")
    for bad, match in [((("code", ("bf16",)),), "names corpus 'code'"),
                       ((("prose", ("paper",)),), "must include 'bf16'"),
                       ((("prose", ("bf16", "no_sr")),), "must include 'bf16'"),
                       ((("prose", ("bf16",)), ("prose", ("bf16",))), "names a corpus twice")]:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(spec, corpus_variants=bad)


def test_diag_corpora_limit_diagnostics_to_some_corpora():
    """Only the quantized runs of a diagnostics seed on a corpus in ``diag_corpora`` (all
    corpora when it is empty) sample diagnostics; a corpus the study does not run is
    refused by name."""
    spec = dataclasses.replace(TINY, corpora=("python", "prose"), seeds=(0, 1),
                               diag_samples=2, diag_seeds=(1,))

    def sampling(s):
        return [u.name for u in s.units() if s.run_config(u).diag_every]

    assert sampling(spec) == ["python-tpp0.003-down_only-s1", "prose-tpp0.003-down_only-s1"]
    only_python = dataclasses.replace(spec, diag_corpora=("python",))
    assert sampling(only_python) == ["python-tpp0.003-down_only-s1"]
    with pytest.raises(ValueError, match=r"diag_corpora \('code',\)"):
        dataclasses.replace(spec, diag_corpora=("code",))


def test_a_segments_environment_records_the_xla_flags_it_ran_with(monkeypatch):
    """Which autotuning picks a GPU process loaded is part of how its numbers came about:
    the environment stored with each segment holds XLA_FLAGS as set, None where unset."""
    flags = "--xla_gpu_load_autotune_results_from=/x/studies/autotune_picks.textproto"
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert unit_records.environment("run")["xla_flags"] == flags
    monkeypatch.delenv("XLA_FLAGS")
    assert unit_records.environment("run")["xla_flags"] is None


def test_repeats_tells_a_replay_that_repeats_from_one_that_parts(tmp_path, capsys):
    """`validation.py repeats`: a replayed unit whose curves equal the earlier run's is
    counted as repeating; one whose training loss differs from some step on is not, and
    its line says through which steps the curves agree; units only in one folder are
    left out."""
    spec = study_specs.STUDIES["hybrid"]
    earlier, replay = tmp_path / "earlier", tmp_path / "replay"
    earlier.mkdir()
    replay.mkdir()
    for seed, folder in ((0, earlier), (0, replay), (1, earlier), (1, replay), (2, earlier)):
        r = _fake_result(spec, "bf16", seed, 1.0)
        r["train_curve"] = [[25, 3.0, 1.0, "bf16"], [50, 2.0, 1.0, "bf16"],
                            [75, 1.5 if folder == earlier or seed == 0 else 1.6, 1.0, "bf16"]]
        (folder / f"{r['unit']}.json").write_text(json.dumps(r))
    assert validation.main(["repeats", "hybrid", "--results", str(replay),
                            "--against", str(earlier)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 of 2 runs repeat bit for bit"
    assert out[0].endswith("through step 75 of 75; repeats")
    assert "training loss through step 50 of 75; differs: final val bpb " in out[1]
