"""A ``stat``-only check at engine start that the folder is still the one published.

Hashing is what proves bytes, but an engine that maps weights from a daemon never
reads the folder, and an in-place edit after publishing (a re-save, a copy that
went wrong, a truncated sync) usually changes a file's size. Comparing the size of
every file the manifest lists, and noticing weight files it does not list, costs one
``stat`` per file and one directory listing: no file of the checkpoint is opened.
(The manifest format records no mtimes, so sizes are all there is to compare.)
"""

from __future__ import annotations

import os

import ckptpub

from .errors import RefusedError


def stale_files(folder: str, manifest: "ckptpub.Manifest") -> list[str]:
    """Human-readable differences between the folder and the manifest's file list."""
    problems: list[str] = []
    root = os.path.realpath(folder)
    for record in manifest.files:
        path = os.path.join(folder, record.path)
        if os.path.islink(path) and os.path.commonpath([root, os.path.realpath(path)]) != root:
            problems.append(f"{record.path} is a symlink out of the folder")
            continue
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            problems.append(f"{record.path} is missing")
            continue
        if size != record.size:
            problems.append(f"{record.path} has {size} bytes, the manifest says {record.size}")
    listed = {record.path for record in manifest.files}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors") and name not in listed:
            problems.append(f"{name} is not in the manifest")
    return problems


def check_not_stale(folder: str, manifest: "ckptpub.Manifest") -> None:
    problems = stale_files(folder, manifest)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RefusedError(
            f"ckptpub: refusing {folder}: changed since it was published: {problems[0]}{more}; "
            f"run `ckptpub verify {folder}` or publish it again"
        )
