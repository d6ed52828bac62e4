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
  its model under an older format's identity (``Manifest.identity_in``).
"""

from ._filesystem import jsonfiles
from ._format.manifest import FORMATS, check_identity
from ._format.safetensors import layout_in_memory
from ._format.strict_json import loads_strict
from ._operations.explain import base_of

__all__ = ["FORMATS", "base_of", "check_identity", "jsonfiles", "layout_in_memory", "loads_strict"]
