"""The run index: one JSON line per published checkpoint, in a run's output folder.

Why a separate file: tools that follow a training run (``ckptpub ls``, the vLLM
daemon supervisor) need "which steps are published, with which identity" without
opening every checkpoint folder or racing with ``save_total_limit`` rotation. A
JSON Lines file that is only ever appended to is the simplest thing that several
readers can tail while one writer appends.

Format (``ckptpub-index.jsonl`` in the Trainer's ``output_dir``), one object a line::

    {"step": 10, "path": "checkpoint-10", "identity": "blake3:<64 hex>", "time": 1764412345.123}

* ``path`` is relative to the folder holding the index, with ``/`` separators
  (``run-3/checkpoint-10`` under hyper-parameter search).
* ``time`` is seconds since the epoch (float) when the manifest was written.
* Lines are appended with one ``os.write`` of the whole line on an ``O_APPEND``
  descriptor, then ``fsync``: a reader sees whole lines, and a crash can at worst
  leave a final line without its newline, which readers skip.
* A line names a checkpoint that was published; the folder may since have been
  rotated away. Readers check the folder (and its manifest) before trusting it.
* Unknown keys may be added later; readers ignore them.
* The index is opened without following a symlink (a link named like the index
  is refused, so appending never writes outside the run folder) and must be a
  regular file. Readers skip, and report, lines that are not records: not JSON, a
  ``step`` that is not a non-negative integer (``1e999``, ``"10"``, ``true``), a
  ``path`` that is not a safe relative path, an ``identity`` that is not a digest.

Stdlib only, so ``import ckptpub`` stays light.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .errors import CkptpubError
from .manifest import is_digest, is_safe_relative_path
from .safe_open import open_regular
from .scan import as_path
from .strict_json import loads_strict, read_bounded

INDEX_NAME = "ckptpub-index.jsonl"
#: An index larger than this is refused unread (about 500k publishes).
MAX_INDEX_BYTES = 64 << 20
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def append(index_dir: str | os.PathLike, *, step: int, path: str, identity: str, time: float) -> None:
    """Append one record to ``index_dir/ckptpub-index.jsonl`` atomically (whole line, fsync)."""
    record = {
        "step": int(step),
        "path": str(path).replace(os.sep, "/"),
        "identity": identity,
        "time": float(time),
    }
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    path = os.path.join(index_dir, INDEX_NAME)
    fd, info = open_regular(path, path, flags=_APPEND_FLAGS)  # CkptpubError for a symlink, FIFO, folder
    try:
        size = info.st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a torn line from a crashed writer: keep ours whole and parseable
        written = os.write(fd, line)
        if written != len(line):  # regular files do not short-write in practice; fail loudly if one does
            raise OSError(f"short write to {INDEX_NAME}: {written} of {len(line)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def read(
    index_dir: str | os.PathLike, on_skip: Callable[[int, str], None] | None = None
) -> list[dict[str, Any]]:
    """Return the index records in order; a missing index is an empty list.

    Lines that are not records (a torn last line after a crash, or a hostile or
    corrupt line: see the module docstring) are skipped rather than failing the
    whole read; ``on_skip(line_number, why)`` is told about each one except blank
    lines. An index that is over ``MAX_INDEX_BYTES``, a symlink or not a regular
    file raises ``CkptpubError`` before it is read.
    """
    path = os.path.join(as_path(index_dir, "run folder"), INDEX_NAME)
    if not os.path.lexists(path):
        return []
    data = read_bounded(path, MAX_INDEX_BYTES, INDEX_NAME)
    records = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            rec = loads_strict(raw, f"line {number}", "record")
            why = _not_a_record(rec)
        except CkptpubError as error:
            why = str(error)
        if why is None:
            records.append(rec)
        elif on_skip is not None:
            on_skip(number, why)
    return records


def _not_a_record(rec: Any) -> str | None:
    """Why a decoded line is not an index record, or None."""
    if not isinstance(rec, dict) or not {"step", "path", "identity"} <= rec.keys():
        return "not an object with step, path and identity"
    step, path = rec["step"], rec["path"]
    if type(step) is not int or not 0 <= step < 2**63:
        return f"step {step!r} is not a non-negative integer"
    if not isinstance(path, str) or not is_safe_relative_path(path):
        return f"path {path!r} is not a safe relative path"
    if not is_digest(rec["identity"]):
        return f"identity {rec['identity']!r} is not a blake3 digest"
    return None
