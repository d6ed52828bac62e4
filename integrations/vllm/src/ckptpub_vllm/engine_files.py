"""The files an engine reads besides the weights: configs, tokenizer, chat templates.

Streaming verification covers every tensor, and a daemon holds exactly the
identity's tensors, but vLLM also reads ``config.json``, ``generation_config.json``,
the tokenizer files and chat templates from the folder itself, on every start and
whichever path the weights take. A same-size edit of one of them (a changed
``rope_theta``, another chat template) would serve a different model under the
manifest's identity, and so would such a file added after publishing.

So every top-level file whose name an engine may read (:func:`engine_reads`) must be
listed in the manifest and is hashed whole, whatever its size, and a config's
meaning must be the one the identity was computed from (a forged manifest that
recorded other config bytes is refused too). The weight shards are never opened,
read or ``stat``-ed here: the work is one directory listing plus one open, ``fstat``
and read per engine file, the same for 16 shards or 163.
"""

from __future__ import annotations

import os

import ckptpub
from ckptpub.integration import SAFETENSORS_INDEX_NAME, TRAINER_STATE_NAME, config_meaning

from .errors import RefusedError
from .folder_reads import UnreadableError, read_prefix

#: Names read by vLLM's config code and by transformers' tokenizer and processor loaders.
_EXACT_NAMES = frozenset({"merges.txt", "vocab.txt", "params.json", "tekken.json"})
_PREFIXES = (
    "tokenizer",
    "chat_template",
    "vocab",
    "special_tokens",
    "added_tokens",
    "spiece",
    "sentencepiece",
)
_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken")
#: Not read by an engine: the manifest (read and validated on its own), the shard index (read only
#: on the disk path, whose shards stream verified anyway) and training state, ``ckptpub verify``'s business.
_NOT_READ = frozenset({ckptpub.MANIFEST_NAME, SAFETENSORS_INDEX_NAME, TRAINER_STATE_NAME})
#: Subfolder of extra chat templates that transformers lists and reads.
TEMPLATES_FOLDER = "additional_chat_templates"


def engine_reads(path: str) -> bool:
    """Whether an engine may read this '/'-separated path of a checkpoint folder."""
    folder, _, name = path.rpartition("/")
    if folder:
        return folder == TEMPLATES_FOLDER and name.endswith(".jinja")
    if name in _NOT_READ or name.endswith(".safetensors"):
        return False
    return name in _EXACT_NAMES or name.startswith(_PREFIXES) or name.endswith(_SUFFIXES)


def engine_file_problems(folder: str, manifest: ckptpub.Manifest) -> list[str]:
    """Human-readable differences between the folder's engine files and the manifest."""
    listed = {record.path: record for record in manifest.files if engine_reads(record.path)}
    problems = [
        f"{path} is not in the manifest, and an engine reads it"
        for path in _present_engine_files(folder)
        if path not in listed
    ]
    for _, record in sorted(listed.items()):
        try:
            read_published(folder, record, manifest)
        except FileMismatchError as problem:
            problems.append(str(problem))
    return problems


class FileMismatchError(Exception):
    """How a file differs from its manifest record; the message starts with the file's path."""


def read_published(folder: str, record: ckptpub.FileRecord, manifest: ckptpub.Manifest) -> bytes:
    """The bytes of the file ``record`` describes, once they are exactly the published ones.

    Read once, whole, bounded by the recorded size, without following a symlink out
    of the folder; a config must also mean what the manifest's identity covers.
    Raises ``FileMismatchError`` otherwise.
    """
    path = record.path
    try:
        data, _ = read_prefix(folder, path, record.size + 1)
    except UnreadableError as error:
        raise FileMismatchError(f"{path} {error}") from None
    if len(data) != record.size:
        raise FileMismatchError(f"{path} has {len(data)} bytes, the manifest says {record.size}")
    if ckptpub.tensor_digest(data) != record.digest:
        raise FileMismatchError(f"{path}: bytes differ from the manifest")
    if path in manifest.config and _config_meaning(path, data) != manifest.config[path]:
        raise FileMismatchError(f"{path}: the manifest records another config meaning (forged manifest?)")
    return data


def check_engine_files(folder: str, manifest: ckptpub.Manifest) -> None:
    """Refuse unless every file an engine reads is exactly as published."""
    problems = engine_file_problems(folder, manifest)
    if problems:
        raise RefusedError.for_problems(folder, problems, hint=f"run `ckptpub verify {folder}`")


def _present_engine_files(folder: str) -> list[str]:
    """Engine-read paths that exist in the folder, from one listing (two with extra templates)."""
    try:
        names = os.listdir(folder)
    except OSError as error:
        raise RefusedError(folder, f"cannot list it ({error.strerror or error})") from None
    paths = [name for name in names if engine_reads(name)]
    if TEMPLATES_FOLDER in names:
        try:
            templates = os.listdir(os.path.join(folder, TEMPLATES_FOLDER))
        except OSError:  # not a listable folder: a file by that name is not read as templates
            templates = []
        paths += [f"{TEMPLATES_FOLDER}/{name}" for name in templates if name.endswith(".jinja")]
    return sorted(paths)


def _config_meaning(path: str, data: bytes) -> str | None:
    """The config digest of ``data``; None for a config no manifest records.

    The core's one config reader (``ckptpub.integration.config_meaning``, the one
    publish and verify use), so text that is not a JSON object or that canonical JSON
    cannot write (NaN, ``1e400``, duplicate keys, nesting too deep) has no meaning: a
    forged manifest may list such a config with matching bytes, and it must be
    refused like any other mismatch.
    """
    try:
        return config_meaning(data, path)[1]
    except ckptpub.CkptpubError:
        return None
