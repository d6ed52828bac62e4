"""Publish after ``accelerator.save_state()`` in a plain accelerate loop.

Why a helper: accelerate has a pre-save hook but no post-save hook, and every rank
calls ``save_state()`` while only the main process should hash and write the
manifest, after everyone's files are on disk. No import of accelerate is needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._format.manifest import Manifest
from .._operations.publishing import publish
from ..errors import CkptpubError


def last_state_folder(accelerator: Any) -> str:
    """The folder the last ``save_state()`` wrote under automatic checkpoint naming."""
    config = accelerator.project_configuration
    if not getattr(config, "automatic_checkpoint_naming", False) or config.iteration < 1:
        raise CkptpubError(
            "publish_accelerate_state: pass folder= (the path save_state() returned) unless "
            "ProjectConfiguration(automatic_checkpoint_naming=True) was used and save_state() ran"
        )
    return os.path.join(accelerator.project_dir, "checkpoints", f"checkpoint_{config.iteration - 1}")


def publish_accelerate_state(
    accelerator: Any,
    folder: str | os.PathLike[str] | None = None,
    *,
    provenance: Mapping[str, Any] | None = None,
) -> Manifest | None:
    """Wait for every process, then publish ``folder`` on the main process.

    Returns the Manifest on the main process and None elsewhere. ``folder`` defaults
    to the last automatically named ``save_state()`` folder. Example::

        folder = accelerator.save_state()
        ckptpub.publish_accelerate_state(accelerator, folder, provenance={"step": step})
    """
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return None
    target = os.fspath(folder) if folder is not None else last_state_folder(accelerator)
    prov = {"run_dir": os.path.abspath(os.path.dirname(target))}
    prov.update(provenance or {})
    return publish(target, provenance=prov, allow_no_weights=True)  # save_state() wrote this folder
