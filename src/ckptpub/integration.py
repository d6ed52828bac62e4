"""What an integration built on ckptpub (the vLLM plugin, its ``ckptpub preload`` supervisor) may use
besides the names of ``ckptpub`` itself, ``ckptpub.errors``, ``ckptpub.cli`` and ``ckptpub.signing``.

Integrations use only public names, so the core's layers can change beneath them. Each
name here is the core's one implementation of a rule an integration must apply the
same way:

* ``loads_strict(data, display_name, what)``: JSON as every ckptpub reader decodes it
  (duplicate keys, NaN, ``1e400`` and lone surrogates refused, one ``CkptpubError`` line);
* ``check_identity(value, what)``: an identity (``blake3:<64 lowercase hex>``) or a ``CkptpubError``;
* ``jsonfiles``: files shared with readers, ``write_json``/``write_atomically`` (replaced
  whole), ``read_json``, ``append_line``/``read_lines`` (a log a whole line at a time);
* ``base_of(manifest)``: the base identity a manifest records (a fine-tune's or an
  adapter's parent), or None;
* ``layout_in_memory(data, display_name)``: the tensors of a whole safetensors file held
  in memory, with the header checks publishing applies (``CkptpubError`` otherwise);
* ``FORMATS``: the manifest formats read, oldest first (``Manifest.version`` is one): a
  weight-cache daemon started before a folder was published again in a newer format holds
  its model under an older format's identity (``Manifest.identity_in``);
* ``resolve_inside(root, link, display_name)``: where a symlink of the real folder
  ``root`` may lead (inside it, or into the blobs of the cached model whose snapshot it
  is), the rule publishing applies; ``CkptpubError`` otherwise;
* ``locate(name, revision)``: the folder a model's name means (a path that exists, or a
  hub id's snapshot in the Hugging Face cache, resolved offline by huggingface_hub), and
  ``cached_model(folder)``: a real folder as a cached model (hub id, commit), or None.
"""

from ._filesystem import jsonfiles
from ._filesystem.hub_cache import cached_model, locate
from ._filesystem.scan import resolve_inside
from ._format.manifest import FORMATS, check_identity
from ._format.safetensors import layout_in_memory
from ._format.strict_json import loads_strict
from ._operations.explain import base_of

__all__ = [
    "FORMATS",
    "base_of",
    "cached_model",
    "check_identity",
    "jsonfiles",
    "layout_in_memory",
    "loads_strict",
    "locate",
    "resolve_inside",
]
