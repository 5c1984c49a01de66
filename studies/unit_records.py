"""What a unit's result records besides its numbers, and the metrics its runs logged.

Where and how each segment of a unit ran (`environment`, with `source_tree`: the git tree
of the code that ran) and its corpus (`corpus_info`) are stored with the result;
`read_records`, `latest_by_step` and `diagnostics_samples` read back the ``metrics.jsonl``
that `train_llama.train` appends to, across the segments of a unit resumed in later calls.

Example:
  >>> records = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "loss": 2.4}]
  >>> {step: r["loss"] for step, r in latest_by_step(records, "loss").items()}
  {1: 3.0, 2: 2.4}
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from study_specs import REPO  # first: it puts examples/ on sys.path

# isort: split
import data as data_lib
import jax

from fp4jax import diagnostics


def _git(*args: str, env: dict[str, str] | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], text=True, capture_output=True,
                             timeout=60, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_tree() -> str | None:
    """Git tree hash of the working tree as it is (tracked and untracked, not ignored files).

    It names the code that ran even where the repository's HEAD is stale (the device
    machine receives a copy of the working tree): ``git log --format='%h %T'`` finds
    the commit whose tree it is. Written through a temporary index; HEAD, the index and
    the files are untouched.
    """
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        if _git("add", "-A", ".", env=env) is None:
            return None
        return _git("write-tree", env=env) or None


def environment(command: str) -> dict[str, Any]:
    """Where and how a segment of a unit ran (``git_tree``: `source_tree`; ``git_commit``:
    the copy's HEAD, which can be older than the code on a device machine; ``xla_flags``:
    the process's XLA_FLAGS, which say which autotuning picks it loaded)."""
    import jaxlib  # noqa: PLC0415

    return {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "git_commit": _git("rev-parse", "HEAD") or None,
        "git_tree": source_tree(),
        "xla_flags": os.environ.get("XLA_FLAGS") or None,
    }


def corpus_info(corpus: data_lib.Corpus) -> dict[str, Any]:
    """A corpus's sizes as stored with each result."""
    return {"train_bytes": int(len(corpus.train)), "val_bytes": int(len(corpus.val)),
            "files_train": corpus.files_train, "files_val": corpus.files_val,
            "duplicates": corpus.duplicates, "prose": corpus.prose, "roots": list(corpus.roots)}


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a line cut short by a killed process is skipped."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def latest_by_step(records: list[dict[str, Any]], key: str) -> dict[int, dict[str, Any]]:
    """``{step: record}`` of the records holding ``key``; a step logged again after a
    resume (the steps after the last checkpoint of a killed call) keeps its last record."""
    return {r["step"]: r for r in records if key in r}


def diagnostics_samples(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per diagnostics step: for each operand and statistic, the mean and max over the
    quantized layers and the layer of the max; the per-layer values at the last step."""
    by_step = {}
    for r in records:
        d = {k[len("diag/"):]: v for k, v in r.items() if k.startswith("diag/")}
        if d:
            by_step[r["step"]] = d
    samples = []
    for step in sorted(by_step):
        table = _per_layer(by_step[step])
        summary = {}
        for op in ("x", "w"):
            for stat in diagnostics.STAT_NAMES:
                vals = {layer: ops[op][stat] for layer, ops in table.items()
                        if op in ops and ops[op].get(stat) is not None}
                if vals:
                    worst = max(vals, key=vals.get)
                    summary[f"{op}/{stat}"] = {"mean": sum(vals.values()) / len(vals),
                                               "max": vals[worst], "max_layer": worst}
        samples.append({"step": step, "layers": len(table), "summary": summary})
    if samples:
        samples[-1]["per_layer"] = dict(sorted(_per_layer(by_step[max(by_step)]).items()))
    return samples


def _per_layer(flat: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """``{"layer/op/stat": v}`` -> ``{layer: {op: {stat: v}}}``."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for key, v in flat.items():
        layer, op, stat = key.rsplit("/", 2)
        table.setdefault(layer, {}).setdefault(op, {})[stat] = v
    return table

