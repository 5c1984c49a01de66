"""Instruction counts of a quantize kernel's main loop, from its SASS (``cuobjdump -sass``).

    PYTHONPATH=. python benchmarks/sass_loop_counts.py K.sass [K2.sass ...] \\
        --elements-per-thread 64 --split 'ST\\.E\\.64'

The main loop is the span of the backward branch that covers the most instructions.
``--split REGEX`` cuts it after the last instruction matching REGEX (the two-output
kernels store the rowwise engine's codes with ``ST.E.64``: the split separates the
rowwise from the columnwise engine). Prints instructions per loop iteration and per
element (``--elements-per-thread``: a 64×128 tile over 128 threads is 64), each part's
share, per pipe (`pipe_of`: Nsight Compute's ALU, FMA, ... pipes), and the opcode
histogram side by side. The SASS of the two-output kernels is in
``benchmarks/results/2026-12-01-h200f/call3/sass.tgz`` (``gpu_session_f3.sh``).
"""

from __future__ import annotations

import argparse
import collections
import re

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_BRA = re.compile(r"BRA\s+(?:`?\(?\.?L?_?x?)?0x([0-9a-f]+)")


def instructions(path: str) -> list[tuple[int, str, str, bool]]:
    """(address, opcode, operands, predicated) of every instruction of a SASS listing."""
    out = []
    with open(path) as f:
        for line in f:
            m = _INSTR.match(line)
            if m:
                out.append((int(m.group(1), 16), m.group(3), m.group(4), bool(m.group(2))))
    return out


def main_loop(instrs: list[tuple[int, str, str, bool]]) -> list[tuple[int, str, str, bool]]:
    """The instructions of the longest loop: the span (target .. branch) of a predicated
    backward branch. Unconditional backward branches are not loops: ptxas places the
    retry loops of barrier waits after the function's end and jumps back from them."""
    best = (0, 0)
    for i, (addr, op, args, predicated) in enumerate(instrs):
        m = _BRA.search(op + args) if op == "BRA" and predicated else None
        if m and int(m.group(1), 16) < addr:
            start = next(j for j, ins in enumerate(instrs) if ins[0] >= int(m.group(1), 16))
            best = max(best, (i - start, start), key=lambda t: t[0])
    n, start = best
    return instrs[start:start + n + 1]


_FMA_HEAVY = ("IMAD", "IMUL", "IDP")  # integer multiplies: the FMA pipe's heavy half only
_FMA = ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2")
_XU = ("F2F", "F2I", "I2F", "MUFU", "FRND")


def pipe_of(opcode: str) -> str:
    """The Hopper issue pipe of a SASS opcode, as Nsight Compute's pipe metrics name them.

    ``alu``: integer add/logic/shift/select/compare and float compare, select and min/max
    (half the lanes of the FMA pipe); ``fmaheavy``: integer multiply-add; ``fma``: float
    add/multiply/fma; ``xu``: conversions and transcendentals; ``mem``: loads, stores,
    barriers, TMA; ``uniform``: uniform-datapath and special-register instructions;
    ``other``: the rest (branches, shuffles, ...).

    Example:
      >>> [pipe_of(o) for o in ("LOP3.LUT", "IMAD.SHL.U32", "FFMA", "FMNMX.NAN", "STG.E")]
      ['alu', 'fmaheavy', 'fma', 'alu', 'mem']
    """
    base = opcode.split(".")[0]
    if base in _FMA_HEAVY:
        return "fmaheavy"
    if base in _FMA:
        return "fma"
    if base in _XU:
        return "xu"
    if base.startswith(("LD", "ST", "ATOM", "RED", "SYNCS", "BAR", "UTMA", "UBLKCP", "MEMBAR")):
        return "mem"
    if base.startswith("U") or base in ("S2R", "S2UR", "CS2R", "R2UR"):
        return "uniform"
    if base in ("LOP3", "SHF", "IADD3", "ISETP", "SEL", "PRMT", "LEA", "FSETP", "FMNMX",
                "FSEL", "IMNMX", "VIMNMX", "VIADD", "PLOP3", "P2R", "R2P", "FLO", "POPC",
                "BREV", "IABS", "SGXT", "BMSK", "F2FP", "I2FP", "MOV", "FCHK"):
        return "alu"
    return "other"


def summarize(path: str, per_thread: int, split: str | None) -> dict:
    loop = main_loop(instructions(path))
    parts = [loop]
    if split:
        hits = [i for i, (_, op, args, _) in enumerate(loop) if re.search(split, op + args)]
        if hits:
            parts = [loop[:hits[-1] + 1], loop[hits[-1] + 1:]]
    ops = collections.Counter(op.split(".")[0] for _, op, _, _ in loop)
    pipes = collections.Counter(pipe_of(op) for _, op, _, _ in loop)
    return {"path": path, "loop": len(loop), "per_element": len(loop) / per_thread,
            "parts": [len(p) / per_thread for p in parts], "ops": ops,
            "pipes_per_element": {k: v / per_thread for k, v in sorted(pipes.items())}}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sass", nargs="+")
    p.add_argument("--elements-per-thread", type=int, default=64)
    p.add_argument("--split", default=r"ST\.E\.64")
    a = p.parse_args(argv)
    rows = [summarize(s, a.elements_per_thread, a.split) for s in a.sass]
    for r in rows:
        parts = " + ".join(f"{x:.1f}" for x in r["parts"])
        print(f"{r['path']}: {r['loop']} instructions per loop iteration, "
              f"{r['per_element']:.1f} per element ({parts}); per pipe: "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["pipes_per_element"].items()))
    ops = sorted(set().union(*(r["ops"] for r in rows)), key=lambda o: -rows[-1]["ops"][o])
    print("| opcode | " + " | ".join(f"kernel {i + 1}" for i in range(len(rows))) + " |")
    print("| --- |" + " --- |" * len(rows))
    for o in ops[:20]:
        print(f"| {o} | " + " | ".join(str(r["ops"][o]) for r in rows) + " |")
    return rows


if __name__ == "__main__":
    main()
