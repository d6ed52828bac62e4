"""``ckptpub.serving``'s torch side: what an engine integration whose loader yields torch tensors needs.

Importing this imports torch (``ckptpub.serving`` does not). The vLLM and SGLang plugins
both use it; an integration for another torch engine should too.

* ``dtype_code(dtype)``, ``torch_dtype(code)``: a torch dtype as the manifest names it
  (safetensors' codes) and back.
* ``tensor_bytes(tensor)``: what ``StreamVerifier.hash`` takes for a tensor (a copy of a
  small one, a view of a large one); ``raw_bytes`` is that view.
* ``StagingBuffers(keep_bytes)``: ``copy_of(tensor)``, the private copy to hash and hand
  the engine, in memory reused once nothing else holds it (``storage_holders`` counts
  the holders); ``release()`` when the load is done.
"""

from ._torch.staging import StagingBuffers, storage_holders
from ._torch.tensor_bytes import dtype_code, raw_bytes, tensor_bytes, torch_dtype

__all__ = ["StagingBuffers", "dtype_code", "raw_bytes", "storage_holders", "tensor_bytes", "torch_dtype"]
