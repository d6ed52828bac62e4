"""Test support: the helpers that tests, benchmarks and examples share, in one package (``import support``).

``tests`` is on the path of every test (pytest's ``pythonpath``) and of every script a
test starts (``tests/conftest.py`` exports it); examples and benchmarks add it
themselves. Nothing here is imported by ckptpub or ckptpub-vllm at run time.

Modules:

    tiny_model          the one tiny Qwen3 builder: model, tokenizer, saved folder, Trainer
    safetensors_files   a tensor's byte range in a shard; a copy with one tensor zeroed
    manifests           a manifest with some fields replaced (forged manifests, comparisons)

Helpers of one test folder stay in that folder (``checkpoints``, ``cbhelpers``,
``corpus``, ``preload_helpers``, ``vllm_engine_helpers``, ``signhelpers``).
"""
