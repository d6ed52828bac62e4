"""Shared fixtures: one set of tiny checkpoints and one engine run per test session.

vLLM engine starts are the expensive part (about 25 s for the first, a few seconds
for each further one in the same process), so every engine-level test reads its
result from a single ``run_engine.py`` subprocess started once per session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
ckptpub = pytest.importorskip("ckptpub")

from support.checkpoints import forged_regions, swap_first_entries  # noqa: E402
from support.s3fixtures import bucket, s3_server  # noqa: E402, F401  # the S3 server of test_object_store.py
from support.vllm_engine_helpers import TAMPERED_TENSOR, TOGGLED_LOADS, hub_env, run_engines, same_size_edit  # noqa: E402


@pytest.fixture(scope="session")
def lora_folders(tmp_path_factory) -> dict[str, str]:
    """A base, another base of the same shapes, and PEFT adapters of them (see ``build_lora_folders``).

    Shared, so never altered: a test that damages an adapter damages its own copy.
    """
    from tests.vllm.lora_helpers import build_lora_folders

    return build_lora_folders(str(tmp_path_factory.mktemp("lora")))


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    """v1 (12 shards, published); tampered (one tensor zeroed, v1's manifest);
    republished (tampered, published again); nomanifest; grown (a shard grew past its
    tensors); badheader (a shard's header damaged); tokenizer (a same-size edit of
    tokenizer.json); template (a chat template added after publishing); manifestdir
    (ckptpub.json is a folder); tables (its model region's first two entries swapped, sizes and
    identity recomputed); toggled (v1, for loads under a writer that flips two tensors); linked_templates
    (published with an ``additional_chat_templates/`` folder, which is then replaced by a symlink to an
    identical folder outside the checkpoint)."""
    from support.safetensors_files import copy_with_zeroed_tensor
    from support.tiny_model import build_tiny_qwen3

    root = tmp_path_factory.mktemp("ckpts")
    v1 = build_tiny_qwen3(str(root / "v1"), max_shard_size="150KB")
    ckptpub.publish(v1)
    tampered = copy_with_zeroed_tensor(v1, str(root / "tampered"), TAMPERED_TENSOR)
    republished = shutil.copytree(tampered, str(root / "republished"))
    ckptpub.publish(republished)
    nomanifest = shutil.copytree(v1, str(root / "nomanifest"))
    os.remove(os.path.join(nomanifest, ckptpub.MANIFEST_NAME))
    grown = shutil.copytree(v1, str(root / "grown"))
    with open(os.path.join(grown, "model-00003-of-00012.safetensors"), "ab") as f:
        f.write(b"\0" * 16)
    badheader = shutil.copytree(v1, str(root / "badheader"))
    with open(os.path.join(badheader, "model-00005-of-00012.safetensors"), "r+b") as f:
        f.seek(8)
        f.write(b"[")  # the header's opening brace: no longer a JSON object
    tokenizer = shutil.copytree(v1, str(root / "tokenizer"))
    same_size_edit(os.path.join(tokenizer, "tokenizer.json"), b"<|endoftext|>", b"<|endoftexT|>")
    template = shutil.copytree(v1, str(root / "template"))
    with open(os.path.join(template, "chat_template.jinja"), "w") as f:
        f.write("{{ messages[0]['content'] }}")
    manifestdir = shutil.copytree(nomanifest, str(root / "manifestdir"))
    os.mkdir(os.path.join(manifestdir, ckptpub.MANIFEST_NAME))
    toggled = shutil.copytree(v1, str(root / "toggled"))
    linked_templates = shutil.copytree(nomanifest, str(root / "linked_templates"))
    os.mkdir(os.path.join(linked_templates, "additional_chat_templates"))
    with open(os.path.join(linked_templates, "additional_chat_templates", "tool_use.jinja"), "w") as f:
        f.write("{{ tools }}")
    ckptpub.publish(linked_templates)
    shutil.move(os.path.join(linked_templates, "additional_chat_templates"), str(root / "templates_outside"))
    os.symlink(str(root / "templates_outside"), os.path.join(linked_templates, "additional_chat_templates"))
    tables = shutil.copytree(v1, str(root / "tables"))
    with open(os.path.join(tables, ckptpub.MANIFEST_NAME), "r+b") as f:
        unsorted = forged_regions(f.read(), lambda model, layout: (swap_first_entries(model), layout))
        f.seek(0)
        f.truncate()
        f.write(unsorted)
    return {
        "v1": v1,
        "tampered": tampered,
        "republished": republished,
        "nomanifest": nomanifest,
        "grown": grown,
        "badheader": badheader,
        "tokenizer": tokenizer,
        "template": template,
        "manifestdir": manifestdir,
        "tables": tables,
        "toggled": toggled,
        "linked_templates": linked_templates,
    }


@pytest.fixture(scope="session")
def hub_home(models, tmp_path_factory) -> dict[str, str]:
    """An ``HF_HOME`` whose cache holds v1's files as four models: ``acme/tiny-qwen3`` (published by
    hub id), ``acme/tampered`` (published, then one tensor zeroed in its blob: same header, same
    sizes), ``acme/unpublished`` and ``acme/badref`` (its ``refs/main`` holds a path into
    ``acme/tiny-qwen3``'s snapshot, which huggingface_hub would follow). Keys: ``home`` and each
    hub id's snapshot."""
    from support.hf_cache import cache_model
    from support.safetensors_files import find_tensor_file, tensor_location

    home = str(tmp_path_factory.mktemp("hf"))
    snapshots = {
        repo: cache_model(home, repo, models["nomanifest"])
        for repo in ("acme/tiny-qwen3", "acme/tampered", "acme/unpublished", "acme/badref")
    }
    with open(
        os.path.join(os.path.dirname(os.path.dirname(snapshots["acme/badref"])), "refs", "main"), "w"
    ) as f:
        f.write(os.path.relpath(snapshots["acme/tiny-qwen3"], os.path.dirname(snapshots["acme/badref"])))
    for repo in ("acme/tiny-qwen3", "acme/tampered"):
        ckptpub.publish(snapshots[repo])
    # Each repository has blobs of its own: zeroing acme/tampered's leaves the others as they were.
    blob = os.path.realpath(find_tensor_file(snapshots["acme/tampered"], TAMPERED_TENSOR))
    start, end = tensor_location(blob, TAMPERED_TENSOR)
    with open(blob, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))
    return {"home": home, **snapshots}


#: Engine jobs on hub ids (model, load format, extra config), run in the same runner as the rest.
HUB_JOBS = {
    "hub_auto": ("acme/tiny-qwen3", "auto", {}),
    "hub_manifest": ("acme/tiny-qwen3", "manifest_cache", {}),
    "hub_tampered": ("acme/tampered", "manifest_cache", {}),
    "hub_unpublished": ("acme/unpublished", "manifest_cache", {}),
    "hub_absent": ("acme/absent", "manifest_cache", {}),
    "hub_absent_auto": ("acme/absent", "auto", {}),
    "hub_badref": ("acme/badref", "manifest_cache", {}),
}


ENGINE_JOBS = {
    "v1_auto": ("v1", "auto", {}),
    "v1_manifest": ("v1", "manifest_cache", {}),
    "tampered_manifest": ("tampered", "manifest_cache", {}),
    "republished_manifest": ("republished", "manifest_cache", {}),
    "republished_auto": ("republished", "auto", {}),
    "nomanifest_manifest": ("nomanifest", "manifest_cache", {}),
    "nomanifest_optout": ("nomanifest", "manifest_cache", {"require_manifest": False}),
    "grown_manifest": ("grown", "manifest_cache", {}),
    "badheader_manifest": ("badheader", "manifest_cache", {}),
    "tokenizer_manifest": ("tokenizer", "manifest_cache", {}),
    "template_manifest": ("template", "manifest_cache", {}),
    "manifestdir_manifest": ("manifestdir", "manifest_cache", {"require_manifest": False}),
    "tables_manifest": ("tables", "manifest_cache", {}),
    **{f"toggled_{n}": ("toggled", "manifest_cache", {}) for n in range(TOGGLED_LOADS)},
    "tampered_unverified": ("tampered", "manifest_cache", {"verify": False}),
    "v1_bad_option": ("v1", "manifest_cache", {"no_such_option": 1}),
    "v1_no_fallback": ("v1", "manifest_cache", {"fallback": False}),
}


@pytest.fixture(scope="session")
def engine_results(models, hub_home) -> tuple[dict[str, dict], str]:
    """All engine jobs above, run in one subprocess (in-process engine cores)."""
    pinned = {"expect_identity": ckptpub.read_manifest(models["v1"]).identity}
    all_jobs = dict(
        ENGINE_JOBS,
        v1_pinned=("v1", "manifest_cache", pinned),
        republished_pinned=("republished", "manifest_cache", pinned),
        nomanifest_pinned=("nomanifest", "manifest_cache", dict(pinned, require_manifest=False)),
    )
    names = list(all_jobs) + list(HUB_JOBS)
    jobs = [{"model": models[m], "load_format": fmt, "extra": extra} for m, fmt, extra in all_jobs.values()]
    jobs += [{"model": m, "load_format": fmt, "extra": extra} for m, fmt, extra in HUB_JOBS.values()]
    with toggling(models["toggled"], [TAMPERED_TENSOR, "model.embed_tokens.weight"]):
        results, log = run_engines(jobs, env=hub_env(hub_home))
    return dict(zip(names, results, strict=True)), log


_TOGGLER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below puts the bytes back
spans = [(os.open(p, os.O_RDWR), int(a), int(b)) for p, a, b in zip(*[iter(sys.argv[1:])] * 3)]
original = [os.pread(fd, end - start, start) for fd, start, end in spans]
try:
    while True:
        for zeros in (True, False):
            for (fd, start, end), old in zip(spans, original):
                os.pwrite(fd, bytes(end - start) if zeros else old, start)
            time.sleep(0.0002)
finally:
    for (fd, start, _), old in zip(spans, original):
        os.pwrite(fd, old, start)
"""


@contextlib.contextmanager
def toggling(folder: str, names: list[str]):
    """A writer that sets the tensors ``names`` to zeros and back every 0.2 ms (a ``pwrite`` of the
    shard, as another process sharing the file could), for as long as the block runs."""
    from support.safetensors_files import find_tensor_file, tensor_location

    spans = []
    for name in names:
        shard = find_tensor_file(folder, name)
        spans += [shard, *map(str, tensor_location(shard, name))]
    writer = subprocess.Popen([sys.executable, "-c", _TOGGLER, *spans])
    try:
        yield
    finally:
        writer.terminate()
        writer.wait(timeout=30)
