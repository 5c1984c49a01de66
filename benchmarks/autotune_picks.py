"""Compares and merges the kernels XLA's GPU autotuner picked in separate processes.

`benchmarks/gpu_studies_call.sh` has each study process write its autotuning results
(`--xla_gpu_dump_autotune_results_to`, a text proto, gzipped) to
``$OUT/autotune/N-STUDY.textproto.gz``. Two processes that compiled the same programs
and picked other kernels for one of their GEMMs (a cuBLASLt algorithm, a Triton tiling)
sum in another order there: their runs part in the last bits, which a training run grows.
That is why the validation study's runs of one seed and recipe part early on the H200
when they ran in different processes (docs/STUDY.md), while a CPU repeats them bit for
bit. A file of picks given back to XLA (`--xla_gpu_load_autotune_results_from`) fixes
them for every program it covers; `merge` builds such a file from several processes'.

The format is the one XLA 0.11's autotuner writes: top-level ``entries`` blocks, each
with ``key { target { device hlo_fingerprint } environment { codegen_version } }`` and
``value { optimal_config { backend backend_config } optimal_backend_version }``; the
measured run times are not kept.

Usage:
    python benchmarks/autotune_picks.py compare A.textproto.gz B.textproto.gz
    python benchmarks/autotune_picks.py merge OUT.textproto A.textproto.gz B.textproto.gz ...
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from collections import Counter
from pathlib import Path

Key = tuple[str, str, str]


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


def _field(body: str, name: str) -> str | None:
    match = re.search(rf'\b{name}:\s*"((?:[^"\\]|\\.)*)"', body)
    return match.group(1) if match else None


def entries(text: str) -> dict[Key, str]:
    """``{(device, hlo_fingerprint, codegen_version): entry body}`` of an autotuning dump.

    Raises:
        ValueError: text that is not blank holds no ``entries`` block (another format: it
            would otherwise read as a file of no picks), or an entry lacks a key field or
            its ``value``.
    """
    bodies = _blocks(text, "entries")
    if not bodies and text.strip():
        raise ValueError(f"no `entries {{ key ... value ... }}` blocks (XLA 0.11's autotuning "
                         f"dump format) in a text that starts {text[:120]!r}")
    found = {}
    for body in bodies:
        key = tuple(_field(body, f) for f in ("device", "hlo_fingerprint", "codegen_version"))
        if None in key or not _blocks(body, "value"):
            raise ValueError(f"an autotuning entry without device, hlo_fingerprint, "
                             f"codegen_version or value: {body[:200]!r}")
        found.setdefault(key, body)
    return found


def picks(text: str) -> dict[Key, str]:
    """``{key: pick}``: each entry's ``value`` block, whitespace collapsed (see `entries`).

    Example:
        >>> sample = '''entries {
        ...   key {
        ...     target { device: "ed0e" hlo_fingerprint: "014e" }
        ...     environment { codegen_version: "fe90" }
        ...   }
        ...   value {
        ...     optimal_config {
        ...       backend: CUBLASLT_FISSION
        ...       backend_config { gemm { algorithm: 5 } }
        ...     }
        ...   }
        ... }'''
        >>> found = picks(sample)
        >>> list(found)
        [('ed0e', '014e', 'fe90')]
        >>> backend(found['ed0e', '014e', 'fe90'])
        'CUBLASLT_FISSION'
    """
    return {k: _pick(body) for k, body in entries(text).items()}


def _pick(body: str) -> str:
    return " ".join(_blocks(body, "value")[0].split())


def _read_text(path: str | Path) -> str:
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return raw.decode()


def read_picks(path: str | Path) -> dict[Key, str]:
    """`picks` of a file, gzipped (``.gz``) or not."""
    return picks(_read_text(path))


def backend(pick: str) -> str:
    """The backend a pick names (``TRITON``, ``CUBLASLT_FISSION``, ...), or ``?``."""
    match = re.search(r"\bbackend:\s*(\w+)", pick)
    return match.group(1) if match else "?"


def compare(a: dict, b: dict) -> tuple[int, list[tuple[Key, str, str]]]:
    """(keys both tuned, [(key, pick in a, pick in b)] where they differ)."""
    shared = sorted(set(a) & set(b))
    return len(shared), [(k, a[k], b[k]) for k in shared if a[k] != b[k]]


def merge(paths: list[str | Path]) -> tuple[str, int, int]:
    """One autotuning file from several: each key's entry from the first file that has it.

    Returns:
        (the merged text, its number of entries, how many later entries picked otherwise
        than the one kept).
    """
    kept: dict[Key, str] = {}
    overruled = 0
    for path in paths:
        for key, body in entries(_read_text(path)).items():
            if key not in kept:
                kept[key] = body
            elif _pick(body) != _pick(kept[key]):
                overruled += 1
    text = "".join(f"entries {{{body}}}\n" for _, body in sorted(kept.items()))
    return text, len(kept), overruled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="which programs two processes tuned otherwise")
    c.add_argument("a")
    c.add_argument("b")
    m = sub.add_parser("merge", help="one file to load, each key's first pick kept")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+")
    args = p.parse_args(argv)
    if args.command == "merge":
        text, n, overruled = merge(args.inputs)
        Path(args.out).write_text(text)
        print(f"{args.out}: {n} entries from {len(args.inputs)} files; {overruled} later "
              f"picks that differed from the kept one left out")
        return 0
    a, b = read_picks(args.a), read_picks(args.b)
    shared, differ = compare(a, b)
    kinds = Counter(f"{backend(x)} -> {backend(y)}" for _, x, y in differ)
    print(f"{args.a}: {len(a)} entries; {args.b}: {len(b)} entries; {shared} tuned in "
          f"both, {len(differ)} of them picked differently"
          + "".join(f"\n  {n} x {kind}" for kind, n in sorted(kinds.items())))
    for key, x, y in differ:
        print(f"  hlo {key[1]}\n    {x}\n    {y}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
