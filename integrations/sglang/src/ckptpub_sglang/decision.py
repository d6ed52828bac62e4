"""Which manifest speaks for the model SGLang names: the core's one decision, under the environment's policy.

SGLang passes no option of ours to an engine or a weight-cache daemon, so the policy
is the environment's (``ckptpub.serving.Policy.from_environment``):
``CKPTPUB_REQUIRE_MANIFEST`` (off unless set: a folder without ``ckptpub.json`` is then
loaded from disk, unverified, and never matched in the cache), a trusted key
(``CKPTPUB_PUBLIC_KEY``/``CKPTPUB_CERTIFICATE_CHAIN``) and a pinned identity
(``CKPTPUB_EXPECT_IDENTITY``). A value that is not one of these is a refusal: fail closed.

A load decides once (``checked``) and everything inside it uses that decision: the
cache key SGLang builds, the engine's request, the verified disk load. A folder whose
``latest`` link moves in between cannot have its key read from one manifest and its
weights checked against another. Nothing here imports SGLang or torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

from ckptpub import CkptpubError
from ckptpub.integration import EXPECT_IDENTITY_ENV, check_identity
from ckptpub.serving import Policy, RefusedError, TrustedModel, check_engine_files, trusted_model

from .log import logger

#: Decisions in force, by the model path SGLang names (see ``checked``).
_in_force: dict[str, TrustedModel] = {}


def policy(model: str) -> Policy:
    """The environment's policy; a bad value in it refuses ``model``."""
    try:
        found = Policy.from_environment()
        pinned = os.environ.get(EXPECT_IDENTITY_ENV)
        if pinned is not None:
            found = dataclasses.replace(found, expect_identity=check_identity(pinned, EXPECT_IDENTITY_ENV))
    except CkptpubError as error:
        raise RefusedError(model, str(error)) from None
    return found


def decide(model: str, revision: str | None = None) -> TrustedModel:
    """The decision in force for ``model``, else a new one: the folder (a hub id's snapshot, offline) and the
    manifest the policy trusts (None: a folder without one, let through); a ``RefusedError`` otherwise."""
    found = _in_force.get(model)
    if found is not None:
        return found
    found = trusted_model(model, revision or None, policy=policy(model))
    if found.manifest is None:
        logger.warning(
            "ckptpub: %s has no manifest and CKPTPUB_REQUIRE_MANIFEST is off: it is never matched in the "
            "weight cache, and a disk load of it is unverified",
            model,
        )
    else:
        check_engine_files(found.folder, found.manifest)
        logger.info("ckptpub: %s is identity %s", model, found.manifest.identity)
    return found


@contextlib.contextmanager
def checked(model: str, revision: str | None = None) -> Iterator[TrustedModel]:
    """Decide for ``model`` once; inside the block, every ``decide`` for it returns that decision."""
    found = decide(model, revision)
    previous = _in_force.get(model)
    _in_force[model] = found
    try:
        yield found
    finally:
        if previous is None:
            _in_force.pop(model, None)
        else:
            _in_force[model] = previous
