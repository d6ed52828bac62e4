"""JSON files that readers share with a writer: documents replaced whole, records appended a line at a time.

Two shapes cover every file ckptpub writes outside a checkpoint's own bytes:

* a **document** (``ckptpub.json``, the preload supervisor's ``status.json`` and
  daemon records) is replaced atomically: written to a temporary file in the same
  folder, fsynced, renamed over the old one, and the folder fsynced, so a reader or
  a crash sees the old document, the new one, or none, never half of one. A write
  that fails removes its temporary file; in the main thread Ctrl-C is held back
  while the temporary file exists, so an interrupt never leaves one behind either;
* a **log** (``ckptpub-index.jsonl``, the supervisor's ``decisions.jsonl``) gets one
  JSON object a line, appended with one ``write`` of the whole line on an
  ``O_APPEND`` descriptor, then fsynced. A crash can at worst leave a last line
  without its newline: the next append ends it first (so its own line stays whole
  and parseable) and readers skip it.

Both are opened without following a symlink and must be regular files, so a link
planted at the name never redirects a write outside its folder. Reads are bounded
and strict (``_format.strict_json``): what a writer here wrote always reads back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

from .._format.names import TEMP_PREFIX, TEMP_SUFFIX
from .._format.strict_json import loads_strict
from ..errors import CkptpubError
from .safe_open import OpenError, open_regular, read_bounded
from .sources import read_small_file

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_atomically(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace the file at ``path`` by ``data``: temp file, fsync, rename, fsync the folder.

    The temporary file, created exclusively with ``mode`` next to ``path``, has the
    one name every ckptpub temporary file has (``.ckptpub.json.<random hex>.tmp``,
    ``names.TEMP_PREFIX``/``TEMP_SUFFIX``), which folder scans skip: a write in
    progress inside a checkpoint folder (the manifest, a signature) is never taken
    for one of its files. Whatever is at ``path`` (a file, a symlink, a FIFO) is
    replaced, never written through. Raises ``CkptpubError``: ``NAME: cannot write
    in FOLDER: why``.
    """
    write_together([(path, data)], mode)


def write_together(files: Sequence[tuple[str, bytes]], mode: int = 0o644) -> None:
    """Replace several files of one folder (``(path, data)`` each) as :func:`write_atomically` replaces one.

    Every temporary file is written and fsynced before the first rename, so a failure
    while writing (a full disk, a quota) changes nothing; then the renames follow in
    the order given (the last is the one that makes the set whole: a manifest after
    its signature) and the folder is fsynced once.
    """
    folder = os.path.dirname(files[0][0])
    staged: list[tuple[str, str]] = []  # (temporary file, path), not yet renamed
    name = os.path.basename(files[0][0])
    with _InterruptsHeld():
        try:
            for path, data in files:
                name = os.path.basename(path)
                temp = os.path.join(folder, f"{TEMP_PREFIX}{os.urandom(8).hex()}{TEMP_SUFFIX}")
                fd = os.open(temp, _CREATE_FLAGS, mode)
                staged.append((temp, path))
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
            while staged:
                temp, path = staged[0]
                name = os.path.basename(path)
                os.replace(temp, path)
                staged.pop(0)
            _fsync_folder(folder or ".")
        except OSError as error:
            raise _write_error(name, folder, error) from None
        finally:
            for temp, _ in staged:
                _remove_quietly(temp)


#: How long a writer waits for another to let go of a folder's write lock (``folder_lock``).
LOCK_TIMEOUT_S = 60.0


@contextlib.contextmanager
def folder_lock(folder: str) -> Iterator[None]:
    """Hold ckptpub's write lock of ``folder`` (``flock`` on the folder itself: no lock file is made).

    Publishes of one checkpoint take it while they write its manifest and signature,
    so two concurrent ``publish --sign`` never leave one's manifest with the other's
    signature. Waits at most ``LOCK_TIMEOUT_S`` for another writer (``CkptpubError`` then):
    anyone who can read the folder can take the lock, so a holder that never lets go
    must not block a publish for ever. A file system that cannot lock a folder (some
    NFS mounts) is written without the lock.
    """
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise CkptpubError(f"{folder}: cannot open to lock it: {error.strerror or error}") from None
    try:
        timeout_s = LOCK_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CkptpubError(
                        f"{folder}: another publish has held its write lock for {timeout_s:.0f} s; "
                        "nothing was written"
                    ) from None
                time.sleep(0.01)
            except OSError:  # EBADF, ENOLCK, EOPNOTSUPP: no flock on this file system's folders
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def write_json(path: str, value: Any, mode: int = 0o644) -> None:
    """Replace ``path`` by ``value`` as indented, key-sorted JSON (see :func:`write_atomically`)."""
    write_atomically(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"), mode)


def read_json(path: str, limit: int, display_name: str) -> Any:
    """The JSON document at ``path`` (at most ``limit`` bytes), decoded strictly; else ``CkptpubError``."""
    return loads_strict(read_bounded(path, limit, display_name), display_name, "JSON document")


def append_line(path: str, record: Mapping[str, Any], display_name: str) -> None:
    """Append ``record`` to the log at ``path`` as one JSON line (one ``write``, then fsync).

    Creates the log if needed. A symlink, FIFO or folder at ``path`` is refused
    (``CkptpubError`` naming ``display_name``), so nothing is written outside it.
    """
    line = (json.dumps(dict(record), sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    fd, info = open_regular(path, display_name, flags=_APPEND_FLAGS)
    try:
        if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
            line = b"\n" + line  # a torn line from a crashed writer: keep ours whole and parseable
        written = os.write(fd, line)
        if written != len(line):  # regular files do not short-write in practice; fail loudly if one does
            raise CkptpubError(f"{display_name}: short write ({written} of {len(line)} bytes)")
        os.fsync(fd)
    except OSError as error:
        raise CkptpubError(f"{display_name}: cannot append: {error.strerror or error}") from None
    finally:
        os.close(fd)


def read_lines(
    path: str,
    limit: int,
    display_name: str,
    on_skip: Callable[[int, str], None] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> list[tuple[int, Any]]:
    """``(line number, decoded value)`` for each JSON line of the log at ``path`` (a file, or an ``s3://``
    object); ``[]`` when it is missing.

    A line that is not JSON (a torn last line after a crash, a corrupt one), or
    whose value ``check`` says is not a record (``check(value)``: why not, or
    None), is skipped and ``on_skip(line_number, why)`` told, in line order;
    blank lines are skipped silently. A log over ``limit`` bytes, a symlink or not
    a regular file raises ``CkptpubError`` before anything is read.
    """
    try:
        data = read_small_file(path, limit, display_name)
    except OpenError as error:
        if error.absent:
            return []
        raise
    lines = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            value = loads_strict(raw, f"line {number}", "record")
            why = check(value) if check is not None else None
        except CkptpubError as error:
            why = str(error)
        if why is None:
            lines.append((number, value))
        elif on_skip is not None:
            on_skip(number, why)
    return lines


class _InterruptsHeld:
    """Hold back SIGINT while the block runs, then act on it: its Python handler runs once the block is done.

    Only the main thread can set signal handlers (and Python runs them there);
    elsewhere (the Trainer callback's publishing thread) this does nothing.
    """

    def __enter__(self) -> None:
        self.caught = False
        self.installed = False
        try:
            self.previous = signal.signal(signal.SIGINT, self._note)
            self.installed = True
        except ValueError:  # not the main thread
            pass

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.caught = True

    def __exit__(self, *exc_info: object) -> None:
        if not self.installed:
            return
        previous = signal.SIG_DFL if self.previous is None else self.previous  # None: not set from Python
        signal.signal(signal.SIGINT, previous)
        if self.caught and callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt here
        elif self.caught and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)  # what the interrupt would have done


def _write_error(name: str, folder: str, error: OSError) -> CkptpubError:
    return CkptpubError(f"{name}: cannot write in {folder}: {error.strerror or error}")


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
