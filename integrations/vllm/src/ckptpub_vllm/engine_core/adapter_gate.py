"""Where a refused adapter costs its requests only: admission in a ``manifest_cache`` engine's scheduler.

A worker reads an adapter (checked there, see ``worker.adapters``) either in an explicit
``add_lora`` call, whose failure fails that call only, or inside ``execute_model``,
when a scheduled request needs an adapter the worker does not hold: its first use
by ``generate(lora_request=...)``, or its next use after vLLM's CPU cache
(``max_cpu_loras``, by default ``max_loras`` = 1) evicted it. There a failure kills
the engine (``EngineDeadError`` for every later request), and it cannot fail just
that request either: by then its KV blocks are allocated and hashed for the prefix
cache, so running it on other weights would poison that cache.

So, in an engine whose load format is ``manifest_cache`` and whose LoRA is on, the
scheduler admits a waiting request whose adapter the workers may not hold only after
the workers loaded it in a call of their own (:func:`load_in_worker`, the same load
and checks as ``add_lora``): on success the request is scheduled as usual and
``execute_model`` finds the adapter in place; on a refusal (or any other load
failure) the request is not scheduled and finishes with ``finish_reason`` ``error``
and the refusal's line as its ``stop_reason`` (``frontend.adapters`` turns that into
the caller's error). Requests already running are not touched, and a request is only
checked when vLLM's own ``max_loras`` rule lets it join the batch, so a check never
evicts an adapter that running requests use.

What the workers hold is remembered from each such call, by LoRA id with the name and
path the gate loaded it as, and forgotten after every ``add_lora``/``remove_lora``/
``pin_lora``, so a request whose adapter is known to be in place costs nothing. A
request naming another name or path under a held id goes to the workers, which answer
for it only if it is the held adapter (``worker.adapters.check_held``); an id whose
load failed is never counted as held, whatever vLLM left of it (the workers remove it).
Any other engine is left exactly as vLLM made it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ckptpub.serving import RefusedError

from ..shared.log import logger
from ..shared.options import LOAD_FORMAT

#: The engine core's attribute holding its gate (None for an engine without one).
GATE_ATTR = "_ckptpub_adapter_gate"
_PATCH_MARK = "_ckptpub_original"


def load_in_worker(worker: Any, lora_request: Any, running: list[Any]) -> tuple[str | None, list[int]]:
    """Run in each worker: load ``lora_request`` unless held; its refusal's line (or None), what is held.

    The adapters of ``running`` requests that are held are touched first (vLLM's
    ``add_lora`` on a held adapter), so that the load evicts an idle one.
    """
    held = worker.list_loras()
    for request in running:
        if request.lora_int_id in held:
            worker.add_lora(request)
    try:
        worker.add_lora(lora_request)
        line = None
    except RefusedError as error:  # already logged where it was found
        line = str(error)
    except Exception as error:  # noqa: BLE001 - vLLM's own load failure: it fails this request too
        line = " ".join(
            f"ckptpub: cannot load adapter {lora_request.lora_name} ({lora_request.lora_path}): "
            f"{type(error).__name__}: {error}".split()
        )
        logger.error("%s", line)
    held_now = set(worker.list_loras())
    if line is not None:
        held_now.discard(lora_request.lora_int_id)
    return line, sorted(held_now)


class AdmissionGate:
    """The admission check of one engine core (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.scheduler = engine.scheduler
        self.executor = engine.model_executor
        self.max_loras: int = engine.vllm_config.lora_config.max_loras
        #: LoRA id -> (name, path) of the request the workers were last seen holding it for.
        self.held: dict[int, tuple[str, str]] = {}
        #: Refused waiting requests by id, with their line: finished at the next ``update_from_output``.
        self.refused: dict[str, tuple[Any, str]] = {}
        #: Lines of adapters refused since then, by LoRA id, name and path: other requests for them
        #: are not re-read.
        self.refused_adapters: dict[tuple[int, str, str], str] = {}
        scheduler = self.scheduler
        scheduler._handle_blocked_waiting_request = self._admitting(scheduler._handle_blocked_waiting_request)
        scheduler.update_from_output = self._failing_refused(scheduler.update_from_output)

    def forget_held(self) -> None:
        """Something else changed what the workers hold: ask them again next time."""
        self.held = {}

    def admits(self, request: Any) -> bool:
        """Whether the waiting ``request`` may be scheduled as far as its adapter is concerned."""
        lora = request.lora_request
        if request.request_id in self.refused:
            return False
        if self.held.get(lora.lora_int_id) == (lora.lora_name, lora.lora_path):
            return True
        running = {
            r.lora_request.lora_int_id: r.lora_request for r in self.scheduler.running if r.lora_request
        }
        if lora.lora_int_id not in running and len(running) >= self.max_loras:
            return True  # vLLM's max_loras rule keeps it waiting: loading it now could evict a running one
        asked = (lora.lora_int_id, lora.lora_name, lora.lora_path)
        line = self.refused_adapters.get(asked) or self._load(lora, list(running.values()))
        if line is None:
            return True
        self.refused_adapters[asked] = line
        self.refused[request.request_id] = (request, line)
        return False

    def _load(self, lora_request: Any, running: list[Any]) -> str | None:
        results = self.executor.collective_rpc(load_in_worker, args=(lora_request, running))
        held = frozenset.intersection(*(frozenset(ids) for _, ids in results))
        line = next((line for line, _ in results if line is not None), None)
        self.held = {lora_id: spec for lora_id, spec in self.held.items() if lora_id in held}
        if line is None and lora_request.lora_int_id in held:
            self.held[lora_request.lora_int_id] = (lora_request.lora_name, lora_request.lora_path)
        return line

    def _admitting(self, original: Callable[[Any], bool]) -> Callable[[Any], bool]:
        @functools.wraps(original)
        def handle_blocked_waiting_request(request: Any) -> bool:
            if not original(request):
                return False
            return request.lora_request is None or self.admits(request)

        return handle_blocked_waiting_request

    def _failing_refused(self, original: Callable[..., dict[int, Any]]) -> Callable[..., dict[int, Any]]:
        @functools.wraps(original)
        def update_from_output(*args: Any, **kwargs: Any) -> dict[int, Any]:
            failed = self._finish_refused()
            outputs = original(*args, **kwargs)
            for request, line in failed:
                _error_output(outputs, request, line)
            return outputs

        return update_from_output

    def _finish_refused(self) -> list[tuple[Any, str]]:
        """Finish the refused requests (never scheduled) as errors; return those finished now, with lines."""
        from vllm.v1.request import RequestStatus

        if not self.refused:
            return []
        refused, self.refused, self.refused_adapters = self.refused, {}, {}
        finished = self.scheduler.finish_requests(refused, RequestStatus.FINISHED_ERROR)
        return [(request, refused[request.request_id][1]) for request in finished]


def _error_output(outputs: dict[int, Any], request: Any, line: str) -> None:
    """Add the error output of a refused ``request`` to the scheduler's outputs for its client."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

    output = EngineCoreOutput(
        request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR, stop_reason=line
    )
    if request.client_index not in outputs:
        outputs[request.client_index] = EngineCoreOutputs()
    outputs[request.client_index].outputs.append(output)


def _gate_of(engine: Any) -> AdmissionGate | None:
    """The engine core's gate, made on first use; None unless it serves ``manifest_cache`` with LoRA."""
    if GATE_ATTR not in vars(engine):
        config = engine.vllm_config
        active = config.load_config.load_format == LOAD_FORMAT and config.lora_config is not None
        setattr(engine, GATE_ATTR, AdmissionGate(engine) if active else None)
    gate: AdmissionGate | None = vars(engine)[GATE_ATTR]
    return gate


def install() -> None:
    """Give every engine core a gate when its first LoRA request arrives (idempotent).

    Class attributes, not ``EngineCore.__init__``: vLLM loads plugins from inside
    that ``__init__``, so a patched one would miss the engine being built.
    """
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.add_request, _PATCH_MARK, None) is not None:
        return
    add_request = EngineCore.add_request

    def add_request_gated(self: Any, request: Any, request_wave: int = 0) -> None:
        if request.lora_request is not None:
            _gate_of(self)
        add_request(self, request, request_wave)

    setattr(add_request_gated, _PATCH_MARK, add_request)
    EngineCore.add_request = add_request_gated
    EngineCore.add_lora = _forgetting_held(EngineCore.add_lora)
    EngineCore.remove_lora = _forgetting_held(EngineCore.remove_lora)
    EngineCore.pin_lora = _forgetting_held(EngineCore.pin_lora)


def _forgetting_held(original: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(original)
    def changes_held(self: Any, *args: Any) -> bool:
        try:
            return original(self, *args)
        finally:
            gate = vars(self).get(GATE_ATTR)
            if gate is not None:
                gate.forget_held()

    return changes_held
