"""A slow filesystem on this machine: a FUSE pass-through mount that waits on every request and counts them.

Engine start on a network or object-store filesystem is dominated by the number of
requests it makes, each paying a round trip. ``SlowFS`` mounts a folder read-only at
a mount point, answers every request from the folder after sleeping ``latency_s``
(20 ms by default), and counts requests per path and per kind (``getattr`` for
every ``stat`` and path lookup, ``open``, ``read``, ``release``, ``opendir``,
``readdir``, ``readlink``, ...). The kernel sends it every request whoever makes it,
so it also counts the opens and reads that safetensors makes from Rust, which
Python's audit hooks never see.

``bandwidth_bps`` caps the bytes the mount serves per second (all readers together),
a stand-in for one node's link to shared storage.

    with SlowFS(source, mountpoint, latency_s=0.02) as fs:
        fs.reset()
        os.listdir(mountpoint)
        print(fs.requests().count(kinds={"readdir"}))

Choices that make the counts mean "requests a remote filesystem would get":
- The kernel caches no attributes, lookups or failed lookups (``attr_timeout``,
  ``entry_timeout`` and ``negative_timeout`` are 0): every ``stat`` and path walk
  reaches the filesystem, as on a network filesystem without a metadata cache.
- File contents are cached only while a file is open (each ``open`` drops the
  cached pages, libfuse's default), so mapped shards are read through the mount.
- ``readdir`` answers names only, so listing a folder does not look up its files.
- Requests run in parallel (libfuse's threads), each sleeping on its own.
- Operations that are not implemented (``flush``, ``getxattr``...) are answered by
  libfuse with ENOSYS and are neither counted nor delayed.
- The kernel sends ``release`` after ``close`` has returned; reading or resetting
  the counts first waits (up to 1 s) until every opened file and folder has been
  released, so a late ``release`` is not counted in the next window.

The server runs in its own process (this file run as a script), not in the one that
reads the mount: a FUSE server in the reading process deadlocks as soon as a thread
that holds the GIL faults on a mapped page of the mount (safetensors maps shards),
and its callbacks would compete with the measured work for the GIL. The mounting
process reads the counts through the server's stdin and stdout (one command per
line, one JSON answer per line). The server unmounts itself when its stdin closes,
so a killed parent does not leave a mount behind.

Needs ``/dev/fuse``, ``fusermount3`` (Debian package ``fuse3``) and the Python
binding ``mfusepy``; :class:`FuseUnavailableError` says which is missing.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

DEFAULT_LATENCY_S = 0.020


class FuseUnavailableError(RuntimeError):
    """FUSE cannot mount here; the message says what is missing."""


@dataclass(frozen=True)
class Requests:
    """Requests the filesystem received: ``by_path["/dir/file"]["open"] == 2``."""

    by_path: dict[str, dict[str, int]]

    def count(
        self, kinds: Iterable[str] | None = None, match: Callable[[str], bool] = lambda path: True
    ) -> int:
        """Requests of these kinds (all when ``None``) on paths for which ``match`` is true."""
        wanted = None if kinds is None else set(kinds)
        return sum(
            n
            for path, per_kind in self.by_path.items()
            if match(path)
            for kind, n in per_kind.items()
            if wanted is None or kind in wanted
        )

    def by_kind(self, match: Callable[[str], bool] = lambda path: True) -> dict[str, int]:
        """Requests per kind on the paths for which ``match`` is true."""
        total: Counter[str] = Counter()
        for path, per_kind in self.by_path.items():
            if match(path):
                total.update(per_kind)
        return dict(total)


def missing_requirement() -> str | None:
    """Why FUSE cannot mount here, or ``None`` when everything it needs is present."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the Python package mfusepy is not installed (pip install -r requirements/dev.txt)"
    return None


class SlowFS:
    """Mount ``source`` read-only at ``mountpoint`` with ``latency_s`` on every request.

    A context manager: the mount lasts for the block.
    """

    def __init__(
        self,
        source: str,
        mountpoint: str,
        latency_s: float = DEFAULT_LATENCY_S,
        start_timeout_s: float = 30.0,
        bandwidth_bps: float | None = None,
    ) -> None:
        self.source = os.path.abspath(source)
        self.mountpoint = os.path.abspath(mountpoint)
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.start_timeout_s = start_timeout_s
        self._server: subprocess.Popen | None = None
        self._stderr = None
        self._lock = threading.Lock()

    def __enter__(self) -> SlowFS:
        if self._server is None:  # not started by an explicit start()
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the server and wait until the mount answers; :class:`FuseUnavailableError` if it cannot."""
        if self._server is not None:
            raise RuntimeError(f"{self.mountpoint} is already mounted by this SlowFS")
        reason = missing_requirement()
        if reason is not None:
            raise FuseUnavailableError(reason)
        os.makedirs(self.mountpoint, exist_ok=True)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (the server's stderr, closed by close())
        self._server = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                self.source,
                self.mountpoint,
                repr(self.latency_s),
                repr(self.bandwidth_bps or 0.0),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        try:
            ready = self._read_answer(self.start_timeout_s)
        except FuseUnavailableError:
            self.close()
            raise
        if ready != {"ready": True} or not os.path.ismount(self.mountpoint):
            self.close()
            raise FuseUnavailableError(f"the FUSE server did not mount {self.mountpoint}: {ready}")

    def requests(self) -> Requests:
        """The requests counted since the mount or the last :meth:`reset`."""
        return Requests(self._ask("counts"))

    def reset(self) -> None:
        """Set every counter to zero."""
        self._ask("reset")

    def close(self) -> None:
        """Unmount (lazily if the mount is busy) and stop the server; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        if os.path.ismount(self.mountpoint):
            done = subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True)
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()
        self._stderr.close()

    def _ask(self, command: str):
        with self._lock:
            if self._server is None:
                raise RuntimeError("the slow filesystem is not mounted")
            self._server.stdin.write(command + "\n")
            self._server.stdin.flush()
            return self._read_answer(10.0)

    def _read_answer(self, timeout_s: float):
        server = self._server
        readable, _, _ = select.select([server.stdout], [], [], timeout_s)
        line = server.stdout.readline() if readable else ""
        if not line:
            if readable or server.poll() is not None:
                server.wait()
                self._stderr.seek(0)
                last = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise FuseUnavailableError(f"the FUSE server exited (rc {server.returncode}): {last[0]}")
            raise FuseUnavailableError(f"the FUSE server did not answer within {timeout_s:.0f} s")
        return json.loads(line)


# -- the server process ------------------------------------------------------------------------


def _serve(source: str, mountpoint: str, latency_s: float, bandwidth_bps: float = 0.0) -> None:
    import mfusepy

    link_free_at = [0.0]  # when the capped link has sent every byte asked of it so far
    link_lock = threading.Lock()

    def through_link(size: int) -> None:
        """Wait until ``size`` more bytes could have crossed the capped link (shared by all reads)."""
        if bandwidth_bps <= 0:
            return
        with link_lock:
            start = max(time.monotonic(), link_free_at[0])
            link_free_at[0] = start + size / bandwidth_bps
            done = link_free_at[0]
        time.sleep(max(0.0, done - time.monotonic()))

    counts: dict[str, Counter[str]] = {}
    counts_lock = threading.Lock()
    open_handles = [0]  # files and folders opened and not yet released
    handles_changed = threading.Condition()
    answer_lock = threading.Lock()

    def answer(value) -> None:
        with answer_lock:
            sys.stdout.write(json.dumps(value) + "\n")
            sys.stdout.flush()

    def request(kind: str):
        """Count the request on its path, then wait ``latency_s`` before answering it."""

        def wrap(method):
            def handler(self, path, *args):
                with counts_lock:
                    counts.setdefault(path, Counter())[kind] += 1
                time.sleep(latency_s)
                return method(self, path, *args)

            handler.__name__ = method.__name__
            return handler

        return wrap

    def handles(delta: int) -> None:
        with handles_changed:
            open_handles[0] += delta
            handles_changed.notify_all()

    def settle(timeout_s: float = 1.0) -> None:
        """Wait for the releases of closed files: the kernel sends them after ``close`` returns."""
        with handles_changed:
            handles_changed.wait_for(lambda: open_handles[0] == 0, timeout=timeout_s)

    def real(path: str) -> str:
        return os.path.join(source, path.lstrip("/"))

    def fs_error(e: OSError):
        return mfusepy.FuseOSError(e.errno or errno.EIO)

    class PassThrough(mfusepy.Operations):
        use_ns = True

        def init(self, path):
            answer({"ready": True})

        @request("getattr")
        def getattr(self, path, fh=None):
            try:
                st = os.lstat(real(path))
            except OSError as e:
                raise fs_error(e) from None
            return {
                "st_mode": st.st_mode,
                "st_nlink": st.st_nlink,
                "st_uid": st.st_uid,
                "st_gid": st.st_gid,
                "st_size": st.st_size,
                "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns,
            }

        @request("readlink")
        def readlink(self, path):
            try:
                return os.readlink(real(path))
            except OSError as e:
                raise fs_error(e) from None

        @request("access")
        def access(self, path, amode):
            if not os.access(real(path), amode, follow_symlinks=False):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        @request("open")
        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            try:
                fd = os.open(real(path), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as e:
                raise fs_error(e) from None
            handles(+1)
            return fd

        @request("read")
        def read(self, path, size, offset, fh):
            data = os.pread(fh, size, offset)
            through_link(len(data))
            return data

        @request("release")
        def release(self, path, fh):
            os.close(fh)
            handles(-1)
            return 0

        @request("opendir")
        def opendir(self, path):
            handles(+1)
            return 0

        @request("readdir")
        def readdir(self, path, fh):
            try:
                return [".", "..", *sorted(os.listdir(real(path)))]
            except OSError as e:
                raise fs_error(e) from None

        @request("releasedir")
        def releasedir(self, path, fh):
            handles(-1)
            return 0

        @request("statfs")
        def statfs(self, path):
            st = os.statvfs(real(path))
            return {
                key: getattr(st, key)
                for key in (
                    "f_bsize",
                    "f_frsize",
                    "f_blocks",
                    "f_bfree",
                    "f_bavail",
                    "f_files",
                    "f_ffree",
                    "f_favail",
                    "f_flag",
                    "f_namemax",
                )
            }

    def control() -> None:
        """Answer the mounting process; unmount when it goes away (stdin closed)."""
        for line in sys.stdin:
            command = line.strip()
            if command in ("counts", "reset"):
                settle()
            if command == "counts":
                with counts_lock:
                    answer({path: dict(per_kind) for path, per_kind in counts.items()})
            elif command == "reset":
                with counts_lock:
                    counts.clear()
                answer({"reset": True})
            else:
                answer({"error": f"unknown command {command!r}"})
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)

    threading.Thread(target=control, daemon=True).start()
    mfusepy.FUSE(
        PassThrough(),
        mountpoint,
        foreground=True,
        ro=True,
        fsname="slowfs",
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
