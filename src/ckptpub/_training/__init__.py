"""Training integrations: publish as a training job saves (Hugging Face Trainer, accelerate).

``callback`` imports transformers; ``import ckptpub`` imports neither module
(``ckptpub.PublishCallback`` and ``ckptpub.publish_accelerate_state`` load them on first use).

Modules (imports go downwards only; from outside this package only ``_operations``,
``_hashing``, ``_filesystem``, ``_format`` and ``errors``):

    callback            ``PublishCallback``: a manifest at every Trainer save, on every rank's share
    base_model          the base model a run fine-tunes (by hub id, snapshot or ``base=``), published
                        or not
    accelerate_helper   ``publish_accelerate_state``: after ``accelerator.save_state()``
"""
