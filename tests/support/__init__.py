"""Test support: the helpers that tests, benchmarks and examples share, in one package (``import support``).

``tests`` is on the path of every test (pytest's ``pythonpath``) and of every script a
test starts (``tests/conftest.py`` exports it); examples and benchmarks add it
themselves. Nothing here is imported by ckptpub or ckptpub-vllm at run time.

Modules:

    tiny_model            the one tiny Qwen3 builder: model, tokenizer, saved folder, Trainer
    safetensors_files     a tensor's byte range in a shard; a copy with one tensor zeroed
    manifests             a manifest with some fields replaced (forged manifests, comparisons)
    checkpoints           small real checkpoint folders on disk; the CLI as a subprocess
    hf_cache              a Hugging Face cache built offline, laid out as huggingface_hub lays one out
    slowfs                a slow FUSE filesystem that counts requests (tests and benchmarks)
    runs                  torchrun commands, process groups, a run's checkpoint folders
    signhelpers           keys, certificates, signed checkpoints, model_signing's CLI and API
    preload_helpers       the ``ckptpub preload`` supervisor as a process, its stand-in daemon
    vllm_engine_helpers   the vLLM engine runner, OpenAI server, weight-cache daemon shim
    s3server              a real S3 server (moto's) on 127.0.0.1, its request log
    s3fixtures            the ``s3_server`` and ``bucket`` fixtures, imported by the conftests that need them

Helpers of one test folder stay in that folder and are imported by their path
(``tests.hostile.corpus``, ``tests.callback.cbhelpers``, ``tests.vllm.lora_helpers``): the
repository root is pytest's other ``pythonpath`` entry.
"""
