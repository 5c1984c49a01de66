"""Compares the kernels XLA's GPU autotuner picked in two processes.

`benchmarks/gpu_studies_call.sh` has each study process write its autotuning results
(`--xla_gpu_dump_autotune_results_to`, an `xla.AutotuneResults` text proto, gzipped) to
``$OUT/autotune/N-STUDY.textproto.gz``. Two processes that compiled the same programs
and picked other kernels for one of them (a GEMM's cuBLAS algorithm or Triton tiling) sum
in another order there: their runs part in the last bits, which a training run grows.
That is the suspected reason why the validation study's runs of one seed and recipe part
early on the H200 when they ran in different sessions (docs/STUDY.md), while a CPU
repeats them bit for bit.

Usage:
    python benchmarks/autotune_picks.py A.textproto.gz B.textproto.gz

Prints the entries of each file, the (device, HLO) keys both tuned, and those of them
whose pick differs (the measured run times aside).
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from pathlib import Path

_TIMINGS = re.compile(r"\b(run_time\s*\{[^{}]*\}|scratch_bytes:\s*\d+)")


def _blocks(text: str, name: str) -> list[str]:
    """The bodies of the top-level ``name { ... }`` blocks of a text proto (braces inside
    quoted strings skipped)."""
    bodies, depth, start, quoted, escaped = [], 0, None, False, False
    for i, c in enumerate(text):
        if quoted:
            quoted = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            quoted = True
        elif c == "{":
            if depth == 0 and re.search(rf"\b{re.escape(name)}\s*$", text[max(0, i - 80):i]):
                start = i + 1
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and start is not None:
                bodies.append(text[start:i])
                start = None
    return bodies


def _without_timings(result: str) -> str:
    """A result block's pick: its text, whitespace collapsed, without the measured run
    time (a Duration: scalars only, no nested block) and scratch size."""
    return " ".join(_TIMINGS.sub("", result).split())


def picks(text: str) -> dict[tuple[str, str], str]:
    """``{(device, hlo): pick}`` of an `xla.AutotuneResults` text proto.

    Example:
        >>> sample = '''version: 3
        ... results {
        ...   device: "sm_9.0 H200"
        ...   hlo: "{ dot(a, b) }"
        ...   result {
        ...     run_time { nanos: 31744 }
        ...     gemm { algorithm: 13 }
        ...   }
        ... }'''
        >>> picks(sample)
        {('sm_9.0 H200', '{ dot(a, b) }'): 'gemm { algorithm: 13 }'}
    """
    found = {}
    for body in _blocks(text, "results"):
        device = re.search(r'^\s*device:\s*"((?:[^"\\]|\\.)*)"', body, re.M)
        hlo = re.search(r'^\s*hlo:\s*"((?:[^"\\]|\\.)*)"', body, re.M)
        result = _blocks(body[hlo.end():], "result") if hlo else []
        if device is None or hlo is None or not result:
            raise ValueError(f"an autotuning entry without device, hlo or result: "
                             f"{body[:200]!r}")
        found[(device.group(1), hlo.group(1))] = _without_timings(result[0])
    return found


def read_picks(path: str | Path) -> dict[tuple[str, str], str]:
    """`picks` of a file, gzipped (``.gz``) or not."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return picks(raw.decode())


def compare(a: dict, b: dict) -> tuple[int, list[tuple[str, str, str]]]:
    """(keys both tuned, [(first line of the HLO, pick in a, pick in b)] where they
    differ)."""
    shared = sorted(set(a) & set(b))
    differ = [(k[1].split("\\n")[0][:120], a[k], b[k]) for k in shared if a[k] != b[k]]
    return len(shared), differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    args = p.parse_args(argv)
    a, b = read_picks(args.a), read_picks(args.b)
    shared, differ = compare(a, b)
    print(f"{args.a}: {len(a)} entries; {args.b}: {len(b)} entries; {shared} tuned in "
          f"both, {len(differ)} of them picked differently")
    for hlo, x, y in differ:
        print(f"  {hlo}\n    {x}\n    {y}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
