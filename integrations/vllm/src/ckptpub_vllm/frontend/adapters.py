"""What a caller sees of a refused adapter, in the process it called vLLM from.

A request the engine core did not schedule because its adapter was refused
(``engine_core.adapter_gate``) finishes with ``finish_reason`` ``error`` and the refusal's one
line as its ``stop_reason``. Here:

* offline (``LLM.generate`` and the other calls that run the engine to completion),
  the call raises ``RefusedError`` with that line once the engine has finished the
  batch, so no request is left behind in it;
* in the OpenAI server, the request's error (HTTP 500, or the error event of a
  stream) carries that line instead of vLLM's "Internal server error".

Explicit loads need nothing here: ``add_lora`` already fails with the worker's line
(``POST /v1/load_lora_adapter`` answers it with a 500, ``--lora-modules`` stops the
server at start with it). What the server shows of its adapters is asked of the workers
that loaded them (``served``).

Installed only in a process that has imported vLLM's offline or server front end
when plugins load (vLLM loads them while it builds the engine's config, after those
imports); every change is inert unless the line comes from ckptpub.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ckptpub.serving import RefusedError

from ..shared.options import LOAD_FORMAT

REFUSAL_PREFIX = "ckptpub: "
_PATCH_MARK = "_ckptpub_original"


class RefusalReason(str):
    """``finish_reason`` ``"error"`` (equal to it wherever vLLM compares) that carries the refusal's line."""

    line: str

    def __new__(cls, line: str) -> RefusalReason:
        reason = super().__new__(cls, "error")
        reason.line = line
        return reason


def refusal_of(completion: Any) -> str | None:
    """The ckptpub line a finished completion output failed with, or None."""
    reason = completion.stop_reason
    if completion.finish_reason == "error" and isinstance(reason, str) and reason.startswith(REFUSAL_PREFIX):
        return reason
    return None


def raise_refusals(outputs: list[Any]) -> None:
    """Raise the first ckptpub refusal among the finished request outputs, counting the others."""
    lines = [
        line
        for output in outputs
        for completion in (output.outputs if isinstance(getattr(output, "outputs", None), list) else ())
        if (line := refusal_of(completion)) is not None
    ]
    if lines:
        more = f" (and {len(lines) - 1} more requests refused)" if len(lines) > 1 else ""
        raise RefusedError.relayed(lines[0] + more)


def _patched(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(owner, name)
    if getattr(original, _PATCH_MARK, None) is not None:
        return
    replacement = functools.wraps(original)(make(original))
    setattr(replacement, _PATCH_MARK, original)
    setattr(owner, name, replacement)


def _offline(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    def _run_engine(self: Any, *args: Any, **kwargs: Any) -> list[Any]:
        outputs = original(self, *args, **kwargs)
        if self.llm_engine.vllm_config.load_config.load_format == LOAD_FORMAT:
            raise_refusals(outputs)
        return outputs

    return _run_engine


def _marking_refusals(original: Callable[..., Any]) -> Callable[..., Any]:
    def _new_completion_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        completion = original(self, *args, **kwargs)
        line = refusal_of(completion)
        if line is not None:
            completion.finish_reason = RefusalReason(line)
        return completion

    return _new_completion_output


def _raising_refusals(original: Callable[..., None]) -> Callable[..., None]:
    def _raise_if_error(self: Any, finish_reason: str | None, request_id: str) -> None:
        if isinstance(finish_reason, RefusalReason):
            from vllm.exceptions import GenerationError

            raise GenerationError(finish_reason.line)
        original(self, finish_reason, request_id)

    return _raise_if_error


def install() -> None:
    """Patch the front ends this process has imported (idempotent)."""
    if "vllm.entrypoints.common.offline" in sys.modules:
        from vllm.entrypoints.common.offline import OfflineInferenceMixin

        _patched(OfflineInferenceMixin, "_run_engine", _offline)
    if "vllm.entrypoints.openai.models.serving" in sys.modules:
        from vllm.entrypoints.generate.base.serving import GenerateBaseServing
        from vllm.v1.engine.output_processor import RequestState

        _patched(RequestState, "_new_completion_output", _marking_refusals)
        _patched(GenerateBaseServing, "_raise_if_error", _raising_refusals)
