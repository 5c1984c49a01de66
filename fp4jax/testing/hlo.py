"""The collectives of a compiled XLA program and the bytes they move, read from its HLO text.

`collectives` lists every all-gather, all-reduce, reduce-scatter, all-to-all and
collective-permute of ``jax.jit(f).lower(...).compile().as_text()`` — synchronous or
asynchronous (``all-gather-start``; an op that XLA wraps in an ``async-start`` is read
in its wrapped computation) — one record per operand (XLA combines several into one op),
with the bytes each device contributes: the operand's, per device. `all_gathers` keeps
the all-gathers. This is how the tests and `benchmarks/multi_gpu.py` check that FSDP
weights travel as NVFP4 codes and scales (``u8``) instead of BF16 values.

An op inside a ``while`` body counts once, however many times the loop runs.

Example:
  >>> hlo = '''
  ... ENTRY %main {
  ...   %p = bf16[8,64]{1,0} parameter(0)
  ...   %c = u8[8,32]{1,0} parameter(1)
  ...   %ag = (bf16[16,64]{1,0}, u8[16,32]{1,0}) all-gather(%p, %c), dimensions={0}
  ...   %s = (u8[8,32]{1,0}, u8[16,32]{1,0}) all-gather-start(%c), dimensions={0}
  ...   %d = u8[16,32]{1,0} all-gather-done(%s)
  ...   %q = f32[64]{0} parameter(2)
  ...   ROOT %ar = f32[64]{0} all-reduce(%q), to_apply=%add
  ... }'''
  >>> [(g["dtype"], g["bytes"], g["elements"]) for g in all_gathers(hlo)]
  [('bf16', 1024, 1024), ('u8', 256, 512), ('u8', 256, 512)]
  >>> sorted({c["op"] for c in collectives(hlo)})
  ['all-gather', 'all-reduce']
"""

from __future__ import annotations

import math
import re

OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
       "collective-permute", "collective-broadcast")
"""The collectives `collectives` reads (and their ``-start`` forms)."""

_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def _balanced(text: str, start: int) -> int:
    """The index just past the parenthesis that closes the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced parentheses in HLO line: {text!r}")


def _arrays(typ: str) -> list[tuple[str, int]]:
    """(dtype, element count) of every array in a (possibly nested tuple) HLO type."""
    return [(d, math.prod(int(n) for n in dims.split(",") if n))
            for d, dims in _ARRAY.findall(typ) if d != "token"]


def _bits(dtype: str) -> int:
    """Bits per element of an HLO element type (``pred``: one byte)."""
    if dtype == "pred":
        return 8
    width = re.search(r"\d+", dtype)
    if width is None:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return int(width.group())


def _instructions(hlo: str):
    """(name, type, opcode, operand text) of every instruction line of ``hlo``."""
    for line in hlo.splitlines():
        m = _DEF.match(line)
        if not m:
            continue
        rest = line[m.end():]
        if rest.startswith("("):
            end = _balanced(rest, 0)
        else:
            end = rest.find(" ")
            end = len(rest) if end < 0 else end
        typ, rest = rest[:end], rest[end:].lstrip()
        op = re.match(r"([\w\-]+)\(", rest)
        if not op:
            continue
        args = rest[op.end() - 1:_balanced(rest, op.end() - 1)][1:-1]
        yield m.group(1), typ, op.group(1), args


def collectives(hlo: str) -> list[dict]:
    """Every collective of an HLO module's text, one record per operand.

    Args:
      hlo: the text of a compiled (or lowered) HLO module.

    Returns:
      A list of dicts, in program order: ``op`` (e.g. ``"all-gather"``, a ``-start``
      suffix dropped), ``name`` (the instruction), ``dtype`` (HLO element type, e.g.
      ``"bf16"``, ``"u8"``), ``itemsize`` (bytes per element), ``bytes`` (the operand's
      bytes: what each device contributes), ``elements`` (of the result for this
      operand: for an all-gather, the gathered array) and ``op_name`` (the JAX source
      op of the instruction's metadata, "" if none).

    Raises:
      ValueError: a collective this reader cannot parse, or an operand whose definition
        is not in ``hlo``.
    """
    shapes: dict[str, str] = {}
    found = []
    for name, typ, opcode, args in _instructions(hlo):
        shapes[name] = typ
        op = opcode.removesuffix("-start")
        if op in OPS:
            found.append((name, typ, opcode, op, args))
    written = len(re.findall(rf"\s(?:{'|'.join(OPS)})(?:-start)?\(", hlo))
    if len(found) != written:
        raise ValueError(f"read {len(found)} of the {written} collectives in the HLO text")
    meta = {m.group(1): m.group(2) for m in re.finditer(
        r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name="((?:[^"\\]|\\.)*)"', hlo, re.M)}
    out = []
    for name, typ, opcode, op, args in found:
        operands = re.findall(r"%([\w.\-]+)", args) or [a.strip().split()[-1]
                                                         for a in args.split(",") if a.strip()]
        results = _arrays(typ)
        n = len(operands)
        # -start ops return (operands..., results..., [contexts]); take the results.
        results = results[n:2 * n] if opcode.endswith("-start") and len(results) >= 2 * n \
            else results[-n:]
        for operand, (_, elements) in zip(operands, results, strict=True):
            if operand not in shapes:
                raise ValueError(f"operand %{operand} of {opcode} %{name} is not defined in "
                                 "the HLO text")
            arrays = _arrays(shapes[operand])
            dtype, bits = arrays[0][0], _bits(arrays[0][0])
            out.append({"op": op, "name": name, "dtype": dtype,
                        "itemsize": bits // 8 if bits >= 8 else bits / 8,
                        "bytes": sum(math.ceil(c * _bits(d) / 8) for d, c in arrays),
                        "elements": elements,
                        "op_name": meta.get(name, "").replace("\\'", "'")})
    return out


def all_gathers(hlo: str) -> list[dict]:
    """The all-gathers of `collectives` (same records)."""
    return [c for c in collectives(hlo) if c["op"] == "all-gather"]
