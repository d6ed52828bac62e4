"""What a folder says about its model: which safetensors files are the weights, and the config's meaning.

These rules mirror what an inference engine loads (vLLM: the top-level
``*.safetensors`` files, restricted to those ``model.safetensors.index.json`` names
when it exists), so the identity covers exactly the tensors an engine would hold.
Publishing and verifying both use them, so a manifest that claims other weight
files or another config than the folder's own is caught.
"""

from __future__ import annotations

from .errors import CkptpubError
from .manifest import CONFIG_FILES, config_digest
from .safetensors import ShardLayout
from .scan import FolderEntry
from .strict_json import loads_strict, read_bounded

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from collections.abc import Mapping

INDEX_NAME = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 64 << 20


def weight_files(entries: Mapping[str, FolderEntry], layouts: Mapping[str, ShardLayout]) -> tuple[str, ...]:
    """The weight files, sorted; each tensor name must occur in only one of them."""
    top_level = sorted(p for p in layouts if "/" not in p)
    index = entries.get(INDEX_NAME)
    if index is not None:
        top_level = _files_named_by_index(index, layouts)
    owner: dict[str, str] = {}
    for path in top_level:
        for tensor in layouts[path].tensors:
            if tensor.name in owner:
                raise CkptpubError(f"{path}: tensor {tensor.name!r} is also in {owner[tensor.name]}")
            owner[tensor.name] = path
    return tuple(top_level)


def config_digests(entries: Mapping[str, FolderEntry]) -> dict[str, str]:
    """Digest of the meaning of each top-level config file present."""
    digests = {}
    for name in CONFIG_FILES:
        entry = entries.get(name)
        if entry is None:
            continue
        document = loads_strict(read_bounded(entry.real_path, MAX_CONFIG_BYTES, name), name, "config")
        if not isinstance(document, dict):
            raise CkptpubError(f"{name}: config is not a JSON object")
        digests[name] = config_digest(document)
    return digests


def _files_named_by_index(index: FolderEntry, layouts: Mapping[str, ShardLayout]) -> list[str]:
    document = loads_strict(read_bounded(index.real_path, MAX_INDEX_BYTES, INDEX_NAME), INDEX_NAME, "index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CkptpubError(f"{INDEX_NAME}: weight_map must map tensor names to file names")
    names_by_file: dict[str, set[str]] = {}
    for tensor, file in weight_map.items():
        names_by_file.setdefault(file, set()).add(tensor)
    for file, tensors in sorted(names_by_file.items()):
        layout = layouts.get(file) if "/" not in file else None
        if layout is None:
            raise CkptpubError(f"{INDEX_NAME}: names {file!r}, which is missing from the folder")
        absent = tensors - {t.name for t in layout.tensors}
        if absent:
            raise CkptpubError(f"{INDEX_NAME}: maps tensor {min(absent)!r} to {file}, which does not hold it")
    return sorted(names_by_file)
