"""Device time by op and by kind from a `jax.profiler` trace (perfetto JSON).

`summarize` lists the GPU ops of the newest trace under a directory with their total
time and call count; `by_kind` folds them into the kinds a where-the-time-goes table
needs: cuBLAS/Triton GEMMs, the Pallas Mosaic GPU kernels, XLA fusions, memory
copies and sets, collectives.

    >>> by_kind([("nvjet_sm90_tss_256x128", 3.0, 3), ("anonymous_mosaic_gpu_kernel", 1.0, 6),
    ...          ("loop_multiply_fusion", 0.5, 3)])["GEMM (cuBLAS / XLA Triton)"]
    (3.0, 3)
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

KINDS = (
    ("GEMM (cuBLAS / XLA Triton)", re.compile(r"nvjet|gemm|xmma|cutlass|cublas", re.I)),
    ("Pallas Mosaic GPU kernels", re.compile(r"mosaic", re.I)),
    ("collectives", re.compile(r"nccl|all-?reduce|all-?gather|reduce-?scatter", re.I)),
    ("memcpy / memset", re.compile(r"memcpy|memset", re.I)),
    ("XLA fusions and other ops", re.compile(r".")),
)


def summarize(trace_dir: str) -> list[tuple[str, float, int]]:
    """(name, total ms, count) of every GPU op in the newest perfetto trace, largest first."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        return []
    with gzip.open(files[-1]) as f:
        events = json.load(f).get("traceEvents", [])
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    totals: dict[str, list] = {}
    for e in events:
        if e.get("ph") != "X" or "GPU" not in names.get(e.get("pid"), ""):
            continue
        t = totals.setdefault(e["name"], [0.0, 0])
        t[0] += e.get("dur", 0) / 1e3
        t[1] += 1
    return sorted(((n, ms, c) for n, (ms, c) in totals.items()), key=lambda r: -r[1])


def by_kind(ops: list[tuple[str, float, int]]) -> dict[str, tuple[float, int]]:
    """Total ms and op count per kind (first matching pattern of `KINDS`)."""
    out = {kind: (0.0, 0) for kind, _ in KINDS}
    for name, ms, count in ops:
        kind = next(k for k, pattern in KINDS if pattern.search(name))
        t, c = out[kind]
        out[kind] = (t + ms, c + count)
    return out
