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
* Lines are appended as ``jsonfiles.append_line`` appends them (one ``write`` of the
  whole line on an ``O_APPEND`` descriptor, then ``fsync``): a reader sees whole
  lines, and a crash can at worst leave a final line without its newline, which
  readers skip and the next append ends.
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

import os
from collections.abc import Callable
from typing import Any

from .._format.manifest import is_digest, is_safe_relative_path
from .._format.names import RUN_INDEX_NAME
from . import jsonfiles
from .scan import as_path

#: An index larger than this is refused unread (about 500k publishes).
MAX_INDEX_BYTES = 64 << 20


def append(index_dir: str | os.PathLike[str], *, step: int, path: str, identity: str, time: float) -> None:
    """Append one record to ``index_dir/ckptpub-index.jsonl`` atomically (whole line, fsync)."""
    record = {
        "step": int(step),
        "path": str(path).replace(os.sep, "/"),
        "identity": identity,
        "time": float(time),
    }
    index = os.path.join(index_dir, RUN_INDEX_NAME)
    jsonfiles.append_line(index, record, index)  # CkptpubError for a symlink, FIFO, folder


def read(
    index_dir: str | os.PathLike[str], on_skip: Callable[[int, str], None] | None = None
) -> list[dict[str, Any]]:
    """Return the index records in order; a missing index is an empty list.

    Lines that are not records (a torn last line after a crash, or a hostile or
    corrupt line: see the module docstring) are skipped rather than failing the
    whole read; ``on_skip(line_number, why)`` is told about each one except blank
    lines. An index that is over ``MAX_INDEX_BYTES``, a symlink or not a regular
    file raises ``CkptpubError`` before it is read.
    """
    index = os.path.join(as_path(index_dir, "run folder"), RUN_INDEX_NAME)
    lines = jsonfiles.read_lines(index, MAX_INDEX_BYTES, RUN_INDEX_NAME, on_skip, check=_not_a_record)
    return [record for _, record in lines]


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
