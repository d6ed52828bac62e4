"""Signatures ckptpub writes are model_signing's own: its real CLI accepts them and refuses any change.

Every case runs the real ``model_signing`` command line as a subprocess and
``ckptpub``'s own check (the signature, then the usual byte-for-byte verify) on the
same folder: both must accept the untouched checkpoint and both must refuse each change.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from blake3 import blake3
from support import signhelpers
from support.checkpoints import flip_byte, locate, run_cli
from support.manifests import replaced

import ckptpub
from ckptpub import signing
from ckptpub._hashing.engine import Span, hash_files, hash_spans


def ckptpub_check(folder: Path, public_key: Path) -> list[str]:
    """What ckptpub finds wrong: the signature's problems, then (if it holds) verify's; [] if nothing."""
    report = signing.verify_signed(folder, signing.TrustedKey(public_key=str(public_key)))
    return [f"{problem.path}: {problem.detail}" for problem in report.problems]


def test_a_signed_checkpoint_verifies_with_both(signed: Path, keys: dict) -> None:
    result = signhelpers.model_signing_verify(signed, keys["trainer"].public)
    assert result.returncode == 0, result.stderr
    assert "Verification succeeded" in result.stdout
    check = signing.check_signature(signed, signing.TrustedKey(public_key=str(keys["trainer"].public)))
    assert check.ok, check.problems
    assert check.manifest == ckptpub.read_manifest(signed)
    assert ckptpub_check(signed, keys["trainer"].public) == []


def _edit_tensor(folder: Path) -> None:
    shard, begin, _ = locate(folder, "model.layers.1.mlp.up_proj.weight")
    flip_byte(shard, begin + 3)


def _edit_last_byte(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        flip_byte(folder / name, (folder / name).stat().st_size - 1)

    return edit


def _republish(folder: Path) -> None:
    """Change a weight and publish again without the key: a manifest that matches the bytes, unsigned."""
    _edit_tensor(folder)
    ckptpub.publish(folder)


def _edit_manifest(folder: Path) -> None:
    """A valid manifest of the same files whose provenance says another step (not the signed bytes)."""
    manifest = ckptpub.read_manifest(folder)
    (folder / "ckptpub.json").write_bytes(
        replaced(manifest, provenance={**manifest.provenance, "step": 21}).to_json()
    )


def _add_file(folder: Path) -> None:
    (folder / "README.md").write_text("a file added after signing\n")


def _remove_file(folder: Path) -> None:
    (folder / "optimizer.pt").unlink()


CHANGES = {
    "tensor byte": _edit_tensor,
    "shard header byte": lambda folder: flip_byte(folder / "model-00001-of-00002.safetensors", 20),
    "config.json byte": _edit_last_byte("config.json"),
    "optimizer.pt byte": _edit_last_byte("optimizer.pt"),
    "subfolder file byte": _edit_last_byte("logs/train.txt"),
    "index byte": _edit_last_byte("model.safetensors.index.json"),
    "manifest re-published": _republish,
    "manifest edited": _edit_manifest,
    "file added": _add_file,
    "file removed": _remove_file,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_fails_both(signed: Path, keys: dict, change: str) -> None:
    CHANGES[change](signed)
    result = signhelpers.model_signing_verify(signed, keys["trainer"].public)
    assert result.returncode != 0, f"model_signing verify accepted: {change}"
    assert "Verification failed" in result.stderr or "Signature mismatch" in result.stderr
    assert ckptpub_check(signed, keys["trainer"].public) != []
    cli = run_cli("verify", signed, "--public-key", keys["trainer"].public, "--quiet")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "FAILED" in cli.stdout
    assert "Traceback" not in cli.stderr


def test_the_cli_signs_and_verifies(tmp_path: Path, keys: dict) -> None:
    """``ckptpub publish --sign`` then ``ckptpub verify --public-key``: real subprocesses, exit codes."""
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    published = run_cli("publish", folder, "--sign", keys["trainer"].private)
    assert published.returncode == 0, published.stderr
    assert signhelpers.model_signing_verify(folder, keys["trainer"].public).returncode == 0
    ok = run_cli("verify", folder, "--public-key", keys["trainer"].public)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "model.sig" not in ok.stdout  # the signature is not content: never "added"
    assert run_cli("verify", folder).returncode == 0
    stranger = run_cli("verify", folder, "--public-key", keys["stranger"].public)
    assert stranger.returncode == 1
    assert "model.sig: FAILED (signature: signature does not verify" in stranger.stdout
    (folder / "model.sig").unlink()
    unsigned = run_cli("verify", folder, "--public-key", keys["trainer"].public)
    assert unsigned.returncode == 2
    assert unsigned.stderr.strip().splitlines() == [
        f"ckptpub: error: {folder}: no model.sig, so it is not signed; publish it with --sign KEY (sign=...)"
    ]
    bad_key = run_cli("publish", folder, "--sign", keys["trainer"].public)
    assert bad_key.returncode == 2
    assert "cannot sign with this key" in bad_key.stderr
    assert not (folder / "model.sig").exists()


def test_publishing_again_without_a_key_warns_that_the_old_signature_no_longer_verifies(
    tmp_path: Path, keys: dict
) -> None:
    """A folder changed after it was signed, published again without a key: the old signature is stale."""
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    assert run_cli("publish", folder, "--sign", keys["trainer"].private).returncode == 0
    (folder / "generation_config.json").write_text('{"max_new_tokens": 7}')
    again = run_cli("publish", folder)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == (
        f"ckptpub: warning: {folder / 'model.sig'} signs the manifest this publish replaced, "
        f"so it no longer verifies; sign again: ckptpub publish --sign KEY {folder}"
    )
    assert run_cli("verify", folder, "--public-key", keys["trainer"].public).returncode == 1  # as it says
    resigned = run_cli("publish", folder, "--sign", keys["trainer"].private)
    assert "warning" not in resigned.stderr
    assert run_cli("verify", folder, "--public-key", keys["trainer"].public).returncode == 0


def test_the_wrong_key_fails_both(signed: Path, keys: dict) -> None:
    result = signhelpers.model_signing_verify(signed, keys["stranger"].public)
    assert result.returncode != 0
    check = signing.check_signature(signed, signing.TrustedKey(public_key=str(keys["stranger"].public)))
    assert not check.ok
    assert check.manifest is None
    assert check.problems[0].path == "model.sig"
    assert "signature does not verify" in check.problems[0].detail


def test_a_removed_signature_fails_both(signed: Path, keys: dict) -> None:
    (signed / "model.sig").unlink()
    assert signhelpers.model_signing_verify(signed, keys["trainer"].public).returncode != 0
    with pytest.raises(ckptpub.CkptpubError, match=r"no model\.sig, so it is not signed"):
        signing.check_signature(signed, signing.TrustedKey(public_key=str(keys["trainer"].public)))


def test_a_signature_byte_edit_fails_both(signed: Path, keys: dict) -> None:
    bundle = json.loads((signed / "model.sig").read_bytes())
    raw = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    raw[-1] ^= 1
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    (signed / "model.sig").write_text(json.dumps(bundle))
    assert signhelpers.model_signing_verify(signed, keys["trainer"].public).returncode != 0
    assert "signature does not verify" in ckptpub_check(signed, keys["trainer"].public)[0]


def test_a_signature_that_leaves_the_manifest_out_is_refused(signed: Path, keys: dict) -> None:
    """model_signing's own signature with ckptpub.json ignored verifies there; ckptpub refuses it,
    since a re-published manifest would then pass."""
    result = signhelpers.model_signing_cli(
        "sign", "key", signed, "--signature", signed / "model.sig",
        "--private_key", keys["trainer"].private, "--ignore-paths", signed / "ckptpub.json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    check = signing.check_signature(signed, signing.TrustedKey(public_key=str(keys["trainer"].public)))
    assert [(p.path, p.detail) for p in check.problems] == [("ckptpub.json", "is not among the signed files")]


def test_model_signing_own_signature_of_a_published_folder_is_accepted(signed: Path, keys: dict) -> None:
    """Interoperability the other way: ``model_signing sign key`` over a published folder (it signs
    ckptpub.json like any file) passes ckptpub's check."""
    result = signhelpers.model_signing_cli(
        "sign", "key", signed, "--signature", signed / "model.sig", "--private_key", keys["trainer"].private
    )
    assert result.returncode == 0, result.stderr
    assert ckptpub_check(signed, keys["trainer"].public) == []


def _statement_and_rest(bundle_bytes: bytes) -> tuple[dict, dict]:
    """The bundle's in-toto statement (ignored paths as a set) and the bundle without it and its signature."""
    bundle = json.loads(bundle_bytes)
    envelope = bundle["dsseEnvelope"]
    statement = json.loads(base64.b64decode(envelope.pop("payload")))
    serialization = statement["predicate"]["serialization"]
    serialization["ignore_paths"] = sorted(serialization["ignore_paths"])
    assert len(envelope.pop("signatures")) == 1
    return statement, bundle


def test_the_bundle_holds_what_model_signing_sign_writes(signed: Path, keys: dict) -> None:
    """The same statement, the same bundle around it, the same verification material; the ECDSA
    signature differs (random by design). Compared as data: model_signing's own output is not
    byte-stable (two ``model_signing sign`` runs over one folder order JSON keys differently, even
    under one PYTHONHASHSEED: protobuf orders them)."""
    ours_bytes = (signed / "model.sig").read_bytes()
    result = signhelpers.model_signing_cli(
        "sign", "key", signed, "--signature", signed / "model.sig", "--private_key", keys["trainer"].private
    )
    assert result.returncode == 0, result.stderr
    theirs_bytes = (signed / "model.sig").read_bytes()
    assert _statement_and_rest(ours_bytes) == _statement_and_rest(theirs_bytes)
    statement = _statement_and_rest(ours_bytes)[0]
    names = [resource["name"] for resource in statement["predicate"]["resources"]]
    assert names == sorted(names)
    assert {"ckptpub.json", "logs/train.txt", "model-00002-of-00002.safetensors"} <= set(names)
    assert not {".gitattributes", "model.sig"} & set(names)


def test_certificate_chain(signed: Path, certificates: dict) -> None:
    company, other = certificates["company"], certificates["other"]
    key = signing.SigningKey(str(company.private), str(company.certificate), (str(company.root),))
    ckptpub.publish(signed, sign=key)
    for root, accepted in ((company.root, True), (other.root, False)):
        result = signhelpers.model_signing_cli(
            "verify", "certificate", signed, "--signature", signed / "model.sig", "--certificate_chain", root
        )
        assert (result.returncode == 0) is accepted, result.stderr
        check = signing.check_signature(signed, signing.TrustedKey(certificate_chain=(str(root),)))
        assert check.ok is accepted, check.problems


def test_the_check_reads_only_the_signature_and_the_manifest(signed: Path, keys: dict) -> None:
    """An audit hook records every file the check opens in a fresh interpreter (model_signing imported
    first, so its own module files are not counted)."""
    program = (
        "import os, sys, ckptpub.signing as s, ckptpub._operations.signing_backend; opened = []; "
        "sys.addaudithook(lambda e, a: opened.append(os.fsdecode(a[0])) "
        "if e in ('open', 'os.listdir', 'os.scandir') and a and isinstance(a[0], (str, bytes)) else None); "
        "check = s.check_signature(sys.argv[1], s.TrustedKey(public_key=sys.argv[2])); "
        "print(check.ok); print('\\n'.join(opened))"
    )
    result = signhelpers.run_python(program, signed, keys["trainer"].public)
    assert result.returncode == 0, result.stderr
    ok, *opened = result.stdout.splitlines()
    assert ok == "True"
    in_folder = sorted(os.path.relpath(p, signed) for p in opened if p.startswith(str(signed)))
    assert in_folder == ["ckptpub.json", "model.sig"]
    assert str(keys["trainer"].public) in opened


def test_import_ckptpub_does_not_import_model_signing() -> None:
    program = (
        "import sys, ckptpub, ckptpub.cli; ckptpub.publish; ckptpub.verify; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('model_signing', 'cryptography')))"
    )
    result = signhelpers.run_python(program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_without_the_extra_signing_says_how_to_install_it(signed: Path, keys: dict) -> None:
    """``sys.modules['model_signing'] = None`` makes every import of it fail, as on a machine without it."""
    program = (
        "import sys; sys.modules['model_signing'] = None; import ckptpub; from ckptpub import signing; "
        "signing.check_signature(sys.argv[1], signing.TrustedKey(public_key=sys.argv[2]))"
    )
    result = signhelpers.run_python(program, signed, keys["trainer"].public)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].endswith("pip install 'ckptpub[sign]'")


def _bytes_read() -> int:
    """What this process has read through read-like system calls so far (Linux's ``rchar``)."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_whole_file_digests_come_from_the_tensor_pass(signed: Path, algorithm: str) -> None:
    """The whole-file digests equal hashlib's SHA-256 / b3sum's BLAKE3 of each file, and the span
    digests are the ones computed without them."""
    whole = {
        "sha256": lambda data: hashlib.sha256(data).hexdigest(),
        "blake3": lambda data: blake3(data).hexdigest(),
    }
    manifest = ckptpub.read_manifest(signed)
    spans: list[Span] = []
    for record in manifest.files:
        path = str(signed / record.path)
        if record.header_size is None:
            spans.append(Span(path, 0, record.size, record.path))
            continue
        spans.append(Span(path, 0, record.header_size, record.path))
        spans.extend(
            Span(path, record.header_size + t.data_offsets[0], record.header_size + t.data_offsets[1], t.name)
            for t in manifest.tensors
            if t.file == record.path
        )
    for threads in (1, 3):
        digests, files = hash_files(spans, algorithm, threads=threads)
        assert digests == hash_spans(spans, threads=threads)
        assert files == [whole[algorithm]((signed / r.path).read_bytes()) for r in manifest.files]
    before = _bytes_read()
    probe = _bytes_read() - before  # reading /proc/self/io counts too
    before = _bytes_read()  # through pread every byte read is counted: each exactly once
    assert hash_files(spans, algorithm, use_mmap=False).spans == digests
    read = _bytes_read() - before - probe
    assert abs(read - sum(r.size for r in manifest.files)) <= 2  # the probe's length may differ by a digit
    last = max(i for i, span in enumerate(spans) if span.path.endswith("model-00001-of-00002.safetensors"))
    with pytest.raises(ckptpub.CkptpubError, match="spans do not cover the whole file"):
        hash_files(spans[:last] + spans[last + 1 :], algorithm)


def test_a_blake3_signature_lists_each_file_s_blake3(tmp_path: Path, keys: dict) -> None:
    """``publish --sign KEY --sign-hash blake3``: model_signing's Python API accepts it (it reads the
    algorithm from the signature), and so does ``ckptpub verify --public-key``; the model_signing
    command does not (it re-hashes with SHA-256 whatever the signature says), which is why SHA-256
    stays the default."""
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    published = run_cli("publish", folder, "--sign", keys["trainer"].private, "--sign-hash", "blake3")
    assert published.returncode == 0, published.stderr
    statement, _ = _statement_and_rest((folder / "model.sig").read_bytes())
    assert statement["predicate"]["serialization"]["hash_type"] == "blake3"
    resources = {r["name"]: (r["algorithm"], r["digest"]) for r in statement["predicate"]["resources"]}
    signed_paths = [r.path for r in ckptpub.read_manifest(folder).files if r.path != ".gitattributes"]
    assert resources == {
        path: ("blake3", blake3((folder / path).read_bytes()).hexdigest())
        for path in [*signed_paths, "ckptpub.json"]
    }
    assert signhelpers.model_signing_api_verify(folder, keys["trainer"].public) is None
    ok = run_cli("verify", folder, "--public-key", keys["trainer"].public)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert signhelpers.model_signing_api_verify(folder, keys["stranger"].public) is not None
    assert run_cli("verify", folder, "--public-key", keys["stranger"].public).returncode == 1
    command = signhelpers.model_signing_verify(folder, keys["trainer"].public)
    assert command.returncode != 0
    assert "algorithm='sha256'" in command.stderr


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_fails_both_with_blake3(signed_blake3: Path, keys: dict, change: str) -> None:
    CHANGES[change](signed_blake3)
    assert signhelpers.model_signing_api_verify(signed_blake3, keys["trainer"].public) is not None, change
    cli = run_cli("verify", signed_blake3, "--public-key", keys["trainer"].public, "--quiet")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "FAILED" in cli.stdout
    assert "Traceback" not in cli.stderr


def test_a_blake3_signature_of_a_one_byte_change_is_refused_by_both(signed_blake3: Path, keys: dict) -> None:
    """The issue's case, by name: one byte of one tensor."""
    assert signhelpers.model_signing_api_verify(signed_blake3, keys["trainer"].public) is None
    _edit_tensor(signed_blake3)
    refused = signhelpers.model_signing_api_verify(signed_blake3, keys["trainer"].public)
    assert refused is not None
    assert "Hash mismatch for 'model-" in refused
    cli = run_cli("verify", signed_blake3, "--public-key", keys["trainer"].public)
    assert cli.returncode == 1
    assert "model.layers.1.mlp.up_proj.weight" in cli.stdout


@pytest.mark.parametrize("sign_hash", ["md5", "SHA256", None, 3])
def test_an_unknown_sign_hash_is_one_line_before_anything_is_written(
    tmp_path: Path, keys: dict, sign_hash: object
) -> None:
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(ckptpub.CkptpubError) as raised:
        ckptpub.publish(folder, sign=keys["trainer"].private, sign_hash=sign_hash)  # type: ignore[arg-type]
    assert str(raised.value) == f"sign_hash: expected one of 'sha256', 'blake3', got {sign_hash!r}"
    assert not (folder / "ckptpub.json").exists()
    cli = run_cli("publish", folder, "--sign-hash", "blake3")
    assert cli.returncode == 2
    assert "--sign-hash, --signing-certificate and --certificate-chain need --sign KEY" in cli.stderr
    assert not (folder / "ckptpub.json").exists()


@pytest.mark.parametrize("kind", ["missing", "public key", "not PEM", "secp256k1"])
def test_a_key_that_cannot_sign_fails_before_anything_is_written(
    tmp_path: Path, keys: dict, kind: str
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    before = sorted(p.name for p in folder.iterdir())
    key = {
        "missing": tmp_path / "absent.pem",
        "public key": keys["trainer"].public,
        "not PEM": folder / "tokenizer.json",
        "secp256k1": signhelpers.make_key(tmp_path / "k1", "k1", ec.SECP256K1()).private,
    }[kind]
    with pytest.raises(ckptpub.CkptpubError, match=str(key)):
        ckptpub.publish(folder, sign=key)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_folder_with_a_symlink_inside(tmp_path: Path, keys: dict) -> None:
    """A symlink to a file inside counts as that file (ckptpub's rule); the signature records
    allow_symlinks, and model_signing verifies it with --allow_symlinks (its CLI ignores the flag
    stored in the signature), and only with it."""
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    (folder / "tokenizer_config.json").symlink_to("tokenizer.json")
    ckptpub.publish(folder, sign=keys["trainer"].private)
    command = (
        "verify",
        "key",
        folder,
        "--signature",
        folder / "model.sig",
        "--public_key",
        keys["trainer"].public,
    )
    assert signhelpers.model_signing_cli(*command, "--allow_symlinks").returncode == 0
    assert signhelpers.model_signing_cli(*command).returncode != 0
    assert ckptpub_check(folder, keys["trainer"].public) == []


def test_the_cli_signs_with_a_certificate(tmp_path: Path, certificates: dict) -> None:
    company, other = certificates["company"], certificates["other"]
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    published = run_cli(
        "publish", folder, "--sign", company.private,
        "--signing-certificate", company.certificate, "--certificate-chain", company.root,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert run_cli("verify", folder, "--certificate-chain", company.root).returncode == 0
    assert run_cli("verify", folder, "--certificate-chain", other.root).returncode == 1


@pytest.mark.parametrize("sign", [123, "", b"a\0b", ["key.pem"], signing.SigningKey("k.pem")])
def test_bad_sign_arguments_are_one_line_errors(tmp_path: Path, sign: object) -> None:
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(ckptpub.CkptpubError) as raised:
        ckptpub.publish(folder, sign=sign)
    assert "\n" not in str(raised.value)
    assert not (folder / "ckptpub.json").exists()


def test_trusted_key_takes_exactly_one_of_key_or_chain() -> None:
    with pytest.raises(ckptpub.CkptpubError, match="either a public key or a certificate chain"):
        signing.TrustedKey()
    with pytest.raises(ckptpub.CkptpubError, match="either a public key or a certificate chain"):
        signing.TrustedKey("key.pub", ("root.pem",))
    assert signing.TrustedKey(certificate_chain=[Path("root.pem")]).certificate_chain == ("root.pem",)


def test_signed_or_plain_is_decided_by_one_function(signed: Path, keys: dict) -> None:
    """``read_trusted_manifest``: with a key only what it signed, without one the folder's own manifest."""
    trusted = signing.TrustedKey.of(str(keys["trainer"].public))
    assert trusted == signing.TrustedKey(public_key=str(keys["trainer"].public))
    assert signing.TrustedKey.of(None, ()) is None
    assert signing.read_trusted_manifest(signed, trusted) == ckptpub.read_manifest(signed)
    assert signing.read_trusted_manifest(signed, None) == ckptpub.read_manifest(signed)
    stranger = signing.TrustedKey.of(str(keys["stranger"].public))
    with pytest.raises(ckptpub.CkptpubError, match=r": not what the trusted key signed: model.sig: "):
        signing.read_trusted_manifest(signed, stranger)
    environment = {"CKPTPUB_PUBLIC_KEY": f" {keys['trainer'].public} "}
    assert signing.TrustedKey.from_environment(environment) == trusted
    chain = {"CKPTPUB_CERTIFICATE_CHAIN": os.pathsep.join(["a.pem", " ", "b.pem"])}
    from_chain = signing.TrustedKey.from_environment(chain)
    assert from_chain == signing.TrustedKey(certificate_chain=("a.pem", "b.pem"))
    assert signing.TrustedKey.from_environment({}) is None
    _republish(signed)  # a valid manifest, but not the signed one
    with pytest.raises(ckptpub.CkptpubError, match=r"ckptpub.json: differs from the one signed"):
        signing.read_trusted_manifest(signed, trusted)
    assert signing.read_trusted_manifest(signed, None).identity == ckptpub.read_manifest(signed).identity
