"""Test-only CPU simulation of the CUDA parts of vLLM's weight cache (``PYTHONPATH=tests/daemon_sim``).

vLLM 0.32's real weight-cache daemon (``WeightCacheDaemon``, started by ``vllm preload``)
and its engine-side loader (``IpcModelLoader``) need CUDA in a handful of places. With
this directory on ``PYTHONPATH``, Python imports this module at start-up in every
process (``site`` imports ``sitecustomize``), including the daemon children that
``vllm preload`` spawns and the engine processes, which inherit ``PYTHONPATH``. It
installs an import hook and does nothing else until vLLM's weight-cache modules are
imported; processes that never import them (the ``ckptpub`` CLI, the supervisor)
are unaffected and import no torch because of it.

**Real** (vLLM's own code, unchanged): ``vllm preload`` and its launcher/daemon
processes, ``WeightCacheDaemon`` (key computed in ``__init__``, model loaded through
the configured loader, i.e. the ckptpub plugin's verified ``manifest_cache`` load,
socket bound only after loading, the per-GPU ``flock``, the pickle protocol, key
comparison and the ``mismatch`` reply), the engine's ``IpcModelLoader`` (request,
mismatch handling, ``fallback``, ``_build_model`` applying the daemon's tensors, vLLM's
"Mapped N tensors" log line), the engine's own post-processing, and generation.

**Simulated** (what a CPU cannot do):

* ``protocol.check_ipc_platform_support`` returns instead of raising: the CPU
  platform has no CUDA IPC. (The ckptpub loader asks this function, at call time,
  whether the daemon path exists.)
* CUDA IPC handles: none. ``TensorEntry`` already ships non-CUDA tensors *by value*
  (pickled copies over the socket, not shared memory), so engines get copies of the
  daemon's tensors, not mappings of its memory; vLLM still logs ``zero_copy``.
* ``protocol.get_current_device_uuid`` returns :data:`DEVICE_UUID` (``CpuPlatform``
  has no ``get_device_uuid``): it names the socket and is compared by
  ``_check_gpu_uuid``, which therefore always agrees.
* ``torch.accelerator`` (``set_device_index``, ``current_device_index``,
  ``empty_cache``, ``memory_allocated``, ``memory_reserved``), which raise "no
  accelerator" on CPU torch, answer as for device 0 with no memory, and only as
  seen from vLLM's ``weight_cache`` modules (their module-global ``torch`` is a
  proxy; the real ``torch.accelerator`` is untouched).
* Inside the daemon only: the CPU build's ``UnquantizedLinearMethod`` post-processing
  moves each linear weight into a oneDNN handle held by a closure and leaves an empty
  ``Parameter``; the daemon exports parameters and buffers only, so engines would
  receive empty weights. The daemon's ``process_weights_after_loading`` runs with that
  repacking (``layers.utils.dispatch_cpu_unquantized_gemm``) skipped; the engine
  repacks the weights it receives, as it does after a disk load.

**A hook for tests** (nothing is simulated by it): with ``CKPTPUB_SIM_PAUSE_DIR=DIR``, a
daemon that finds ``DIR/armed`` renames it to ``DIR/paused`` and waits, after vLLM's
``WeightCacheDaemon.__init__`` computed its key and before ``load_model`` reads any
weight, until the test removes ``DIR/paused``: a deterministic window between the
key and the load (at most one daemon takes it per ``armed``).

Still not covered: CUDA memory sharing, ``get_memory`` figures, copy-mode release,
a real device-UUID check, quantized post-processing in the daemon.

Each process in which the simulation takes effect prints one line to stderr,
:data:`BANNER`, so a test (or a person reading a daemon log) sees that it was on.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types

DEVICE_UUID = "CPU-SIMULATED-DEVICE-0"
BANNER = "ckptpub daemon_sim: CPU simulation of CUDA IPC active in pid"
_WC = "vllm.model_executor.model_loader.weight_cache"


def _announce() -> None:
    if not getattr(_announce, "done", False):
        _announce.done = True
        print(f"{BANNER} {os.getpid()} (tests/daemon_sim/sitecustomize.py)", file=sys.stderr, flush=True)


def _patch_protocol(protocol: types.ModuleType) -> None:
    def check_ipc_platform_support() -> None:
        """Simulated: CPU tensors travel by value, so the CPU build may use the daemon."""
        _announce()

    def get_current_device_uuid() -> str:
        """Simulated: CpuPlatform has no device UUID."""
        return DEVICE_UUID

    protocol.check_ipc_platform_support = check_ipc_platform_support
    protocol.get_current_device_uuid = get_current_device_uuid
    _use_cpu_accelerator(protocol)


class _CpuAccelerator:
    """``torch.accelerator`` as vLLM's weight-cache code uses it, for a CPU: device 0, no memory."""

    @staticmethod
    def set_device_index(index: int) -> None:
        pass

    @staticmethod
    def current_device_index() -> int:
        return 0

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def memory_allocated(*args) -> int:
        return 0

    @staticmethod
    def memory_reserved(*args) -> int:
        return 0


class _TorchWithCpuAccelerator(types.ModuleType):
    """``torch`` for one vLLM module: everything real except ``accelerator``."""

    def __init__(self, torch: types.ModuleType) -> None:
        super().__init__("torch")
        self._torch = torch
        self.accelerator = _CpuAccelerator()

    def __getattr__(self, name: str):
        return getattr(self._torch, name)


def _use_cpu_accelerator(module: types.ModuleType) -> None:
    torch = module.__dict__.get("torch")
    if torch is not None and not torch.accelerator.is_available():
        module.torch = _TorchWithCpuAccelerator(torch)


def _patch_daemon(daemon: types.ModuleType) -> None:
    _use_cpu_accelerator(daemon)
    post_process = daemon.process_weights_after_loading

    def process_weights_after_loading(model, model_config, target_device):
        """In the daemon only: post-process without the CPU build's linear-weight repacking."""
        from vllm.model_executor.layers import utils as layer_utils

        _announce()
        packing = layer_utils.dispatch_cpu_unquantized_gemm
        layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: None
        try:
            return post_process(model, model_config, target_device)
        finally:
            layer_utils.dispatch_cpu_unquantized_gemm = packing

    daemon.process_weights_after_loading = process_weights_after_loading
    _pause_between_key_and_load(daemon.WeightCacheDaemon)


PAUSE_ENV = "CKPTPUB_SIM_PAUSE_DIR"
PAUSE_LIMIT_S = 600


def _pause_between_key_and_load(cls) -> None:
    """The test hook of the module docstring: wait between the daemon's key and its load, when armed."""
    directory = os.environ.get(PAUSE_ENV)
    if not directory:
        return
    load_model = cls.load_model

    def load_model_after_pause(self):
        import time

        paused = os.path.join(directory, "paused")
        try:
            os.rename(os.path.join(directory, "armed"), paused)  # atomic: one daemon takes the pause
        except FileNotFoundError:
            return load_model(self)
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while os.path.exists(paused) and time.monotonic() < deadline:
            time.sleep(0.05)
        return load_model(self)

    cls.load_model = load_model_after_pause


_PATCHES = {
    f"{_WC}.protocol": _patch_protocol,
    f"{_WC}.ipc_loader": _use_cpu_accelerator,  # imports protocol's names, already patched by then
    f"{_WC}.daemon": _patch_daemon,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs a module's real loader, then its patch, before anyone can import names from it."""

    def __init__(self) -> None:
        self._real: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._real[name] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._real[spec.name].create_module(spec)

    def exec_module(self, module):
        self._real[module.__name__].exec_module(module)
        _PATCHES[module.__name__](module)


sys.meta_path.insert(0, _PatchAfterImport())
