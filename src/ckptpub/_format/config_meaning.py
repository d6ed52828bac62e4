"""Which keys of a model's config make the model what it is: the part the identity covers.

A config digest (``manifest.config_digest``) is taken of the config less the keys
that cannot change what an inference engine computes. Two kinds are left out:

* keys that say **where or by what** the file was written;
* keys that only choose **what a forward pass returns to training code**. The
  Trainer writes ``"use_cache": false`` into every checkpoint (``Trainer.__init__``:
  ``model.config.use_cache = args.use_cache``, whose default is False),
  ``save_pretrained`` of the same weights writes ``true``; the tokens an engine
  produces are the same.

The list is explicit and short, each key with its reason (``INERT``), checked against
transformers 5.19 and vLLM 0.32: transformers' models read these keys only to decide
whether to build and return a KV cache, attention maps, hidden states, a tuple or an
auxiliary loss; vLLM's model code reads none of them (its Transformers backend passes
``use_cache=False`` itself). Everything else counts, including keys some engines
ignore (``chunk_size_feed_forward``, read by vLLM's BLIP-2; ``problem_type``, which
picks vLLM's pooler activation; generation defaults such as ``temperature``, which vLLM
takes from ``config.json`` when there is no ``generation_config.json``): when in doubt a
key changes the identity. The rule applies to the top-level object and to each nested
sub-config (an object with a string ``model_type``, as transformers writes
``text_config``), never to other values (``id2label`` may name a label ``use_cache``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Where and by what the file was written.
WRITTEN_BY = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})

#: What a forward pass returns to training code, and why that changes no engine's output.
INERT: Mapping[str, str] = {
    "use_cache": "whether a forward builds and returns a KV cache (past_key_values); the logits are the same",
    "output_attentions": "whether a forward also returns attention maps",
    "output_hidden_states": "whether a forward also returns every layer's hidden states",
    "return_dict": "whether a forward returns a ModelOutput or a plain tuple",
    "torchscript": "transformers 4.x: return tuples and clone tied weights for TorchScript export",
    "output_router_logits": "whether a mixture-of-experts forward returns router logits and adds their "
    "auxiliary loss to the training loss; the logits are the same",
}

#: Every key a config digest leaves out.
LEFT_OUT = WRITTEN_BY | INERT.keys()


def meaning(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` less the keys ``LEFT_OUT`` names, at the top level and in each sub-config."""
    return {key: _sub_config_meaning(value) for key, value in document.items() if key not in LEFT_OUT}


def _sub_config_meaning(value: Any) -> Any:
    """A sub-config (an object with a string ``model_type``) less ``LEFT_OUT``; other values as they are."""
    if not isinstance(value, dict) or not isinstance(value.get("model_type"), str):
        return value
    return {k: _sub_config_meaning(v) for k, v in value.items() if k not in LEFT_OUT}
