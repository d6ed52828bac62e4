"""What an integration built on ckptpub (the vLLM plugin, its ``ckptpub preload`` supervisor) may use
besides the names of ``ckptpub`` itself, ``ckptpub.errors``, ``ckptpub.cli`` and ``ckptpub.signing``.

Integrations use only public names, so the core's layers can change beneath them. Each
name here is the core's one implementation of a rule that an integration must apply
the way the core does (``docs/design.md`` lists where each rule lives):

* reading a folder's small files: ``read_bounded`` (no symlink followed, no FIFO
  blocked on, the size bounded before a byte is read; ``OpenError`` when the open
  failed, ``.absent`` when nothing is there), ``read_inside`` (the same for a file of
  a folder, following a symlink only as ``resolve_inside`` allows: inside the folder,
  and not to ckptpub's own files, or into the blobs of the cached model whose snapshot
  the folder is), ``open_inside`` (the open alone, for a reader of a prefix such as a
  shard's header);
* opening a file by the same rule with the flags a writer or a lock needs:
  ``open_regular`` (the flags keep ``O_NOFOLLOW`` and ``O_NONBLOCK``; for an
  integration's own files, such as the vLLM plugin's relay file and the preload
  supervisor's lock and daemon logs);
* decoding: ``loads_strict`` (JSON as every ckptpub reader decodes it), ``config_meaning``
  (a config's bytes to its object and the digest its identity covers),
  ``check_identity`` (``blake3:<64 lowercase hex>`` or a ``CkptpubError``),
  ``layout_in_memory`` (the tensors of a whole safetensors file held in memory, with the
  header checks publishing applies, as a ``ShardLayout``);
* manifests: ``base_of`` (the base identity a manifest records, a fine-tune's or an
  adapter's parent, or None), ``is_adapter`` (whether it is a PEFT adapter's, as
  ``ckptpub show``/``diff`` say);
* models in the Hugging Face cache: ``locate(name, revision)``: the folder a model's
  name means (a path that exists, or a hub id's snapshot in the cache, resolved offline
  by huggingface_hub), and ``cached_model(folder)``: a real folder as a cached model
  (hub id, commit), or None;
* files shared with readers, ``jsonfiles``: ``write_json``/``write_atomically`` (replaced
  whole), ``read_json``, ``append_line``/``read_lines`` (a log, a whole line at a time);
* file names: ``MANIFEST_NAME``, ``SIGNATURE_NAME``, ``RUN_INDEX_NAME``,
  ``SAFETENSORS_INDEX_NAME``, ``TRAINER_STATE_NAME``, ``CONFIG_FILES``;
* settings: every ``CKPTPUB_*`` variable (``VARIABLES``, the ``*_ENV`` names), flags
  (``flag``, ``env_flag``: ``1/true/yes/on``, ``0/false/no/off``, anything else refused)
  and durations (``seconds``: NaN, infinities, zero and negative values refused;
  ``ckptpub.cli.seconds_argument`` is the same as an argparse ``type``).

One-line text for untrusted names is ``ckptpub.errors.one_line``; "signed or plain
manifest" is ``ckptpub.signing.read_trusted_manifest`` with ``TrustedKey.of`` or
``TrustedKey.from_environment``.
"""

from ._filesystem import jsonfiles
from ._filesystem.hub_cache import cached_model, locate
from ._filesystem.safe_open import (
    OpenError,
    open_inside,
    open_regular,
    read_bounded,
    read_inside,
    resolve_inside,
)
from ._format.manifest import check_identity, config_meaning
from ._format.names import (
    CONFIG_FILES,
    MANIFEST_NAME,
    RUN_INDEX_NAME,
    SAFETENSORS_INDEX_NAME,
    SIGNATURE_NAME,
    TRAINER_STATE_NAME,
)
from ._format.safetensors import ShardLayout, layout_in_memory
from ._format.strict_json import loads_strict
from ._operations.explain import base_of, is_adapter
from ._settings import (
    CERTIFICATE_CHAIN_ENV,
    DEBUG_ENV,
    EXPECT_IDENTITY_ENV,
    PRELOAD_IDENTITY_ENV,
    PRELOAD_STATE_DIR_ENV,
    PRELOAD_TAKEOVER_ENV,
    PUBLIC_KEY_ENV,
    REFUSAL_FILE_ENV,
    REQUIRE_MANIFEST_ENV,
    VARIABLES,
    env_flag,
    flag,
    seconds,
)

__all__ = [
    "CERTIFICATE_CHAIN_ENV",
    "CONFIG_FILES",
    "DEBUG_ENV",
    "EXPECT_IDENTITY_ENV",
    "MANIFEST_NAME",
    "PRELOAD_IDENTITY_ENV",
    "PRELOAD_STATE_DIR_ENV",
    "PRELOAD_TAKEOVER_ENV",
    "PUBLIC_KEY_ENV",
    "REFUSAL_FILE_ENV",
    "REQUIRE_MANIFEST_ENV",
    "RUN_INDEX_NAME",
    "SAFETENSORS_INDEX_NAME",
    "SIGNATURE_NAME",
    "TRAINER_STATE_NAME",
    "VARIABLES",
    "OpenError",
    "ShardLayout",
    "base_of",
    "cached_model",
    "check_identity",
    "config_meaning",
    "env_flag",
    "flag",
    "is_adapter",
    "jsonfiles",
    "layout_in_memory",
    "loads_strict",
    "locate",
    "open_inside",
    "open_regular",
    "read_bounded",
    "read_inside",
    "resolve_inside",
    "seconds",
]
