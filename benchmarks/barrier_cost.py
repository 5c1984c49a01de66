"""What Mosaic GPU's automatic store barriers cost the quantize kernels.

    PYTHONPATH=. python benchmarks/barrier_cost.py --out /tmp/barrier_cost.json     # GPU
    PYTHONPATH=. python benchmarks/barrier_cost.py --shapes 64x128 --interpret      # CPU smoke

Mosaic GPU brackets every store to a memory reference with warpgroup barriers unless
a kernel opts out (``unsafe_no_auto_barriers``); the two-output kernel stores 11 times
per tile, so its four warps met at 22 barriers per tile. `QuantizeConfig.store_barriers`
switches them back on. This script times the single-output (1D RNE, 1D SR) and the
two-output (RHT+SR, RHT RNE) kernels both ways, amaxes given and with the amax pass,
with each kernel's floor (bytes moved at the copy bandwidth measured in the same run)
and bit-exactness against the XLA reference (`quantize_single.main`,
`quantize_two_output.main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from pallas_kernels import quantize_single, quantize_two_output
from pallas_kernels.quantize_single import DEFAULT_CONFIG, TWO_OUTPUT_CONFIG
from pallas_kernels.timing import environment


def both_ways(config):
    """``config`` without and with the store barriers."""
    return (dataclasses.replace(config, store_barriers=False),
            dataclasses.replace(config, store_barriers=True))


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8192x8192,32768x2048",
                   help="comma-separated MxK bfloat16 inputs")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--interpret", action="store_true", help="Mosaic GPU interpret mode (CPU)")
    p.add_argument("--out", default=None, help="JSON file for the rows")
    a = p.parse_args(argv)
    rows = []
    for shape in a.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        print(f"== {m} x {k}: single-output kernels", flush=True)
        for r in quantize_single.main(m, k, both_ways(DEFAULT_CONFIG), reps=a.reps,
                                      interpret=a.interpret):
            rows.append({"m": m, "k": k, **r})
        print(f"== {m} x {k}: two-output kernels", flush=True)
        for r in quantize_two_output.main(m, k, both_ways(TWO_OUTPUT_CONFIG), reps=a.reps,
                                          interpret=a.interpret):
            rows.append({"m": m, "k": k, **r})
    env = environment()
    print(f"{env['device']}, jax {env['jax']}, {env['date']}; command: python "
          f"benchmarks/barrier_cost.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({**env, "rows": rows}, f, indent=1, default=str)
    return rows


if __name__ == "__main__":
    main()
