"""What an inference engine checks before and while it serves a published checkpoint, engine-neutral.

The vLLM plugin uses exactly these, and so does any other engine integration: it
adapts its engine's types (a model reference, tensors, ranks) and decides nothing of
its own. Nothing here imports torch or an engine.

>>> from ckptpub.serving import Policy, StreamVerifier, check_engine_files, trusted_model
>>> model = trusted_model("runs/x/checkpoint-1200", policy=Policy())   # doctest: +SKIP
>>> model.cache_key                                    # the manifest's identity   # doctest: +SKIP
'blake3:...'
>>> check_engine_files(model.folder, model.manifest)   # configs, tokenizer, templates   # doctest: +SKIP
>>> verifier = StreamVerifier(model.folder, model.manifest)   # doctest: +SKIP
>>> for name, dtype, shape, data in weights:           # as the loader yields them   # doctest: +SKIP
...     if verifier.expect(name, dtype, shape):
...         verifier.hash(name, data)                   # data: the private copy the model gets
>>> verifier.finish()                                   # doctest: +SKIP

* **Which manifest**: ``trusted_model(reference, revision, policy=Policy(...))`` resolves
  a folder or hub id once to a ``TrustedModel`` (folder, manifest, ``cache_key``), under
  a ``Policy`` (manifest required, pinned identity, trusted signing key;
  ``Policy.from_environment()`` for processes that see no engine option). A reference may be
  an ``s3://`` prefix: its manifest is one GET of the bucket's ``ckptpub.json``. Lower-level:
  ``model_folder``, ``has_manifest``, ``read_folder_manifest``, ``publish_command``.
* **The files the engine reads itself**: ``check_engine_files`` (refuses; ``copy_of=`` for
  the local copy an engine pulled of an object-store prefix's small files),
  ``engine_file_problems`` (lists), ``read_published`` (one file's checked bytes, for an
  integration that hands them to its engine), ``read_weights_file`` (a whole weights file
  read once into writable memory, to verify as it is handed on), ``engine_reads`` (which names count).
* **The shards**, in a folder or an ``s3://`` prefix: ``check_shards_are_files`` before the
  engine opens them, ``shard_problems`` after its reading failed.
* **Every streamed tensor**: ``StreamVerifier`` (``expect``, ``hash``, ``finish``).
* **Refusals**: ``RefusedError``, one line, ``ckptpub: refusing to serve FOLDER: REASON``.
"""

from ._serving.engine_files import (
    FileMismatchError,
    check_engine_files,
    check_shards_are_files,
    engine_file_problems,
    engine_reads,
    read_published,
    read_weights_file,
    shard_problems,
)
from ._serving.refusal import RefusedError
from ._serving.stream import INLINE_HASH_BYTES, StreamVerifier
from ._serving.trust import (
    Policy,
    TrustedModel,
    has_manifest,
    model_folder,
    publish_command,
    read_folder_manifest,
    trusted_model,
)

__all__ = [
    "INLINE_HASH_BYTES",
    "FileMismatchError",
    "Policy",
    "RefusedError",
    "StreamVerifier",
    "TrustedModel",
    "check_engine_files",
    "check_shards_are_files",
    "engine_file_problems",
    "engine_reads",
    "has_manifest",
    "model_folder",
    "publish_command",
    "read_folder_manifest",
    "read_published",
    "read_weights_file",
    "shard_problems",
    "trusted_model",
]

#: Tracebacks and the last line of a refused engine start name the public class, not its private module.
RefusedError.__module__ = __name__
