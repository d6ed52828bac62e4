"""Every file name ckptpub reads or writes, or that decides what it does with a folder, in one place.

Two files once shared the name ``INDEX_NAME`` in two modules: here each name says
which file it is. Names of files other programs write (the safetensors index, the
Trainer's state) are listed because ckptpub's rules depend on them.
"""

from __future__ import annotations

#: The manifest, at the top of a checkpoint folder (``docs/format.md``).
MANIFEST_NAME = "ckptpub.json"
#: The signature ``publish --sign`` writes beside the manifest (``ckptpub.signing``).
SIGNATURE_NAME = "model.sig"
#: A training run's index of published checkpoints, in its output folder (``_filesystem.run_index``).
RUN_INDEX_NAME = "ckptpub-index.jsonl"
#: Prefix and suffix of every temporary file an atomic write makes (``_filesystem.jsonfiles``).
TEMP_PREFIX = "." + MANIFEST_NAME + "."
TEMP_SUFFIX = ".tmp"
#: Top-level names that are never content: checked by whoever reads them, never hashed into a manifest.
NOT_CONTENT = (MANIFEST_NAME, SIGNATURE_NAME)

#: Config files whose meaning (not formatting) is part of the identity.
CONFIG_FILES = ("config.json", "adapter_config.json")
#: The safetensors index (written by transformers): when present, the shards it names are the weights.
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
#: What the Trainer writes last into a checkpoint folder, before it rotates old ones away.
TRAINER_STATE_NAME = "trainer_state.json"


def is_temp_name(name: str) -> bool:
    """True for the name of a temporary file an atomic write uses."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)


def is_ckptpub_file(name: str) -> bool:
    """True for the manifest's and signature's names and ckptpub's own temporary files' (top level only)."""
    return name in NOT_CONTENT or is_temp_name(name)
