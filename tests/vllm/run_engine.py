"""Run vLLM CPU engines for the tests and print one JSON result line per job.

Usage: ``python run_engine.py JOBS_JSON`` where JOBS_JSON is a list of
``{"model": DIR, "load_format": "auto"|"manifest_cache", "extra": {...}}``, with
``"tensor_parallel_size": 2`` for an engine of two worker processes (vLLM's ``mp``
executor; the caller sets ``VLLM_CPU_OMP_THREADS_BIND``), or ``{"wait_for": PATH}``
(wait until PATH exists: a test acts between two engines).
Each result is printed as ``CKPTPUB_RESULT {"tokens": [[...], ...]}`` or
``CKPTPUB_RESULT {"error": "<one line>"}`` (``{"waited": true}`` for a wait). The
engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a loader
error reaches ``LLM()`` with its own message, and several engines run one after the
other in one interpreter, paying vLLM's import once. A separate process keeps vLLM's
global state out of pytest.
"""

import contextlib
import gc
import json
import os
import sys

from support.vllm_engine_helpers import TINY_ENGINE

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = ["the quick brown fox", "a checkpoint is"]


def wait_for(path, limit_s=900):
    import time

    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return {"error": f"{path} did not appear within {limit_s} s"}
        time.sleep(0.1)
    return {"waited": True}


def run(job):
    if "wait_for" in job:
        return wait_for(job["wait_for"])
    from vllm import LLM, SamplingParams

    llm = None
    saved = {name: os.environ.get(name) for name in job.get("env", {})}
    os.environ.update(job.get("env", {}))  # this job's variables, for its engine start only
    try:
        llm = LLM(
            model=job["model"],
            load_format=job.get("load_format", "auto"),
            model_loader_extra_config=job.get("extra") or {},
            **TINY_ENGINE,
            **parallel(job.get("tensor_parallel_size", 1)),
        )
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
        return {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "text": [o.outputs[0].text for o in outs],
        }
    except Exception as e:  # report, the test decides
        return {"error": " ".join(f"{type(e).__name__}: {e}".split())}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except Exception:
            pass


def parallel(size):
    """``LLM`` arguments for ``size`` tensor-parallel workers (none for one)."""
    return {} if size == 1 else {"tensor_parallel_size": size, "distributed_executor_backend": "mp"}


if __name__ == "__main__":
    for job in json.loads(sys.argv[1]):
        print("CKPTPUB_RESULT " + json.dumps(run(job)), flush=True)
