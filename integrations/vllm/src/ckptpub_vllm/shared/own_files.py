"""The plugin's own files outside any checkpoint, opened by one rule whoever opens them and what for.

The refusal relay file (:mod:`.refusals`) and ``ckptpub preload``'s lock and daemon
logs live in folders that are named by a variable or a command line and may be
shared (a temporary folder, a state folder), and are opened by name, often by another
process than the one that made them. Each open here (for reading, appending, creating
or locking) goes through the core's ``open_regular``: never through a symlink at the
name (``O_NOFOLLOW``), never blocking on a FIFO or a device (``O_NONBLOCK``), and only a
regular file (``fstat`` before a byte is read or written). A failure is a
``CkptpubError`` naming the file (``OpenError`` when the open itself failed;
``.absent``: nothing there). A folder holding such files is checked by
:func:`check_folder`: a real folder that no other user may change.

The supervisor's JSON documents and decision log are written and read by the core's
``jsonfiles``, which applies the same rule.
"""

from __future__ import annotations

import os
import stat

from ckptpub.errors import CkptpubError
from ckptpub.integration import open_regular

#: Read what another process wrote (a daemon's log, the relay file, the lock's pid).
READ = os.O_RDONLY
#: Append to a log, made if absent (a daemon's log).
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT
#: Append to a file that must already be there (the relay file another process made).
APPEND_EXISTING = os.O_WRONLY | os.O_APPEND
#: Make a new file; whatever is at the name already is refused, not reused.
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL
#: Hold an ``flock`` on it and write a pid into it (the supervisor's lock), made if absent.
LOCK = os.O_RDWR | os.O_CREAT

_ALWAYS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_own(path: str, how: int) -> int:
    """Open the regular file at ``path`` for ``how`` (:data:`READ`, :data:`APPEND`, ...); caller closes it.

    The descriptor is blocking again once it is known to be a regular file (which never
    blocks), so that a daemon handed it as its output writes as to any file.
    """
    fd, _ = open_regular(path, path, flags=how | _ALWAYS)
    os.set_blocking(fd, True)
    return fd


def read_own(path: str, limit: int, offset: int = 0) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``, from ``offset`` (one open, one ``pread``)."""
    fd = open_own(path, READ)
    try:
        return os.pread(fd, limit, offset)
    except OSError as error:
        raise CkptpubError(f"{path}: cannot read: {error.strerror or error}") from None
    finally:
        os.close(fd)


def check_folder(path: str, *, follow_symlink: bool = False) -> None:
    """Refuse ``path`` unless it is a folder that no other user may change; ``CkptpubError`` naming it.

    A symlink is followed only with ``follow_symlink`` (a folder the operator names, such
    as ``--state-dir``), never for a folder inside one. Refused, because another user
    could then plant a file at one of its names or replace what this process wrote and
    later trusts: a folder every user may write (``/tmp`` itself), and one that belongs
    to another user (root's folders excepted: an administrator's shared folder).
    """
    try:
        info = os.stat(path) if follow_symlink else os.lstat(path)
    except OSError as error:
        raise CkptpubError(f"{path}: cannot use as a folder: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CkptpubError(f"{path}: {_kind(info.st_mode)}, not a folder")
    if info.st_mode & stat.S_IWOTH:
        raise CkptpubError(
            f"{path}: every user may write this folder (mode {stat.S_IMODE(info.st_mode):o}), so any "
            "of them could plant or replace a file in it; give a folder of your own"
        )
    if info.st_uid not in (os.geteuid(), 0):
        raise CkptpubError(
            f"{path}: belongs to another user (uid {info.st_uid}), who could plant or replace a file in "
            "it; give a folder of your own"
        )


def make_folder(path: str, *, follow_symlink: bool = False) -> None:
    """Make the folder ``path`` (its parents too) if nothing is at that name, then :func:`check_folder` it."""
    if not os.path.lexists(path):
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            raise CkptpubError(f"{path}: cannot make the folder: {error.strerror or error}") from None
    check_folder(path, follow_symlink=follow_symlink)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink (not followed)"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"
