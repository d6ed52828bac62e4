"""Where a tensor's bytes are in a safetensors file, and a copy of a checkpoint with one tensor zeroed.

What tests and examples use to change exactly one tensor (same header, same sizes)
and then show which weights an engine served. The header is read by ckptpub's own
strict, bounded parser, the one publishing uses.
"""

from __future__ import annotations

import json
import os
import shutil

from ckptpub._filesystem.model_files import read_layout


def tensor_location(path: str, name: str) -> tuple[int, int]:
    """Absolute byte range ``[start, end)`` of tensor ``name`` in a shard; ``KeyError`` if absent."""
    layout = read_layout(path, os.path.basename(path))
    tensor = {t.name: t for t in layout.tensors}[name]
    return layout.header_size + tensor.begin, layout.header_size + tensor.end


def find_tensor_file(folder: str, name: str) -> str:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return os.path.join(folder, json.load(f)["weight_map"][name])
    return os.path.join(folder, "model.safetensors")


def copy_with_zeroed_tensor(src: str, dst: str, name: str) -> str:
    """Copy ``src`` (manifest included) and zero one tensor's bytes in place: same header, same sizes."""
    shutil.copytree(src, dst)
    path = find_tensor_file(dst, name)
    start, end = tensor_location(path, name)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))
    return dst


def stream_tensors(folder: str):  # type: ignore[no-untyped-def]
    """``(name, tensor)`` of every shard the manifest lists, as vLLM's safetensors iterator yields
    them: views of each shard's mapping."""
    from safetensors import safe_open

    import ckptpub

    for shard in ckptpub.read_manifest(folder).weights:
        with safe_open(os.path.join(folder, shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safetensors' safe_open has keys() but no __iter__
                yield name, f.get_tensor(name)
