"""What runs in vLLM's engine core process: the scheduler's admission of LoRA requests (:mod:`.adapter_gate`).

Imports ``shared`` and ``worker`` only, of the plugin's layers.
"""
