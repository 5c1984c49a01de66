"""Metrics logging: JSONL and CSV files, optional TensorBoard, and a progress bar.

`MetricsLogger` writes one record per `MetricsLogger.log` call. Values may be JAX
arrays: they are fetched to the host there (a device sync), so log every N steps,
not every step, in fast loops. `PendingMetrics` holds records of device values and
fetches them later, together, with one `jax.device_get`: a loop that fetches the
previous log point's records never waits for the step it just dispatched.

JSONL gets every record; the CSV gets the records logged with ``csv=True`` (the
default), its columns growing as new keys appear (the file is rewritten then; keep
bulky records such as per-layer diagnostics out of it). TensorBoard needs
``tensorboardX`` or ``torch``; without either, ``tensorboard=True`` raises
`ImportError` at construction.
"""

from __future__ import annotations

import csv as csv_lib
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

try:
    from tqdm.auto import tqdm
except ImportError:  # tqdm is a dependency, but keep logging usable without it
    tqdm = None


def to_host(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Fetches metric values to Python scalars (floats, ints, or strings unchanged).

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.metrics_log import to_host
      >>> to_host({"loss": jnp.float32(2.5), "mode": "recipe"})
      {'loss': 2.5, 'mode': 'recipe'}
    """
    return _scalars(jax.device_get(dict(metrics)))


def _scalars(fetched: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fetched.items():
        if isinstance(v, (str, bool, type(None))):
            out[k] = v
        elif isinstance(v, (int, np.integer)):
            out[k] = int(v)
        else:
            a = np.asarray(v)
            if a.size != 1:
                raise ValueError(f"metric {k!r} is not a scalar (shape {a.shape})")
            out[k] = int(a) if np.issubdtype(a.dtype, np.integer) else float(a)
    return out


class PendingMetrics:
    """Metrics records held on the device and fetched together, later.

    `add` keeps a record of device values (no transfer); `fetch` brings every record
    held to the host with one `jax.device_get` and returns them in the order added,
    as `to_host` would. A training loop that adds a record every N steps and fetches
    the earlier ones just before, waits only for steps long finished: the device is
    never left idle for a log line.

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.metrics_log import PendingMetrics
      >>> pending = PendingMetrics()
      >>> pending.add(10, {"loss": jnp.float32(2.5), "mode": "recipe"})
      >>> pending.add(20, {"loss": jnp.float32(2.0), "mode": "recipe"})
      >>> len(pending), pending.fetch()
      (2, [(10, {'loss': 2.5, 'mode': 'recipe'}), (20, {'loss': 2.0, 'mode': 'recipe'})])
      >>> pending.fetch()
      []
    """

    def __init__(self) -> None:
        self._records: list[tuple[int, dict[str, Any]]] = []

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Holds ``metrics`` (device arrays stay on the device) for ``step`` (a host int)."""
        self._records.append((int(step), dict(metrics)))

    def fetch(self) -> list[tuple[int, dict[str, Any]]]:
        """Every record held, as ``(step, host values)``, oldest first; then holds none."""
        records, self._records = self._records, []
        if not records:
            return []
        fetched = jax.device_get([m for _, m in records])
        return [(step, _scalars(m)) for (step, _), m in zip(records, fetched)]

    def __len__(self) -> int:
        return len(self._records)


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _tensorboard_writer(log_dir: str) -> Any:
    try:
        from tensorboardX import SummaryWriter  # noqa: PLC0415
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
        except ImportError:
            raise ImportError(
                "tensorboard=True needs `tensorboardX` or `torch` (pip install tensorboardX)"
            ) from None
    return SummaryWriter(log_dir)


class MetricsLogger:
    """Writes metrics to ``<directory>/metrics.jsonl`` and ``metrics.csv``.

    Args:
      directory: output directory (created).
      append: continue existing files (a resumed run) instead of starting afresh.
      jsonl: write ``metrics.jsonl`` (one JSON object per line, flushed per record).
      csv_file: write ``metrics.csv``.
      tensorboard: also write TensorBoard event files to ``<directory>/tb``.

    Example:
      >>> import tempfile, os
      >>> from fp4jax.metrics_log import MetricsLogger
      >>> d = tempfile.mkdtemp()
      >>> with MetricsLogger(d) as log:
      ...   _ = log.log(0, {"loss": 2.0})
      ...   _ = log.log(10, {"loss": 1.5, "val_loss": 1.7})
      >>> open(os.path.join(d, "metrics.jsonl")).read().splitlines()[1]
      '{"step": 10, "loss": 1.5, "val_loss": 1.7}'
      >>> open(os.path.join(d, "metrics.csv")).read().splitlines()
      ['step,loss,val_loss', '0,2.0,', '10,1.5,1.7']
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        append: bool = False,
        jsonl: bool = True,
        csv_file: bool = True,
        tensorboard: bool = False,
    ):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        mode = "a" if append else "w"
        self._jsonl = open(os.path.join(self.directory, "metrics.jsonl"), mode) if jsonl else None
        self._csv_path = os.path.join(self.directory, "metrics.csv") if csv_file else None
        self._csv_rows: list[dict[str, Any]] = []
        self._csv_fields: list[str] = []
        if self._csv_path is not None and append and os.path.exists(self._csv_path):
            with open(self._csv_path, newline="") as f:
                reader = csv_lib.DictReader(f)
                self._csv_fields = list(reader.fieldnames or [])
                self._csv_rows = list(reader)
        elif self._csv_path is not None:
            open(self._csv_path, "w").close()
        self._tb = _tensorboard_writer(os.path.join(self.directory, "tb")) if tensorboard else None

    def _write_csv(self, record: dict[str, Any]) -> None:
        new = [k for k in record if k not in self._csv_fields]
        self._csv_rows.append(record)
        if new or len(self._csv_rows) == 1:
            self._csv_fields += new
            with open(self._csv_path, "w", newline="") as f:  # header changed: rewrite
                w = csv_lib.DictWriter(f, fieldnames=self._csv_fields)
                w.writeheader()
                w.writerows(self._csv_rows)
        else:
            with open(self._csv_path, "a", newline="") as f:
                csv_lib.DictWriter(f, fieldnames=self._csv_fields).writerow(record)

    def log(self, step: int, metrics: Mapping[str, Any], *, csv: bool = True) -> dict[str, Any]:
        """Writes one record (to the CSV too if ``csv``); returns it with host values."""
        record = {"step": int(step), **to_host(metrics)}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({k: _json_value(v) for k, v in record.items()}) + "\n")
            self._jsonl.flush()
        if self._csv_path is not None and csv:
            self._write_csv(record)
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, record["step"])
        return record

    def close(self) -> None:
        """Closes the files."""
        for f in (self._jsonl, self._tb):
            if f is not None:
                f.close()
        self._jsonl = self._tb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed."""

    def __init__(self, iterable=None, **kwargs):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n=1):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        pass


def progress(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "",
             disable: bool | None = None, **kwargs: Any) -> Any:
    """A tqdm progress bar (``disable=None``: hidden when stderr is not a terminal).

    Update the shown metrics with ``bar.set_postfix(loss=...)``. Without tqdm
    installed, a silent stand-in with the same methods.

    Example:
      >>> from fp4jax.metrics_log import progress
      >>> sum(progress(range(3), disable=True))
      3
    """
    if tqdm is None:
        return _NoBar(iterable)
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, **kwargs)
