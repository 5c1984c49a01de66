"""fp4jax on the GPU: quantize bandwidth, NVFP4 GEMM throughput, linear layer fwd+bwd.

One run, side by side in one process, median of many warm device-synchronized runs
(parts (a) and (c): `time_fn`, calls dispatched back to back, right for calls of a
millisecond; part (b): `time_in_program`, per call inside one program, since a skinny
GEMM takes less device time than the host takes to dispatch a call):

  (a) quantize 8192x8192 BF16 -> NVFP4 (1D RNE; two-output RHT+SR): Pallas vs the
      XLA path vs jax.nn's nvfp4 quantization, as a fraction of the HBM copy
      bandwidth measured in the same run;
  (b) NVFP4 GEMM at 4096^3, 8192^3 and 16x8192x8192: Pallas vs XLA dequantize+dot
      vs jax.nn.scaled_dot_general (nvfp4) vs BF16 jnp.dot, in TFLOP/s;
  (c) a linear layer fwd+bwd (8192 tokens, 8192 -> 8192, full recipe) vs BF16, with
      bytes saved for backward; beside it jax.nn.scaled_dot_general (nvfp4) and
      qwix's nvfp4 quantized training when importable.

Usage (GPU machine, repo root):  PYTHONPATH=. python3 benchmarks/bench_nvfp4.py --out DIR
Writes DIR/bench_nvfp4.json and prints Markdown tables (pasted into docs/BENCHMARKS.md).

qwix is not installed on the GPU machine: its wheel travels with the call (the device
tool's ``carry=[".whl"]``, the wheel fetched with ``pip download --no-deps -d .whl
qwix==0.1.8``; its other needs are there) and is installed first:
``python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
PYTHONPATH=.:/tmp/site python3 benchmarks/bench_nvfp4.py --skip a,b --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from pallas_kernels.timing import environment, sets_to_defeat_l2, time_fn, time_in_program

LINEAR = (((1,), (0,)), ((), ()))
GEMM_CALLS = 16  # per program in part (b); the time per call is the slope of 16 and 32 calls
TIMERS = ("timers: (a), (c) time_fn (calls dispatched back to back from Python); (b) "
          f"time_in_program (per call, the slope of {GEMM_CALLS} and {2 * GEMM_CALLS} calls "
          "in one program: no host dispatch)")


def _try(fn):
    """Runs a benchmark entry; returns its result or the error text (never hides it)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the table
        traceback.print_exc()
        return f"error: {type(e).__name__}: {str(e)[:160]}"


def _entry(res: dict, name: str, measure) -> None:
    """Stores ``measure()``'s dict under ``name``, or the error text if it failed."""
    r = _try(measure)
    res[name] = r


def _kernels():
    try:
        from pallas_kernels import gemm as kmat
    except Exception:  # noqa: BLE001
        kmat = None
    try:
        from pallas_kernels import quantize_single as kq
        from pallas_kernels import quantize_two_output as kq2
    except Exception:  # noqa: BLE001
        kq = kq2 = None
    return kq, kq2, kmat


def bench_quantize(n: int, iters: int) -> dict:
    """Quantize variants of an (n, n) BF16 tensor against their HBM floors.

    Floor of a variant = the bytes it must move at the copy bandwidth measured here:
    one read of x per pass over it (the amax pass counts as one more read when the
    amax is not given) plus every output written once (codes n²/2 + scales n²/16 per
    copy). ``floor_ratio`` = floor time / measured time (1.0 = at the floor).
    """
    kq, kq2, _ = _kernels()
    keys = jax.random.split(jax.random.key(0), 3)
    xs = [jax.random.normal(k, (n, n), jnp.bfloat16) for k in keys[:2]]
    res = {}
    copy = jax.jit(lambda x: jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(x, jnp.uint16) ^ jnp.uint16(1), jnp.bfloat16))
    t = time_fn(copy, [(x,) for x in xs], iters=iters)
    res["copy_tb_s"] = 2 * xs[0].nbytes / t / 1e12
    in_bytes = xs[0].nbytes
    out_1d = n * n // 2 + n * n // 16 + 4

    def entry(name, fn, args, *, reads, outputs):
        def measure():
            t = time_fn(fn, args, iters=iters)
            floor_bytes = reads * in_bytes + outputs * out_1d
            floor_s = floor_bytes / (res["copy_tb_s"] * 1e12)
            return {"ms": t * 1e3, "floor_ms": floor_s * 1e3, "floor_ratio": floor_s / t,
                    "reads": reads, "outputs": outputs}
        _entry(res, name, measure)

    amaxes = [jnp.max(jnp.abs(x)).astype(jnp.float32) for x in xs]
    args = [(x,) for x in xs]
    args_a = list(zip(xs, amaxes))
    args_k = [(x, keys[2]) for x in xs]
    sr = dict(rounding="stochastic")
    entry("xla_1d_rne_amax_given", jax.jit(lambda x, a: fp4jax.quantize(x, amax=a)), args_a,
          reads=1, outputs=1)
    entry("xla_1d_rne", jax.jit(lambda x: fp4jax.quantize(x)), args, reads=2, outputs=1)
    entry("xla_1d_sr", jax.jit(lambda x, k: fp4jax.quantize(x, key=k, **sr)), args_k,
          reads=2, outputs=1)
    cfg = jax.nn.get_scaled_dot_general_config("nvfp4")
    entry("jax_nn_1d", jax.jit(lambda x: Q_jax_nn(x, cfg)), args, reads=2, outputs=1)
    two = lambda x, k, rounding: (  # noqa: E731
        fp4jax.quantize(x, axis=1, rounding=rounding, key=jax.random.fold_in(k, 2)),
        fp4jax.quantize(x, axis=0, hadamard=True, rounding=rounding,
                        key=jax.random.fold_in(k, 5)))
    entry("xla_two_output_rht_sr", jax.jit(lambda x, k: two(x, k, "stochastic")), args_k,
          reads=2, outputs=2)
    if kq is not None:
        entry("pallas_1d_rne_amax_given", jax.jit(lambda x, a: kq.quantize(x, amax=a)), args_a,
              reads=1, outputs=1)
        entry("pallas_1d_rne", jax.jit(lambda x: kq.quantize(x)), args, reads=2, outputs=1)
        entry("pallas_1d_sr", jax.jit(lambda x, k: kq.quantize(x, key=k, **sr)), args_k,
              reads=2, outputs=1)
        for rounding in ("nearest", "stochastic"):
            entry(f"pallas_two_output_rht_{'sr' if rounding == 'stochastic' else 'rne'}",
                  jax.jit(lambda x, k, rounding=rounding: kq2.quantize_rowwise_columnwise(
                      x, rounding=rounding, row_key=jax.random.fold_in(k, 2),
                      col_key=jax.random.fold_in(k, 5))), args_k, reads=2, outputs=2)
    return res


def Q_jax_nn(x, cfg):  # noqa: N802 - jax.nn's own nvfp4 quantizer (the peer a user would try)
    from jax._src.cudnn import scaled_matmul_stablehlo as smh
    return smh.quantize(x[None], cfg)


def bench_gemm(shapes, iters: int) -> dict:
    """GEMM rows, each implementation timed per call inside one program (`time_in_program`)
    on as many operand sets as defeat the L2 (counted on the NVFP4 operands)."""
    _, _, kmat = _kernels()
    res = {}
    for m, k, n in shapes:
        copies = sets_to_defeat_l2((m * k + k * n) * 9 // 16)  # NVFP4: codes + E4M3 scales
        keys = jax.random.split(jax.random.key(m + k + n), 2 * copies)
        a = [jax.random.normal(kk, (m, k), jnp.bfloat16) for kk in keys[:copies]]
        b = [jax.random.normal(kk, (k, n), jnp.bfloat16) for kk in keys[copies:]]
        qa = [fp4jax.quantize(x) for x in a]
        qb = [fp4jax.quantize(x, axis=0, block_2d=True) for x in b]
        flops = 2 * m * k * n
        row = {}

        def entry(name, fn, args, flops=flops, row=row):
            def measure():
                t = time_in_program(fn, args, iters=iters, calls_per_program=GEMM_CALLS)
                return {"ms": t * 1e3, "tflops": flops / t / 1e12}
            _entry(row, name, measure)

        entry("bf16_jnp_dot",
              jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.bfloat16)),
              list(zip(a, b)))
        entry("xla_dequant_dot", jax.jit(lambda x, y: fp4jax.matmul(
            x, y, preferred_element_type=jnp.bfloat16, impl="xla")), list(zip(qa, qb)))
        cfgs = [jax.nn.get_scaled_dot_general_config("nvfp4")] * 3
        entry("jax_nn_scaled_dot_general", jax.jit(
            lambda x, y, cfgs=cfgs: jax.nn.scaled_dot_general(
                x, y, (((1,), (0,)), ((), ())), preferred_element_type=jnp.bfloat16,
                configs=cfgs)), list(zip(a, b)))
        if kmat is not None:
            entry("pallas", jax.jit(lambda x, y: kmat.matmul(
                x, y, preferred_element_type=jnp.bfloat16)), list(zip(qa, qb)))
        res[f"{m}x{k}x{n}"] = row
    return res


def bench_layer(tokens: int, k: int, n: int, iters: int) -> dict:
    keys = jax.random.split(jax.random.key(7), 4)
    x = jax.random.normal(keys[0], (tokens, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
    ct = jax.random.normal(keys[2], (tokens, n), jnp.bfloat16)
    args = [(x, w, ct, keys[3]), (x * 0.5, w, ct, keys[2])]

    def layer(dg):
        def f(x, w, ct, key):
            y, vjp = jax.vjp(lambda x, w: dg(x, w, key), x, w)
            return y, *vjp(ct)
        return jax.jit(f)

    res = {}
    res["bf16_ms"] = 1e3 * time_fn(layer(lambda x, w, key: jax.lax.dot_general(x, w, LINEAR)),
                                   args, iters=iters)
    impls = ["xla"] + (["pallas", "auto"] if _kernels()[1] is not None else [])
    for impl in impls:
        dg = lambda x, w, key, impl=impl: fp4jax.dot_general(  # noqa: E731
            x, w, LINEAR, key=key, impl=impl)
        r = _try(lambda dg=dg: 1e3 * time_fn(layer(dg), args, iters=iters))
        res[f"fp4jax_{impl}_ms"] = r
        if isinstance(r, float):
            res[f"fp4jax_{impl}_ratio"] = r / res["bf16_ms"]
        _, vjp = jax.vjp(lambda x, w, dg=dg: dg(x, w, keys[3]), x, w)
        res[f"fp4jax_{impl}_saved_bytes"] = int(sum(
            l.nbytes for l in jax.tree_util.tree_leaves(vjp) if hasattr(l, "nbytes")))
    res["bf16_saved_bytes"] = int(x.nbytes + w.nbytes)
    cfgs = [jax.nn.get_scaled_dot_general_config("nvfp4")] * 3
    res["jax_nn_scaled_dot_general_ms"] = _try(lambda: 1e3 * time_fn(layer(
        lambda x, w, key: jax.nn.scaled_dot_general(
            x, w, LINEAR, preferred_element_type=jnp.bfloat16, configs=cfgs)), args, iters=iters))
    res["qwix_nvfp4_qt_ms"] = _try(lambda: _qwix_layer(x, w, ct, iters))
    return res


def _qwix_layer(x, w, ct, iters):
    import qwix
    from flax import nnx

    model = nnx.Linear(w.shape[0], w.shape[1], use_bias=False, dtype=jnp.bfloat16,
                       param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    model.kernel.value = w
    rule = qwix.QtRule(module_path=".*", weight_qtype="nvfp4", act_qtype="nvfp4",
                       bwd_qtype="nvfp4", tile_size=16,
                       additional_qt_config={"dlhs_tile_size": 16, "drhs_tile_size": 16})
    # qwix tells weights from activations by identity, then by shape: a square (T, K)
    # input shaped like the (K, N) kernel would count as a second weight ("lhs and rhs
    # cannot be both weights"), so the input carries a leading batch axis of 1.
    x, ct = x[None], ct[None]
    qmodel = qwix.quantize_model(model, qwix.QtProvider([rule]), x)
    graphdef, state = nnx.split(qmodel)

    @jax.jit
    def f(state, x, ct):
        def fwd(state, x):
            return nnx.merge(graphdef, state)(x)
        y, vjp = jax.vjp(fwd, state, x)
        return y, *vjp(ct.astype(y.dtype))  # qwix's layer returns float32

    return 1e3 * time_fn(f, [(state, x, ct), (state, x * 0.5, ct)], iters=iters)


def _fmt(v, key):
    if isinstance(v, dict) and key in v:
        return f"{v[key]:.3f}" if key != "floor_ratio" else f"{100 * v[key]:.0f}%"
    if isinstance(v, float):
        return f"{v:.3f}"
    return "n/a" if v is None else str(v)[:60]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--skip", default="", help="comma list of a,b,c to skip")
    a = p.parse_args(argv)
    skip = set(a.skip.split(","))
    out = {"env": environment(), "command": " ".join(["python3"] + sys.argv), "timers": TIMERS}
    if "a" not in skip:
        out["quantize"] = bench_quantize(a.n, a.iters)
    if "b" not in skip:
        out["gemm"] = bench_gemm([(4096, 4096, 4096), (a.n, a.n, a.n), (16, a.n, a.n),
                                  (64, a.n, a.n)], a.iters)
    if "c" not in skip:
        out["layer"] = bench_layer(a.n, a.n, a.n, max(10, a.iters // 2))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_nvfp4.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)
    e = out["env"]
    print(f"\n{e['device']}, jax {e['jax']}, {e['date']}")
    print(TIMERS)
    if "quantize" in out:
        qd = out["quantize"]
        print(f"\n(a) quantize {a.n}x{a.n} bf16; HBM copy {qd['copy_tb_s']:.2f} TB/s; floor = "
              "(reads of x + outputs written) at that bandwidth")
        print("| variant | reads x | outputs | floor ms | ms | of floor |")
        print("|---|---|---|---|---|---|")
        for k, v in qd.items():
            if k != "copy_tb_s":
                r = (v.get("reads"), v.get("outputs")) if isinstance(v, dict) else ("", "")
                print(f"| {k} | {r[0]} | {r[1]} | {_fmt(v, 'floor_ms')} | {_fmt(v, 'ms')} | "
                      f"{_fmt(v, 'floor_ratio')} |")
    if "gemm" in out:
        cols = ("bf16_jnp_dot", "xla_dequant_dot", "jax_nn_scaled_dot_general", "pallas")
        print("\n(b) GEMM (fprop layout: A rowwise along K, B 16x16 tiles), TFLOP/s (ms, x BF16)")
        print("| M x K x N | " + " | ".join(cols) + " |\n|---|---|---|---|---|")
        for shape, row in out["gemm"].items():
            bf = row.get("bf16_jnp_dot")
            cells = []
            for k in cols:
                v = row.get(k)
                ratio = (f", {bf['ms'] / v['ms']:.2f}x" if isinstance(v, dict)
                         and isinstance(bf, dict) else "")
                cells.append(f"{_fmt(v, 'tflops')} ({_fmt(v, 'ms')}{ratio})")
            print(f"| {shape} | " + " | ".join(cells) + " |")
    if "layer" in out:
        print("\n(c) linear layer fwd+bwd")
        for k, v in out["layer"].items():
            print(f"| {k} | {_fmt(v, '')} |")
    return out


if __name__ == "__main__":
    main()
