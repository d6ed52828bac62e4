"""Run vLLM CPU engines with LoRA for the tests; print one JSON result line per step.

Usage: ``python run_lora.py PLAN_JSON`` where the plan is a list of engines
``{"load_format": ..., "extra": {...}, "model": DIR, "steps": [...]}`` and each step is

* ``{"op": "generate", "lora": [NAME, ID, PATH] or null}``: greedy tokens of the one
  prompt, ``CKPTPUB_RESULT {"tokens": [...]}``, or ``{"error": "<one line>"}`` when the
  call raised (``"type"`` is the exception's class name);
* ``{"op": "add_lora", "lora": [NAME, ID, PATH]}``: ``{"ok": true}`` or the error;
* ``{"op": "flip", "file": PATH, "tensor": NAME}``: flips one bit in the middle of the
  tensor's bytes in place (flipping again restores it), ``{"ok": true}``.

vLLM runs as users run it: the front end here, the engine core and the worker in
processes of their own, so the refusals cross the same process boundaries.
"""

import contextlib
import gc
import json
import sys

from lora_helpers import flip_bit
from support.vllm_engine_helpers import TINY_ENGINE

PROMPT = "the quick brown fox"


def one_line(error):
    return {"error": " ".join(str(error).split()), "type": type(error).__name__}


def step(llm, sampling, spec):
    from vllm.lora.request import LoRARequest

    lora = LoRARequest(*spec["lora"]) if spec.get("lora") else None
    try:
        if spec["op"] == "generate":
            out = llm.generate([PROMPT], sampling, lora_request=lora, use_tqdm=False)[0].outputs[0]
            return {"tokens": list(out.token_ids), "finish_reason": out.finish_reason}
        if spec["op"] == "add_lora":
            return {"ok": llm.llm_engine.add_lora(lora)}
        if spec["op"] == "flip":
            flip_bit(spec["file"], spec["tensor"])
            return {"ok": True}
    except Exception as error:  # report, the test decides
        return one_line(error)
    raise ValueError(f"unknown step {spec!r}")


def run(engine):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=engine["model"],
        load_format=engine["load_format"],
        model_loader_extra_config=engine.get("extra") or {},
        enable_lora=True,
        max_lora_rank=8,
        **TINY_ENGINE,
    )
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=8)
        for spec in engine["steps"]:
            print("CKPTPUB_RESULT " + json.dumps(step(llm, sampling, spec)), flush=True)
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


if __name__ == "__main__":
    for engine in json.loads(sys.argv[1]):
        run(engine)
