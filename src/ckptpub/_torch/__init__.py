"""torch's side of the serving checks: what every engine that streams torch tensors shares.

    tensor_bytes  a tensor's safetensors dtype code and its bytes as stored, for ``StreamVerifier``
    staging       the memory of the private copies a verified load hands its engine, reused
                  once nothing holds it

The one layer of the core that imports torch at import: only engine integrations import
it, through ``ckptpub.serving_torch``; ``ckptpub.serving`` stays torch-free.
"""
