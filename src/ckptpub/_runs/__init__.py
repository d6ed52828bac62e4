"""Runs: a training run's published checkpoints at a glance (``ckptpub ls``, ``ckptpub log``).

Modules (imports go downwards only; from outside this package only ``_operations``,
``_filesystem``, ``_format`` and ``errors``):

    runview   the run index and a folder scan, each checkpoint's manifest read: ``list_run``, ``lineage``
"""
