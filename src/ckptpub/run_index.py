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

Stdlib only, so ``import ckptpub`` stays light.
"""
from __future__ import annotations

import json
import os
from typing import Any

from .strict_json import read_bounded

INDEX_NAME = "ckptpub-index.jsonl"
#: An index larger than this is refused unread (about 500k publishes).
MAX_INDEX_BYTES = 64 << 20


def append(index_dir: str | os.PathLike, *, step: int, path: str, identity: str, time: float) -> None:
    """Append one record to ``index_dir/ckptpub-index.jsonl`` atomically (whole line, fsync)."""
    record = {"step": int(step), "path": str(path).replace(os.sep, "/"), "identity": identity, "time": float(time)}
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(os.path.join(index_dir, INDEX_NAME), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a torn line from a crashed writer: keep ours whole and parseable
        written = os.write(fd, line)
        if written != len(line):  # regular files do not short-write in practice; fail loudly if one does
            raise OSError(f"short write to {INDEX_NAME}: {written} of {len(line)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def read(index_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Return the index records in order; a missing index is an empty list.

    Lines that are not complete JSON objects (a torn last line after a crash) are
    skipped rather than failing the whole read. An index over ``MAX_INDEX_BYTES``
    raises ``CkptpubError`` before it is read.
    """
    path = os.path.join(index_dir, INDEX_NAME)
    if not os.path.lexists(path):
        return []
    data = read_bounded(path, MAX_INDEX_BYTES, INDEX_NAME)
    records = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and {"step", "path", "identity"} <= rec.keys():
            records.append(rec)
    return records
