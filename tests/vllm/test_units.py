"""The plugin's pieces without an engine: options, the stream verifier, the engine-file check."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from ckptpub_vllm.shared.options import Options, split_extra_config
from ckptpub_vllm.worker.verify_stream import TensorVerifier
from support.checkpoints import run_cli
from support.manifests import replaced
from support.safetensors_files import stream_tensors as stream

import ckptpub
from ckptpub.serving import INLINE_HASH_BYTES, RefusedError, engine_file_problems, engine_reads


def verifier(folder, **kw):
    return TensorVerifier(folder, ckptpub.read_manifest(folder), **kw)


def _verify_all(v, tensors):
    """Pass every tensor through the verifier, as vLLM's loader would, then finish."""
    for _ in v.wrap(tensors):
        pass
    v.finish()


def test_options_are_taken_out_and_the_rest_is_left_for_vllm(monkeypatch):
    monkeypatch.delenv("CKPTPUB_REQUIRE_MANIFEST", raising=False)
    opts, rest = split_extra_config({"verify": False, "hash_threads": 3, "mode": "copy", "fallback": False})
    assert opts == Options(verify=False, hash_threads=3)
    assert rest == {"mode": "copy", "fallback": False}
    assert split_extra_config(None)[0].require_manifest is True  # manifest_cache asks for the guarantee
    assert split_extra_config({"require_manifest": False})[0].require_manifest is False
    with pytest.raises(ValueError, match="verify"):
        split_extra_config({"verify": "yes"})
    with pytest.raises(ValueError, match="hash_threads"):
        split_extra_config({"hash_threads": 0})


def test_a_require_manifest_flag_neither_on_nor_off_is_refused_by_the_options_parser(monkeypatch):
    """An engine with ``CKPTPUB_REQUIRE_MANIFEST=maybe`` refuses to start, in the core's words."""
    monkeypatch.setenv("CKPTPUB_REQUIRE_MANIFEST", "maybe")
    with pytest.raises(
        ValueError, match=r"^CKPTPUB_REQUIRE_MANIFEST: 'maybe' is neither on .* nor off .*\)$"
    ):
        split_extra_config({})
    monkeypatch.setenv("CKPTPUB_REQUIRE_MANIFEST", "off")
    assert split_extra_config({})[0] == Options()


@pytest.mark.parametrize(
    "identity",
    [
        "blake3:" + "g" * 64,  # 71 characters, not hex: was accepted before the one identity check
        "blake3:" + "A" * 64,  # upper case: never what ckptpub writes, so it would match nothing
        "blake3:" + "0" * 63 + " ",
        "blake3:" + "0" * 63,
        "sha256:" + "0" * 64,
        7,
    ],
)
def test_a_malformed_expect_identity_is_refused_with_a_clear_message(identity):
    expected = (
        f"manifest_cache option 'expect_identity': {identity!r} is not of the form blake3:<64 lowercase hex"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)} digits>$"):
        split_extra_config({"expect_identity": identity})


def test_a_wellformed_expect_identity_is_kept():
    identity = "blake3:" + "0123456789abcdef" * 4
    assert split_extra_config({"expect_identity": identity})[0].expect_identity == identity


def test_clean_stream_verifies(models):
    v = verifier(models["v1"], threads=2, max_pending_mib=1)  # tiny window: exercises back-pressure
    _verify_all(v, stream(models["v1"]))
    assert v.verified_tensors == 25


def test_tampered_bytes_are_named(models):
    v = verifier(models["tampered"])
    with pytest.raises(RefusedError, match="'model.norm.weight' differs from the manifest"):
        _verify_all(v, stream(models["tampered"]))


@pytest.mark.parametrize("large", [False, True], ids=["hashed inline", "hashed on the pool"])
def test_a_changed_tensor_is_named_whichever_thread_hashes_it(models, large):
    items = list(stream(models["v1"]))
    index = next(i for i, (_, t) in enumerate(items) if (t.nbytes > INLINE_HASH_BYTES) == large)
    name, tensor = items[index]
    changed = tensor.clone()
    changed.view(-1)[0] += 1
    items[index] = (name, changed)
    with pytest.raises(RefusedError, match=f"'{re.escape(name)}' differs from the manifest"):
        _verify_all(verifier(models["v1"]), items)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda n, t: (n, t.double()), "has dtype F64, the manifest says F32"),
        (lambda n, t: (n, t.reshape(-1)), "has shape"),
        (lambda n, t: (n + ".extra", t), "is not in the manifest"),
    ],
)
def test_name_dtype_and_shape_are_checked(models, change, message):
    v = verifier(models["v1"])
    name, tensor = next(iter(stream(models["v1"])))
    bad_name, bad_tensor = change(name, tensor)
    if tensor.dim() < 2 and "shape" in message:
        pytest.skip("first tensor is 1-d")
    with pytest.raises(RefusedError, match=message):
        v.check(bad_name, bad_tensor)
    v.close()


def test_duplicate_and_missing_tensors_are_refused(models):
    items = list(stream(models["v1"]))
    v = verifier(models["v1"])
    v.check(*items[0])
    with pytest.raises(RefusedError, match="read twice"):
        v.check(*items[0])
    v.close()
    v = verifier(models["v1"])
    for item in items[:-1]:
        v.check(*item)
    with pytest.raises(RefusedError, match=f"'{items[-1][0]}' never arrived"):
        v.finish()
    v = verifier(models["v1"])
    v.check(*items[0])
    v.mark_partial("expert-parallel weight filter")
    v.finish()  # vLLM skipped the rest on purpose


@pytest.mark.parametrize(
    ("path", "read"),
    [
        ("config.json", True),
        ("generation_config.json", True),
        ("tokenizer.json", True),
        ("tokenizer.model", True),
        ("chat_template.jinja", True),
        ("merges.txt", True),
        ("vocab.json", True),
        ("special_tokens_map.json", True),
        ("preprocessor_config.json", True),
        ("additional_chat_templates/tool_use.jinja", True),
        ("model-00001-of-00002.safetensors", False),
        ("model.safetensors.index.json", False),
        ("trainer_state.json", False),
        ("optimizer.pt", False),
        ("rng_state.pth", False),
        ("README.md", False),
        ("global_step5/zero_pp_rank_0_mp_rank_00_model_states.pt", False),
        ("sub/config.json", False),
    ],
)
def test_engine_reads_the_files_vllm_and_transformers_open(path, read):
    assert engine_reads(path) is read


def test_engine_files_are_checked_whole_and_unlisted_ones_refused(models, tmp_path):
    folder = shutil.copytree(models["v1"], tmp_path / "c")
    manifest = ckptpub.read_manifest(str(folder))
    assert engine_file_problems(str(folder), manifest) == []
    os.mkdir(folder / "additional_chat_templates")
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}")
    (folder / "generation_config.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")  # must not hang the engine start
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/etc/hostname")
    problems = engine_file_problems(str(folder), manifest)
    assert problems == [
        "additional_chat_templates/tool_use.jinja is not in the manifest, and an engine reads it",
        "config.json: symlink points outside the checkpoint folder",
        "generation_config.json is missing",
        "tokenizer_config.json: a named pipe (FIFO), not a regular file",
    ], problems


def test_a_template_folder_behind_a_symlink_is_refused_by_verify_and_by_the_engine_check(models):
    """One rule for both (issue 31): the templates an engine reads are read as ``ckptpub verify`` reads
    them, so a folder of them replaced by a symlink to an identical folder outside is refused by both."""
    folder = models["linked_templates"]
    verified = run_cli("verify", folder)
    assert verified.returncode == 2, verified
    assert "additional_chat_templates" in verified.stderr, verified.stderr
    assert "symlink" in verified.stderr, verified.stderr
    assert engine_file_problems(folder, ckptpub.read_manifest(folder)) == [
        "additional_chat_templates/tool_use.jinja: in a folder behind a symlink; not supported in a "
        "checkpoint folder"
    ]


def test_an_engine_config_is_read_as_strictly_as_publish_reads_it(models, tmp_path):
    """A forged manifest lists config bytes with a duplicate key (json.loads: last wins, same meaning).

    publish never records such a config (its reader refuses duplicate keys), so the
    engine-file check, which reads configs with the same strict reader, refuses it.
    """
    folder = shutil.copytree(models["v1"], tmp_path / "c")
    config = (folder / "config.json").read_bytes()
    first_key = config.split(b'"')[1]
    forged = config.replace(b"{", b'{"' + first_key + b'": "overwritten", ', 1)
    (folder / "config.json").write_bytes(forged)
    manifest = ckptpub.read_manifest(str(folder))
    files = tuple(
        r._replace(size=len(forged), digest=ckptpub.tensor_digest(forged)) if r.path == "config.json" else r
        for r in manifest.files
    )
    forged_manifest = replaced(manifest, files=files)
    (folder / ckptpub.MANIFEST_NAME).write_bytes(forged_manifest.to_json())
    assert ckptpub.read_manifest(str(folder)).identity == manifest.identity  # a valid manifest, same identity
    assert engine_file_problems(str(folder), forged_manifest) == [
        "config.json: the manifest records another config meaning (forged manifest?)"
    ]


def test_every_refusal_is_one_line_of_one_shape_and_keeps_paths_exact():
    error = RefusedError("/ckpt/step  1\n2", "tensor 'x' differs", more=2, hint="run `ckptpub verify`")
    assert str(error) == (
        "ckptpub: refusing to serve /ckpt/step  1\\n2: tensor 'x' differs (and 2 more); run `ckptpub verify`"
    )
    assert (error.folder, error.reason) == ("/ckpt/step  1\n2", "tensor 'x' differs")
    assert str(RefusedError.for_problems("/c", ["a", "b"])) == "ckptpub: refusing to serve /c: a (and 1 more)"


def test_no_refusal_or_log_line_of_the_plugin_lets_a_control_character_through(caplog):
    """A terminal escape in a folder or tensor name is escaped (``one_line``), in a refusal and in the log."""
    from ckptpub_vllm.shared.log import logger

    error = RefusedError("/ckpt/\x1b[2J", "tensor 'a\tb' differs")
    assert str(error) == "ckptpub: refusing to serve /ckpt/\\x1b[2J: tensor 'a\\tb' differs"
    assert str(RefusedError.relayed("relayed \x1b[2J\r")) == "relayed \\x1b[2J\\r"
    with caplog.at_level("INFO", logger="vllm.ckptpub"):
        logger.info("ckptpub: requested %s, identity %s", "/m\x1b[2J\nx", "blake3:0")
    assert caplog.records[-1].getMessage() == "ckptpub: requested /m\\x1b[2J\\nx, identity blake3:0"


def test_any_ckptpub_error_in_the_loader_is_a_refusal_in_the_same_words():
    """The loader's entry points let no bare ``CkptpubError`` through (a check that raises one
    directly, a table decoded late): each becomes the one refusal line, logged once."""
    from ckptpub_vllm.shared.refusals import refusals_logged

    with pytest.raises(RefusedError) as raised, refusals_logged("/ckpt"):
        raise ckptpub.CkptpubError("/ckpt/ckptpub.json: model table: names are not sorted and unique")
    assert str(raised.value) == (
        "ckptpub: refusing to serve /ckpt: /ckpt/ckptpub.json: model table: names are not sorted and unique"
    )


@pytest.mark.parametrize("large", [False, True], ids=["hashed inline", "hashed on the pool"])
def test_a_write_to_the_shard_after_the_check_never_reaches_the_model(models, tmp_path, large):
    """vLLM's own safetensors iterator yields views of each shard's mapping; a ``pwrite`` of zeros
    lands after the verifier saw a tensor and before the model copies it (as ``weight_loader`` does).
    What the model holds is still the verified bytes: the verifier hands on its own copy."""
    from support.safetensors_files import find_tensor_file, tensor_location
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    from ckptpub.serving_torch import raw_bytes

    folder = shutil.copytree(models["v1"], tmp_path / "ckpt")
    manifest = ckptpub.read_manifest(folder)
    expected = manifest.model()
    target = next(n for n, e in sorted(expected.items()) if (_nbytes(e) > INLINE_HASH_BYTES) == large)
    shard = find_tensor_file(str(folder), target)
    start, end = tensor_location(shard, target)
    shards = [os.path.join(folder, name) for name in manifest.weights]
    v = TensorVerifier(str(folder), manifest)
    model: dict[str, object] = {}
    fd = os.open(shard, os.O_WRONLY)
    try:
        for name, tensor in v.wrap(safetensors_weights_iterator(shards, False)):
            if name == target:
                os.pwrite(fd, bytes(end - start), start)  # the attacker's write, between check and copy
            model[name] = tensor.clone()  # what the model's weight_loader does with it
        v.finish()
    finally:
        os.close(fd)
    assert set(model) == set(expected)
    for name, loaded in model.items():
        assert ckptpub.tensor_digest(raw_bytes(loaded)) == expected[name].digest, name
    with open(shard, "rb") as handle:  # the file holds zeros there now; the model never did
        assert handle.read()[start:end] == bytes(end - start)


def _nbytes(entry) -> int:
    from ckptpub._format.safetensors import DTYPE_BITS

    count = 1
    for dim in entry.shape:
        count *= dim
    return count * DTYPE_BITS[entry.dtype] // 8
