"""A Hugging Face cache built offline, laid out as huggingface_hub lays one out.

No hub is reachable here, so a model folder is put into ``HF_HOME/hub`` by hand:
``models--org--name/blobs/<sha256>`` (the bytes), ``refs/main`` (the commit, no
newline) and ``snapshots/<commit>/<file>`` (a relative symlink to its blob). With
``shared=True`` each blob is then moved into the cache's shared store by
huggingface_hub's own ``publish_blob_to_shared_store``, as it does for Xet downloads
(``blobs/<etag>`` becomes a symlink to ``<cache>/blobs/<2 hex>/<64 hex>``). The tests
check that huggingface_hub and transformers resolve what this builds; they never
take the layout on this module's word. ``SilentHub`` is a hub endpoint that never
answers (``HF_ENDPOINT``), to show that nothing waits on one.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
from pathlib import Path


def cache_dir(hf_home: str | os.PathLike[str]) -> str:
    """``HF_HUB_CACHE`` for ``HF_HOME=hf_home`` (huggingface_hub's default)."""
    return os.path.join(os.fspath(hf_home), "hub")


def cache_model(
    hf_home: str | os.PathLike[str],
    repo_id: str,
    source: str | os.PathLike[str],
    *,
    commit_seed: str = "",
    shared: bool = False,
    ref: str = "main",
) -> str:
    """Put the files of the folder ``source`` into the cache as ``repo_id``'s commit; return the snapshot.

    The commit hash is derived from the files (and ``commit_seed``), so two calls with
    other files make two revisions of one repository; ``ref`` then points at the last.
    """
    from huggingface_hub.file_download import repo_folder_name

    repository = os.path.join(cache_dir(hf_home), repo_folder_name(repo_id=repo_id, repo_type="model"))
    files = sorted(p for p in Path(source).rglob("*") if p.is_file())
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1((commit_seed + "".join(digests.values())).encode()).hexdigest()
    snapshot = os.path.join(repository, "snapshots", commit)
    os.makedirs(os.path.join(repository, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repository, "refs"), exist_ok=True)
    for path, digest in digests.items():
        blob = os.path.join(repository, "blobs", digest)
        if not os.path.lexists(blob):
            with open(blob, "wb") as f:
                f.write(path.read_bytes())
            if shared:
                _share(blob, digest, cache_dir(hf_home))
        link = os.path.join(snapshot, path.relative_to(source).as_posix())
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(repository, "refs", ref), "w") as f:
        f.write(commit)
    return snapshot


def _share(blob: str, digest: str, cache: str) -> None:
    from huggingface_hub.utils._shared_blobs import publish_blob_to_shared_store

    size = os.path.getsize(blob)
    assert publish_blob_to_shared_store(blob_path=blob, xet_hash=digest, cache_dir=cache, expected_size=size)
    assert os.path.islink(blob)


def cache_state(hf_home: str | os.PathLike[str]) -> dict[str, tuple[object, ...]]:
    """Every entry of the cache but ckptpub's manifests: a link's target, a file's bytes and stat, a
    folder's times.

    Equal before and after an operation: nothing of the cache was changed, moved or touched.
    """
    root = cache_dir(hf_home)
    state: dict[str, tuple[object, ...]] = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            if name == "ckptpub.json":
                continue
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                state[key] = ("link", os.readlink(path), info.st_mtime_ns)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                state[key] = ("file", digest, info.st_size, info.st_mtime_ns, info.st_ino, info.st_mode)
            else:
                state[key] = ("folder", info.st_mode, info.st_mtime_ns)
    return state


class SilentHub:
    """A socket that accepts connections and never answers; counts what connected."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.connections.append(self.server.accept()[0])
            except OSError:
                return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def close(self) -> None:
        self.server.close()
        for connection in self.connections:
            connection.close()
