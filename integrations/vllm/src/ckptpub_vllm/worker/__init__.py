"""What runs in vLLM's engine worker processes (and in a weight-cache daemon's load): the weights.

* :mod:`.loader`: ``--load-format manifest_cache`` (mapped from a daemon, or streamed from disk or a
  bucket and verified).
* :mod:`.verify_stream`: every tensor vLLM streams checked against the manifest (the private copies it
  hands vLLM in ``ckptpub.serving_torch``'s reused buffers).
* :mod:`.node_share`: the ranks of one node share the hashing and agree on the outcome.
* :mod:`.adapters`: LoRA adapters checked before vLLM reads them; :mod:`.adapter_reads`: those
  reads served from the checked bytes.

Imports ``shared`` only, of the plugin's layers.
"""
