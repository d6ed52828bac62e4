"""What every inference engine checks before it serves a published checkpoint, engine-neutral.

An integration (the vLLM plugin, an SGLang plugin, an object-store loader) adapts its
engine's types to these and decides nothing of its own:

    refusal       RefusedError: the one error an engine raises when it will not serve a checkpoint
    trust         a model reference resolved once to its folder and trusted manifest (signature,
                  pin, "manifest required"), and so to its cache key
    engine_files  the files an engine reads itself (configs, tokenizer, chat templates) checked
                  against the manifest through the core's readers; the shards checked by name
    stream        StreamVerifier: tensors checked by name, dtype, shape and bytes as a loader
                  yields them, hashed on a few threads beside the loader's own copying

Nothing here imports torch or an engine: an integration hands over its tensors' bytes.
The public face is ``ckptpub.serving``.
"""
