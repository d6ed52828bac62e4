"""Publish a ckptpub manifest at every Hugging Face Trainer save: ``PublishCallback``.

This module imports transformers (``import ckptpub`` does not: ``ckptpub.PublishCallback``
imports this module on first use). Why the callback works the way it does (docs/callback.md
has the Trainer facts it relies on):

* The Trainer has no barrier between writing a checkpoint and ``on_save``; we add
  one on every rank, then publish only where ``args.should_save``.
* Hashing a large checkpoint takes seconds; by default it runs on one background
  thread with a small bounded queue so training continues (blocking when full).
* ``save_total_limit`` rotation may delete a folder while we hash it. The main
  thread holds a "rotation lock" from the moment a save is decided until the
  rotation that follows it is over; the worker lists the folder and checks it
  again after publishing while holding that lock, so it never leaves a manifest in
  a half-deleted folder (it removes its own manifest and warns instead).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .._filesystem import run_index
from .._format.manifest import Manifest
from .._format.names import MANIFEST_NAME, TRAINER_STATE_NAME
from .._hashing.distributed import DEFAULT_TIMEOUT_S, DistributedHasher, new_group
from .._hashing.engine import check_file_hash
from .._operations.publishing import publish, publish_on_ranks
from .._operations.signing import Signer
from .._settings import seconds
from ..errors import CkptpubError
from .accelerate_helper import publish_accelerate_state
from .base_model import Base, find_base, named_base, unidentified

__all__ = ["PublishCallback", "Published", "publish_accelerate_state"]

log = logging.getLogger("ckptpub")

_CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
_PRODUCER_PACKAGES = ("transformers", "torch", "accelerate", "peft", "safetensors")


@dataclass(frozen=True)
class Published:
    """One manifest this callback wrote: where, for which step, its identity, how many ranks hashed it."""

    step: int
    folder: str
    identity: str
    time: float
    ranks: int = 1


@dataclass(frozen=True)
class _Job:
    folder: str
    step: int
    provenance: dict[str, Any]
    index_dir: str | None
    base: Base | None = None  # read when the step is hashed: a base published in the background is known

    def full_provenance(self) -> dict[str, Any]:
        return {**self.provenance, **(self.base.provenance() if self.base else {"base_identity": None})}


@dataclass(frozen=True)
class _BaseJob:
    """Publish the run's base (``publish_base``), before any step queued behind it is hashed."""

    base: Base


def producer_versions() -> dict[str, str]:
    """Versions of the training stack present in this environment (for provenance)."""
    out = {}
    for name in _PRODUCER_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def checkpoint_folder(
    output_dir: str, step: int, *, trial_name: str | None = None, hp_search: bool = False
) -> str:
    """The folder the Trainer just wrote for ``step``.

    Plain runs: ``output_dir/checkpoint-{step}``. Under hyper-parameter search the
    Trainer writes ``output_dir/<run name>/checkpoint-{step}`` (``run-{id}`` or the
    ``hp_name`` result, which the state knows as ``trial_name``); callbacks are not
    told the run name, so we pick the candidate whose ``trainer_state.json`` is newest.
    """
    name = f"{_CHECKPOINT_PREFIX}-{step}"
    if trial_name and os.path.isdir(os.path.join(output_dir, trial_name, name)):
        return os.path.join(output_dir, trial_name, name)
    direct = os.path.join(output_dir, name)
    if not hp_search and os.path.isdir(direct):
        return direct
    try:
        # Not through symlinks: the callback writes inside output_dir only.
        subdirs = [
            e.path
            for e in os.scandir(output_dir)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(_CHECKPOINT_PREFIX)
        ]
    except FileNotFoundError:
        subdirs = []
    candidates = [os.path.join(d, name) for d in subdirs if os.path.isdir(os.path.join(d, name))]
    if not candidates:
        return direct

    def written_at(folder: str) -> float:
        for probe in (os.path.join(folder, TRAINER_STATE_NAME), folder):
            try:
                return os.stat(probe).st_mtime
            except OSError:
                continue
        return 0.0

    return max(candidates, key=written_at)


def _list_files(folder: str) -> list[str] | None:
    """Relative paths of the files in ``folder`` (None if the folder is gone)."""
    out = []
    try:
        for root, _dirs, names in os.walk(folder, onerror=_raise):
            out += [os.path.relpath(os.path.join(root, n), folder) for n in names]
    except OSError:
        return None
    return out


def _raise(exc: OSError) -> None:
    raise exc


class _Publisher:
    """Publishes checkpoint folders, inline or on one background thread.

    The bounded queue keeps at most ``max_pending`` saves waiting behind the one
    being hashed; ``submit`` blocks when it is full, so a run that saves faster than
    it can hash slows down rather than piling up memory or stale work.
    """

    def __init__(
        self,
        *,
        background: bool,
        max_pending: int,
        require: str | None,
        signer: Signer | None = None,
        sign_hash: str = "sha256",
    ) -> None:
        self.background = background
        self.require = require
        self.signer = signer
        self.sign_hash = sign_hash
        self.rotation_lock = threading.Lock()
        self._queue: queue.Queue[_Job | _BaseJob | None] = queue.Queue(maxsize=max(1, max_pending))
        self._thread: threading.Thread | None = None
        self._done: list[Published] = []
        self._done_lock = threading.Lock()
        self.failures: list[str] = []
        self.hasher: DistributedHasher | None = None  # set when every rank of the job hashes
        self.writer = True  # this rank writes the manifest (``args.should_save``)

    # -- main thread -------------------------------------------------------------
    def set_writer(self, writer: bool) -> None:
        """Whether this rank writes the manifests; called at train start, when no worker runs.

        A rank that only helps hash gets an unbounded queue: if it could block in
        ``on_save`` while its worker waits in a collective for the writer's worker,
        and the writer's main thread (holding the rotation lock) waited for this rank
        in a collective save (FSDP, DeepSpeed), nothing would move until the rank
        timeout. Its backlog stays small anyway: its worker keeps pace with the
        writer's through the collectives, and the writer's bounded queue slows the job.
        """
        self.writer = writer
        if not writer:
            self._queue = queue.Queue()

    def submit(self, job: _Job) -> None:
        if not self.background:
            self.join()  # a base still being published first: the step records its identity
            self._run_safely(job, locked=False)
            return
        self._start()
        self._queue.put(job)

    def submit_base(self, job: _BaseJob) -> None:
        """Publish the base on the worker thread whatever ``background`` says: training never waits for
        it, and every step is hashed after it (queued behind it, or inline after ``join``)."""
        self._start()
        self._queue.put(job)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="ckptpub-publisher", daemon=True)
            self._thread.start()
            atexit.register(self.join)

    def join(self) -> None:
        """Wait until every submitted save is published (or skipped), then stop the worker.

        ``on_train_end`` calls it; so does the interpreter's exit when training ended
        without it (an exception in ``train()``), so the worker is never cut off
        inside a collective (or a manifest's write) while the process tears down.
        """
        atexit.unregister(self.join)
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._thread = None

    def close_hasher(self) -> None:
        """End the job-wide hashing group with the other ranks, once no publish runs (``join`` first).

        So the group does not outlive the training: the next ``train()`` makes a new one.
        """
        if self.hasher is not None:
            self.hasher.close()
            self.hasher = None

    def take_done(self) -> list[Published]:
        with self._done_lock:
            done, self._done = self._done, []
        return done

    # -- worker ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if isinstance(job, _BaseJob):
                self._publish_base(job.base)
            else:
                self._run_safely(job, locked=True)

    def _publish_base(self, base: Base) -> None:
        """Publish the base's folder (hashed once, by the job's ranks when they share the work)."""
        hasher = self._working_hasher()
        if hasher is None and not self.writer:
            return
        assert base.folder is not None
        try:
            with contextlib.nullcontext() if hasher is None else hasher.taking_part():
                options: dict[str, Any] = {"allow_no_weights": True}
                if hasher is None:
                    manifest = publish(base.folder, **options)
                else:
                    manifest = publish_on_ranks(base.folder, hasher, **options)
        except Exception as exc:  # never let the base end the run: its steps go without a base_identity
            message = (
                f"ckptpub: could not publish the base model {base.label}: {exc}; "
                "this run's checkpoints record no base_identity"
            )
            log.warning(message)
            self.failures.append(message)
            return
        base.identity = manifest.identity
        log.info("ckptpub: published the base model %s: identity %s", base.label, manifest.identity)

    def _working_hasher(self) -> DistributedHasher | None:
        """The job's hasher over every rank while it works; None when this rank hashes alone."""
        return self.hasher if self.hasher is not None and self.hasher.broken is None else None

    def _run_safely(self, job: _Job, *, locked: bool) -> None:
        try:
            self._run(job, locked=locked)
        except Exception as exc:  # never let a publishing bug kill training
            self._fail(job, f"unexpected error: {exc!r}")

    def _run(self, job: _Job, *, locked: bool) -> None:
        hasher = self._working_hasher()
        if hasher is None and not self.writer:
            return  # no distributed hashing (or it failed earlier): the writing rank publishes alone
        try:
            with contextlib.nullcontext() if hasher is None else hasher.taking_part():
                manifest, before = self._hash(job, locked=locked, hasher=hasher)
        except _SkippedError as skipped:
            return self._fail(job, str(skipped))
        if not self.writer:
            return
        guard = self.rotation_lock if locked else contextlib.nullcontext()
        with guard:
            after = _list_files(job.folder)
            missing = sorted(set(before) - set(after or ()))
            if after is None or missing:
                _withdraw(job.folder)
                return self._fail(
                    job, f"folder was deleted while publishing (missing {missing[:3]}); manifest removed"
                )
            now = time.time()
            if job.index_dir is not None:
                rel = os.path.relpath(job.folder, job.index_dir)
                try:
                    run_index.append(
                        job.index_dir, step=job.step, path=rel, identity=manifest.identity, time=now
                    )
                except (
                    OSError,
                    CkptpubError,
                ) as exc:  # e.g. a symlink named like the index: not followed
                    log.warning("ckptpub: could not append to the run index in %s: %s", job.index_dir, exc)
        log.info("ckptpub: published step %d %s identity %s", job.step, job.folder, manifest.identity)
        with self._done_lock:
            ranks = 1 if hasher is None else hasher.world_size
            self._done.append(Published(job.step, job.folder, manifest.identity, now, ranks))

    def _hash(
        self, job: _Job, *, locked: bool, hasher: DistributedHasher | None
    ) -> tuple[Manifest, list[str]]:
        """The manifest (written on the writing rank) and the files listed; ``_SkippedError`` says why not."""
        guard = self.rotation_lock if locked else contextlib.nullcontext()
        if os.path.islink(job.folder):  # the Trainer never saves through a link; we never write through one
            raise _SkippedError("checkpoint folder is a symlink; not publishing through it")
        with guard:
            before = _list_files(job.folder)
        if before is None:
            raise _SkippedError("folder was removed before it could be published (rotated away?)")
        if self.require and self.require not in before:
            raise _SkippedError(f"folder is incomplete (no {self.require}); not publishing it")
        # A Trainer checkpoint is the right folder by construction; weights may be .bin or FSDP shards.
        options: dict[str, Any] = {
            "provenance": job.full_provenance(),
            "allow_no_weights": True,
            "sign": self.signer,
            "sign_hash": self.sign_hash,
        }
        try:
            if hasher is None:
                return publish(job.folder, **options), before
            return publish_on_ranks(job.folder, hasher, **options), before
        except (CkptpubError, OSError) as exc:
            # Rotation removes a folder's files before the folder itself: a file that was there
            # when hashing began and is gone now says the same as the folder gone.
            gone = not os.path.isdir(job.folder) or not all(
                os.path.lexists(os.path.join(job.folder, path)) for path in before
            )
            raise _SkippedError(
                ("folder was rotated away while hashing: " if gone else "") + str(exc)
            ) from None

    def _fail(self, job: _Job, why: str) -> None:
        msg = f"ckptpub: step {job.step} {job.folder}: {why}"
        log.warning(msg)
        self.failures.append(msg)


class _SkippedError(Exception):
    """A save that is skipped, with the reason (logged as a warning)."""


def _withdraw(folder: str) -> None:
    """Remove our manifest from a folder that is being deleted, and the folder if now empty."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(folder, MANIFEST_NAME))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


class PublishCallback(TrainerCallback):  # type: ignore[misc]  # mypy skips transformers (untyped)
    """Write ``ckptpub.json`` into every checkpoint the Trainer saves.

    ``trainer.add_callback(PublishCallback())`` is enough. Options:

    * ``background`` (default True): hash on a worker thread; ``on_save`` returns
      after queueing. ``False`` publishes inside ``on_save``.
    * ``max_pending`` (default 1): saves that may wait behind the one being hashed
      before ``on_save`` blocks.
    * ``index`` (default True): append to ``output_dir/ckptpub-index.jsonl``.
    * ``distributed`` (default True): in a multi-process run, every rank hashes its
      share of each checkpoint (through a gloo group made at train start) and the
      saving rank writes the manifest. ``rank_timeout_s`` bounds each wait for the
      other ranks (it must cover one rank's share of the hashing); a rank that dies
      or stalls fails that save's publish with a warning, and later saves are hashed
      by the saving rank alone.
    * ``sign`` (default None): a private key's path (or a ``ckptpub.signing.SigningKey``):
      sign every checkpoint (``model.sig``, see ``docs/security.md``). The key is
      loaded here, so a key that cannot sign fails before training starts.
    * ``sign_hash`` (default ``"sha256"``): the file digest ``model.sig`` lists,
      ``"sha256"`` or ``"blake3"`` (as ``ckptpub.publish``'s; ``docs/security.md``).
    * ``base`` (default None: where the model was loaded from): the model this run
      fine-tunes, as a folder, a hub id (``org/name``, ``org/name@REVISION``) or an
      identity; every step records its identity (``base_identity``) and, for a model
      in the Hugging Face cache, its hub id and commit (``base_hub``).
    * ``publish_base`` (default False): when the base has no manifest, publish it at
      train start on the publishing thread (training goes on; it is hashed once, and
      every step is published after it). Without it such a base is named in one
      warning, with the command that publishes it.

    ``published`` lists what was published (filled on the main thread),
    ``failures`` the skipped saves with their reasons. The final
    ``trainer.save_model()`` fires no callback: call ``ckptpub.publish(dir)``.
    """

    def __init__(
        self,
        background: bool = True,
        max_pending: int = 1,
        index: bool = True,
        sign: object = None,
        distributed: bool = True,
        rank_timeout_s: float = DEFAULT_TIMEOUT_S,
        sign_hash: str = "sha256",
        base: object = None,
        publish_base: bool = False,
    ) -> None:
        self.background = background
        self.base = None if base is None else named_base(base)  # refused here, before training starts
        self.publish_base = bool(publish_base)
        self.index = index
        self.distributed = distributed
        self.rank_timeout_s = seconds(rank_timeout_s, "rank_timeout_s")
        signer = None if sign is None else Signer.load(sign)
        self._pub = _Publisher(
            background=background,
            max_pending=max_pending,
            require=TRAINER_STATE_NAME,
            signer=signer,
            sign_hash=check_file_hash(sign_hash, "sign_hash"),
        )
        self._holding = False
        self._base: Base | None = None
        self._base_submitted: Base | None = None  # hashed once, however many times train() is called
        self._warned_base = False  # once per callback, however many times train() is called
        self._producer: dict[str, str] | None = None
        self._undelivered: list[Published] = []
        self.published: list[Published] = []

    @property
    def failures(self) -> list[str]:
        return list(self._pub.failures)

    # -- rotation window (background mode, saving rank only) -------------------
    def _hold(self, args: TrainingArguments) -> None:
        if self.background and args.should_save and not self._holding:
            self._pub.rotation_lock.acquire()
            self._holding = True

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self._pub.rotation_lock.release()

    # -- events --------------------------------------------------------------
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        self._producer = producer_versions()
        # Every rank is here at the same point: the one safe place to make the hashing group.
        spread = self.distributed and args.world_size > 1 and not args.save_on_each_node
        if spread and self._pub.hasher is None:
            self._pub.hasher = _rank_hasher(self.rank_timeout_s)
        self._pub.set_writer(bool(args.should_save))
        self._begin_base(args, model)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._release()  # a save window never spans into the next step

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if str(getattr(args.save_strategy, "value", args.save_strategy)) == "best":
            self._hold(args)  # the Trainer decides a "best" save (and rotates) right after this

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._deliver(state)
        if control.should_save:  # DefaultFlowCallback (first in the list) decided a save
            self._hold(args)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_save:
            self._hold(args)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.world_size > 1:
            _barrier()
        if not args.should_save and self._pub.hasher is None:
            return
        final = state.max_steps and state.global_step >= state.max_steps
        try:
            job = self._job(args, state)
        except Exception as exc:  # a callback must not end the run over a manifest
            self._release()
            log.warning("ckptpub: step %s: not published: %r", state.global_step, exc)
            return
        # Rotation for this save is over. Release before queueing: a full queue
        # waits on the worker, which may need the lock for its post-check.
        self._release()
        self._pub.submit(job)
        if final:  # end of training may still delete checkpoints before on_train_end
            self._hold(args)
        self._deliver(state)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._deliver(state)
        # Only the periodic training log: the Trainer builds that dict for this one
        # call. Evaluation metrics and train()'s result are the caller's own dicts
        # (hyper-parameter search sums them), so they are never touched.
        if _is_training_log(logs) and self._undelivered:
            last = self._undelivered[-1]
            logs["ckptpub/identity"] = last.identity
            logs["ckptpub/step"] = last.step
            self._undelivered.clear()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._release()
        self._pub.join()
        self._pub.close_hasher()  # every rank is here, after its last collective
        self._deliver(state)
        for p in self.published:  # a checkpoint deleted after its publish leaves no manifest behind
            if not os.path.isfile(os.path.join(p.folder, TRAINER_STATE_NAME)):
                _withdraw(p.folder)

    # -- helpers -------------------------------------------------------------
    def _begin_base(self, args: TrainingArguments, model: Any) -> None:
        """Find the run's base; publish it in the background if it needs it and the user consented."""
        found = find_base(model, self.base) if model is not None or self.base is not None else None
        submitted = self._base_submitted
        if found is not None and submitted is not None and found.folder == submitted.folder:
            found = submitted if found.identity is None else found  # still being published by us
        self._base = found
        if found is None:
            return
        warning = unidentified(found, publishing=self.publish_base)
        if warning is not None and not self._warned_base and args.should_save:
            self._warned_base = True
            log.warning(warning)
        if self.publish_base and found.identity is None and found.problem is None and found is not submitted:
            if args.world_size > 1 and self._pub.hasher is not None:
                _barrier()  # every rank has looked for the base's manifest before any worker writes it
            self._base_submitted = found
            self._pub.submit_base(_BaseJob(found))

    def _job(self, args: TrainingArguments, state: TrainerState) -> _Job:
        hp_search = getattr(state, "trial_params", None) is not None or bool(
            getattr(state, "trial_name", None)
        )
        folder = checkpoint_folder(
            args.output_dir,
            state.global_step,
            trial_name=getattr(state, "trial_name", None),
            hp_search=hp_search,
        )
        if self._producer is None:
            self._producer = producer_versions()
        provenance = {
            "step": int(state.global_step),
            "epoch": None if state.epoch is None else float(state.epoch),
            "run_dir": os.path.abspath(os.path.dirname(folder)),
            "producer": dict(self._producer),
        }
        index_dir = os.path.abspath(args.output_dir) if self.index else None
        return _Job(os.path.abspath(folder), int(state.global_step), provenance, index_dir, self._base)

    def _deliver(self, state: TrainerState) -> None:
        """Report finished publishes on the main thread: log history + next on_log."""
        for p in self._pub.take_done():
            self.published.append(p)
            self._undelivered.append(p)
            state.log_history.append(
                {"ckptpub/identity": p.identity, "ckptpub/step": p.step, "step": state.global_step}
            )


def _is_training_log(logs: object) -> TypeGuard[dict[str, Any]]:
    return (
        isinstance(logs, dict)
        and "loss" in logs
        and "train_runtime" not in logs
        and not any(str(k).startswith(("eval_", "test_", "predict_")) for k in logs)
    )


def _rank_hasher(timeout_s: float) -> DistributedHasher | None:
    """A hasher over every rank of the job (its own gloo group), or None when that is not possible."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return DistributedHasher(new_group(timeout_s))
    except Exception as exc:  # training goes on; the saving rank hashes alone
        log.warning("ckptpub: cannot hash over the job's ranks (%r); the saving rank hashes alone", exc)
        return None


def _barrier() -> None:
    """All ranks wait here: the Trainer does not wait for the writer before on_save."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
