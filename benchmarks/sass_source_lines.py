"""Where a kernel loop's instructions come from: SASS per Python source line.

    ptxas -arch=sm_90a -lineinfo K.ptx -o K.cubin
    nvdisasm --print-line-info K.cubin > K.sass
    PYTHONPATH=. python benchmarks/sass_source_lines.py K.sass --containing HGMMA

A Mosaic GPU kernel's PTX (``MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=D`` on the device)
carries ``.loc`` lines that point at the Python source that emitted each operation, so
the SASS that ``nvdisasm --print-line-info`` prints names, per instruction, the file and
line of our kernel code. This script takes the *innermost* loop (the smallest backward
branch's span) that contains an instruction matching ``--containing`` (default: the
largest loop) and counts its instructions per source line and opcode, with each line's
issue pipes (`sass_loop_counts.pipe_of`). ptxas and nvdisasm also run on a host without a
GPU (the CUDA toolkit's ptxas; nvdisasm from the ``nvidia-cuda-nvdisasm`` wheel), and
``ptxas -v`` prints the notes (``C75xx``: e.g. a serialized ``wgmma``) that Mosaic's own
ptxas report leaves out. The eighth session's table in docs/BENCHMARKS.md came from it.
"""

from __future__ import annotations

import argparse
import collections
import re

from benchmarks.sass_loop_counts import pipe_of

_LINE = re.compile(r'//## File "(?P<file>[^"]*)", line (?P<line>\d+)')
_LABEL = re.compile(r"^\s*\.(?P<label>L_x_\d+):")
_INSTR = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<text>[^;]*);")
_BRANCH = re.compile(r"\bBRA\b.*`\(\.(?P<label>L_x_\d+)\)")


def parse(text: str) -> tuple[list[tuple[int, str, tuple[str, int] | None]], dict[str, int]]:
    """(address, instruction text, (source file name, line) or None) of every instruction
    of an ``nvdisasm --print-line-info`` listing, and each label's instruction index."""
    instrs, labels, where = [], {}, None
    for raw in text.splitlines():
        if m := _LINE.search(raw):
            where = (m["file"].rsplit("/", 1)[-1], int(m["line"]))
        elif m := _LABEL.match(raw):
            labels[m["label"]] = len(instrs)
        elif m := _INSTR.match(raw):
            instrs.append((int(m["addr"], 16), m["text"].strip(), where))
    return instrs, labels


def loop(instrs, labels, containing: str | None = None):
    """The innermost loop (the span of a conditional backward branch) holding an
    instruction that matches ``containing`` (a regex), or the largest loop when
    ``containing`` is None. Unconditional backward branches are not loops: ptxas places
    the retry loops of barrier waits after the function's end and jumps back from them."""
    spans = []
    for i, (_, text, _) in enumerate(instrs):
        m = _BRANCH.search(text)
        if m and text.startswith("@") and labels.get(m["label"], i + 1) <= i:
            spans.append(instrs[labels[m["label"]]:i + 1])
    if containing is not None:
        spans = [s for s in spans if any(re.search(containing, t) for _, t, _ in s)]
        return min(spans, key=len) if spans else []
    return max(spans, key=len) if spans else []


def opcode(text: str) -> str:
    """The base opcode of an instruction's text (its predicate dropped)."""
    words = text.split()
    op = words[1] if words[0].startswith("@") else words[0]
    return op.split(".")[0]


def by_source_line(body) -> list[tuple[tuple[str, int] | None, collections.Counter]]:
    """Per source line of ``body``: its opcode counts, the lines with the most first."""
    per_line: dict = collections.defaultdict(collections.Counter)
    for _, text, where in body:
        per_line[where][opcode(text)] += 1
    return sorted(per_line.items(), key=lambda kv: -sum(kv[1].values()))


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sass")
    p.add_argument("--containing", default=None,
                   help="regex of an instruction the loop must contain (e.g. HGMMA)")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    with open(a.sass) as f:
        instrs, labels = parse(f.read())
    body = loop(instrs, labels, a.containing)
    rows = by_source_line(body)
    total = collections.Counter(opcode(t) for _, t, _ in body)
    print(f"{a.sass}: loop of {len(body)} instructions; "
          + ", ".join(f"{o} {n}" for o, n in total.most_common(12)))
    print("| instructions | source line | pipes | opcodes |")
    print("| --- | --- | --- | --- |")
    for where, ops in rows[:a.top]:
        pipes = collections.Counter()
        for o, n in ops.items():
            pipes[pipe_of(o)] += n
        name = f"{where[0]}:{where[1]}" if where else "?"
        print(f"| {sum(ops.values())} | {name} | "
              + ", ".join(f"{k} {v}" for k, v in pipes.most_common()) + " | "
              + ", ".join(f"{o} {n}" for o, n in ops.most_common(6)) + " |")
    return rows


if __name__ == "__main__":
    main()
