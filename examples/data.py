"""A real text corpus available offline everywhere: the interpreter's own Python sources.

By default the corpus is every ``*.py`` file under the running interpreter's
standard library and site-packages (``sysconfig`` paths ``stdlib``, ``purelib``,
``platlib``). Files are deduplicated by content (SHA-256), assigned to train or
validation by a hash of their content (so a file and its copies never straddle the
split), ordered by that hash (independent of the filesystem), joined with a NUL
byte between files, and tokenized as bytes (vocabulary 256). ``roots=[DIR]`` (CLI
``--data DIR``) uses any other text tree: every file that has no NUL byte in its
content.

``prose=True`` gives a second corpus of another kind from the same files: their
English prose (`prose_blocks`: docstrings and other triple-quoted strings, runs of
whole-line comments). Files are taken in the order of their content hash; a block
already seen in an earlier file is dropped (licence headers, repeated boilerplate); a
file's remaining blocks, blank lines between them, make one document; documents are
then deduplicated, split and ordered by their own hash as files are. It is about a
fifth of the Python corpus: on the CPython 3.13 used to develop it (with the project's
virtual environment), 7,061 distinct ``.py`` files (126.8 MB) give 6,069 documents
(28.3 MB).

``cache_dir=DIR`` keeps the built streams for the next process that asks for the same
corpus (`load_corpus`): a study call's later processes then skip the read and the prose
scan (12-26 s on the H200 machine's larger site-packages).

`Batches` serves training windows in a seeded random order without repetition
within an epoch, so two runs with the same seed see the same data in the same
order, and `Batches.epochs` says how much of the corpus was consumed.
`DevicePrefetcher` prepares those batches on a background thread and puts them on
the device ahead of the step that needs them, in the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import queue
import re
import sysconfig
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

SEPARATOR = b"\0"
"""Joins files in the token stream."""


def default_roots() -> list[str]:
    """The interpreter's stdlib and site-packages directories (existing, deduplicated)."""
    paths = sysconfig.get_paths()
    roots: list[str] = []
    for name in ("stdlib", "purelib", "platlib"):
        p = paths.get(name)
        if p and os.path.isdir(p):
            p = os.path.realpath(p)
            if not any(p == r or p.startswith(r + os.sep) for r in roots):
                roots = [r for r in roots if not r.startswith(p + os.sep)] + [p]
    return roots


PROSE_BLOCK = re.compile(
    rb'"""(.*?)"""'  # a triple-quoted string (docstrings), either quote
    rb"|'''(.*?)'''"
    rb"|\n((?:[ \t]*#[^\n]*(?:\n|\Z))+)",  # a newline, then consecutive whole-line comments
    re.S,
)
# `prose_blocks` scans the source with a newline put in front. Every branch begins with a
# literal byte, so the regex engine skips ahead to the next quote or newline instead of
# trying each byte (3x faster than anchoring the comment runs with (?m)^), and finds the
# same blocks: a comment run's line start is the byte after a newline that no earlier
# match took (a run keeps its own last newline; a string ends at its quotes).
_COMMENT_MARK = re.compile(rb"(?m)^[ \t]*#[ \t]?")


def prose_blocks(source: bytes, *, min_words: int = 3) -> list[bytes]:
    r"""The prose of a Python file: each triple-quoted string and each run of whole-line
    comments, lines stripped of indentation (and of the ``#``), blocks of fewer than
    ``min_words`` words dropped. One left-to-right regex scan: a ``#`` line inside a
    docstring belongs to the docstring; comments after code on a line are not read.

    Example:
      >>> src = b"def f(x):\n    '''Add one to x.'''\n    # the usual way,\n    # no more\n"
      >>> prose_blocks(src + b"    return x + 1  # not read\n")
      [b'Add one to x.', b'the usual way,\nno more']
    """
    out = []
    for m in PROSE_BLOCK.finditer(b"\n" + source):
        double, single, comments = m.groups()
        if comments is not None:
            text = _COMMENT_MARK.sub(b"", comments)
        else:
            text = double if double is not None else single
        text = b"\n".join(line.strip() for line in text.splitlines()).strip()
        if len(text.split()) >= min_words:
            out.append(text)
    return out


def _prose_documents(docs: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``{digest: file}`` -> ``{digest: prose document}`` (see the module docstring)."""
    seen: set[bytes] = set()
    out: dict[bytes, bytes] = {}
    for digest in sorted(docs):
        fresh = []
        for block in prose_blocks(docs[digest]):
            h = hashlib.sha256(block).digest()
            if h not in seen:
                seen.add(h)
                fresh.append(block)
        if fresh:
            doc = b"\n\n".join(fresh)
            out.setdefault(hashlib.sha256(doc).digest(), doc)
    return out


def _iter_files(roots: Sequence[str], suffix: str | None):
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for f in sorted(filenames):
                if suffix is None or f.endswith(suffix):
                    yield os.path.join(dirpath, f)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Corpus:
    """Byte-token streams for training and validation.

    Attributes:
      train: uint8 array, the training files joined by NUL bytes.
      val: uint8 array, the validation files.
      roots: the directories read.
      files_train: number of distinct training files.
      files_val: number of distinct validation files.
      duplicates: files skipped because their content was already seen.
      seconds: time spent loading.
      prose: the streams hold the files' prose (`prose_blocks`), not the files.
      from_cache: read from ``load_corpus``'s ``cache_dir``, not built from the files.
    """

    train: np.ndarray
    val: np.ndarray
    roots: tuple[str, ...]
    files_train: int
    files_val: int
    duplicates: int
    seconds: float
    prose: bool = False
    from_cache: bool = False

    def describe(self) -> str:
        """One line: sizes and file counts."""
        kind = " (prose of the files)" if self.prose else ""
        return (
            f"corpus{kind}: {len(self.train) / 1e6:.1f} MB train ({self.files_train} files), "
            f"{len(self.val) / 1e6:.1f} MB val ({self.files_val} files), "
            f"{self.duplicates} duplicates dropped, loaded in {self.seconds:.1f}s"
            f"{' (cached)' if self.from_cache else ''} from {', '.join(self.roots)}"
        )


def load_corpus(
    roots: Sequence[str] | None = None,
    *,
    val_fraction: float = 0.02,
    suffix: str | None = ".py",
    max_file_bytes: int = 4_000_000,
    prose: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Reads, deduplicates and splits a text tree.

    Args:
      roots: directories to read; default `default_roots` (Python sources).
      val_fraction: share of distinct files (by content hash) in validation.
      suffix: only files ending with this (None: all files). Files containing a NUL
        byte (binary files) are always skipped.
      max_file_bytes: skip larger files (generated tables, vendored blobs).
      prose: the files' English prose instead of the files (`prose_blocks`; the
        module docstring says how it is deduplicated); ``files_*`` then count documents.
      cache_dir: where to keep the built corpus for later calls (None: build it every
        time). A cached corpus serves a call with the same options over the same
        listing (each file's path, size and modification time) built by this same module
        source; anything else, or a cache file that fails its checksum, builds afresh.

    Returns:
      A `Corpus`.

    Example:
      >>> import tempfile
      >>> tree, cache = tempfile.mkdtemp(), tempfile.mkdtemp()
      >>> for i in range(60):
      ...     with open(os.path.join(tree, f"m{i}.py"), "w") as f:
      ...         _ = f.write(f"x = {i}\\n")
      >>> first = load_corpus([tree], cache_dir=cache)
      >>> again = load_corpus([tree], cache_dir=cache)
      >>> again.from_cache, bool((again.train == first.train).all())
      (True, True)
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    t0 = time.perf_counter()
    roots = default_roots() if roots is None else [os.path.realpath(r) for r in roots]
    for r in roots:
        if not os.path.isdir(r):
            raise FileNotFoundError(f"corpus root {r!r} is not a directory")
    options = dict(roots=roots, val_fraction=val_fraction, suffix=suffix,
                   max_file_bytes=max_file_bytes, prose=prose)
    cache_file = None
    if cache_dir is not None:
        cache_file = os.path.join(cache_dir, f"corpus-{_listing_key(options)}.npz")
        cached = _read_cached(cache_file)
        if cached is not None:
            return Corpus(**cached, roots=tuple(roots), prose=prose, from_cache=True,
                          seconds=time.perf_counter() - t0)
    docs: dict[bytes, bytes] = {}
    dups = 0
    for path in _iter_files(roots, suffix):
        try:
            if os.path.islink(path) or os.path.getsize(path) > max_file_bytes:
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if not data or SEPARATOR in data:  # empty, binary, or would break the separator
            continue
        digest = hashlib.sha256(data).digest()
        if digest in docs:
            dups += 1
            continue
        docs[digest] = data
    if not docs:
        raise ValueError(f"no usable files under {roots}")
    if prose:
        docs = _prose_documents(docs)
    threshold = int(val_fraction * 2**64)
    train, val = [], []
    for digest in sorted(docs):
        (val if int.from_bytes(digest[:8], "big") < threshold else train).append(docs[digest])
    if not train or not val:
        raise ValueError(
            f"{len(docs)} files are too few to split train/validation at {val_fraction}"
        )
    as_tokens = lambda parts: np.frombuffer(SEPARATOR.join(parts), np.uint8)  # noqa: E731
    built = dict(train=as_tokens(train), val=as_tokens(val), files_train=len(train),
                 files_val=len(val), duplicates=dups)
    if cache_file is not None:
        _write_cached(cache_file, built)
    return Corpus(**built, roots=tuple(roots), seconds=time.perf_counter() - t0, prose=prose)


def _listing_key(options: dict[str, Any]) -> str:
    """A digest of `load_corpus`'s options, this module's source (the build rules) and
    the listing its walk reads: every candidate file's path, size and mtime. Stat only:
    a tenth of a second or so where reading the files takes seconds."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    with open(__file__, "rb") as f:
        h.update(f.read())
    for path in _iter_files(options["roots"], options["suffix"]):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _checksum(train: np.ndarray, val: np.ndarray) -> str:
    """SHA-256 of both streams, each prefixed by its length, hashed in place (no copy of
    the 28-127 MB they hold)."""
    h = hashlib.sha256()
    for stream in (train, val):
        h.update(len(stream).to_bytes(8, "big"))
        h.update(np.ascontiguousarray(stream).data)
    return h.hexdigest()


def _read_cached(path: str) -> dict[str, Any] | None:
    """The cached streams and counts, or None where the file is missing, unreadable or
    does not match its checksum (a copy cut short: build afresh rather than fail)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            train, val = z["train"], z["val"]
            meta = json.loads(bytes(z["meta"]).decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if train.dtype != np.uint8 or val.dtype != np.uint8 or meta.get("sha256") != _checksum(
            train, val):
        return None
    return dict(train=train, val=val, files_train=int(meta["files_train"]),
                files_val=int(meta["files_val"]), duplicates=int(meta["duplicates"]))


def _write_cached(path: str, built: dict[str, Any]) -> None:
    """Writes ``built`` next to its final name and renames it into place, so a reader
    never sees half a file; a cache that cannot be written is only a slower next call."""
    meta = {k: built[k] for k in ("files_train", "files_val", "duplicates")}
    meta["sha256"] = _checksum(built["train"], built["val"])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, train=built["train"], val=built["val"],
                 meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        os.replace(tmp, path)
    except OSError:
        pass


class Batches:
    """Deterministic training batches of ``(inputs, targets)`` byte windows.

    The stream is cut into non-overlapping windows of ``seq + 1`` bytes; each
    epoch visits all windows once in an order drawn from ``seed`` (epoch ``e`` uses
    ``seed + e``). Batch ``i`` depends only on ``(seed, i)``, so a resumed run gets the
    same data.

    Args:
      tokens: uint8 token stream.
      batch: windows per batch.
      seq: tokens per window (inputs), targets are shifted by one.
      seed: order seed.
    """

    def __init__(self, tokens: np.ndarray, *, batch: int, seq: int, seed: int):
        self.tokens = tokens
        self.batch, self.seq, self.seed = batch, seq, seed
        self.num_windows = (len(tokens) - 1) // seq
        if self.num_windows < batch:
            raise ValueError(
                f"{len(tokens)} tokens give {self.num_windows} windows of {seq}, fewer than "
                f"a batch of {batch}"
            )
        self.batches_per_epoch = self.num_windows // batch
        self._order: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._order:
            rng = np.random.default_rng(self.seed + epoch)
            self._order = {epoch: rng.permutation(self.num_windows)}
        return self._order[epoch]

    def __call__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``i``: int32 arrays ``(batch, seq)`` of inputs and targets."""
        epoch, j = divmod(i, self.batches_per_epoch)
        starts = self._perm(epoch)[j * self.batch:(j + 1) * self.batch] * self.seq
        idx = starts[:, None] + np.arange(self.seq + 1)[None, :]
        w = self.tokens[idx].astype(np.int32)
        return w[:, :-1], w[:, 1:]

    def epochs(self, num_batches: int) -> float:
        """Fraction of the training stream consumed by ``num_batches`` batches."""
        return num_batches * self.batch * self.seq / max(len(self.tokens) - 1, 1)


def validation_batches(
    tokens: np.ndarray, *, batch: int, seq: int, max_batches: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Up to ``max_batches`` fixed validation batches spread evenly over ``tokens``."""
    n = (len(tokens) - 1) // seq
    if n < batch:
        raise ValueError(f"validation stream too short: {n} windows of {seq} < batch {batch}")
    count = min(max_batches, n // batch)
    picks = np.linspace(0, n - 1, count * batch).astype(np.int64) * seq
    out = []
    for b in range(count):
        idx = picks[b * batch:(b + 1) * batch, None] + np.arange(seq + 1)[None, :]
        w = tokens[idx].astype(np.int32)
        out.append((w[:, :-1], w[:, 1:]))
    return out


class _Failure(NamedTuple):
    error: BaseException


_END = object()  # the producer's last item


class DevicePrefetcher:
    """Iterates ``(i, batch_fn(i))`` for ``i`` in ``range(start, stop)``, each batch already
    on the device.

    A background thread calls ``batch_fn(i)`` in order, `jax.device_put`s the result and
    waits for the transfer, so up to ``depth`` batches wait on the device, ready, while
    the step before them runs: the training loop neither prepares data nor copies it
    on its own thread. The batches and their order are exactly ``batch_fn``'s. An
    exception in ``batch_fn`` is raised by the iteration (at its position in the
    order); the thread stops at the end, on `close`, and when a ``with`` block exits.

    Args:
      batch_fn: ``i -> batch`` (a pytree of host arrays), e.g. a `Batches`.
      start: the first index.
      stop: one past the last index.
      depth: batches prepared ahead (at least 1; 2 is double buffering).
      sharding: where to put the batches (`jax.device_put`'s ``device``; None: the
        default device).

    Example:
      >>> import numpy as np
      >>> with DevicePrefetcher(lambda i: np.full(2, i), 3, 6) as feed:
      ...   [(i, b.tolist()) for i, b in feed]
      [(3, [3, 3]), (4, [4, 4]), (5, [5, 5])]
    """

    def __init__(self, batch_fn: Callable[[int], Any], start: int, stop: int, *,
                 depth: int = 2, sharding: Any = None):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=self._produce, args=(batch_fn, range(start, stop), sharding),
            name="DevicePrefetcher", daemon=True)
        self._thread.start()

    def _produce(self, batch_fn: Callable[[int], Any], indices: range, sharding: Any) -> None:
        # A blocking put is safe: `close` sets the flag first and then empties the
        # queue, so a blocked put returns and the next check ends the thread.
        try:
            for i in indices:
                if self._closed.is_set():
                    return
                batch = jax.block_until_ready(jax.device_put(batch_fn(i), sharding))
                self._queue.put((i, batch))
            self._queue.put(_END)
        except BaseException as e:  # raised again by the consuming thread
            self._queue.put(_Failure(e))

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> tuple[int, Any]:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stops the thread and drops the batches not consumed (idempotent)."""
        self._finished = True
        self._closed.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=0.01)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
