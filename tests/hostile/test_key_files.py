"""Every key file that cannot be used, through every entry point that reads a key: one line, never a hang.

Cases (``key_cases``): each key type model_signing does not take (RSA, DSA, Ed25519, Ed448,
X25519, X448, ECDSA on secp256k1), a password-protected key, the wrong half of a key, and
files that are no key at all (a FIFO, a symlink to one, ``/dev/zero``, a folder, a missing,
empty, random or 2 MiB file). Entry points: ``ckptpub publish --sign``, ``ckptpub verify
--public-key`` and ``--certificate-chain`` (real subprocesses under a timeout), ``publish(sign=)``
and ``check_signature`` (in this process, under a deadline), and the vLLM engine's start checks
with ``public_key`` in the loader's options or ``CKPTPUB_PUBLIC_KEY`` in the environment (the
loader's own functions; no engine is started for a refusal that comes before any weight).

Each must refuse in one line naming the key file (exit 2 for the CLI), write nothing, and end
at once: a FIFO is never opened for a blocking read, ``/dev/zero`` never read (its ``fstat``
refuses it), so memory stays bounded too.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from support.checkpoints import deadline, run_cli, snapshot, write_checkpoint

import ckptpub
from ckptpub import signing
from tests.hostile.key_cases import KEY_CASES, KeyCase, key_pair

CLI_ENTRIES = ("publish --sign", "verify --public-key", "verify --certificate-chain")
IN_PROCESS_ENTRIES = ("publish(sign=)", "check_signature", "engine public_key", "engine CKPTPUB_PUBLIC_KEY")
ENTRIES = CLI_ENTRIES + IN_PROCESS_ENTRIES
PARAMS = [(case, entry) for case in KEY_CASES for entry in ENTRIES]


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint signed with a good key, for the verifying entry points."""
    root = tmp_path_factory.mktemp("signed")
    good = key_pair(lambda: ec.generate_private_key(ec.SECP256R1()))(root, "private")
    folder = write_checkpoint(root / "ckpt")
    ckptpub.publish(folder, sign=good)
    return folder


def test_key_corpus_size() -> None:
    print(f"key files: {len(KEY_CASES)} cases x {len(ENTRIES)} entry points = {len(PARAMS)} runs")
    assert len({c.name for c in KEY_CASES}) == len(KEY_CASES) >= 15


def half_for(entry: str) -> str:
    return "private" if entry.startswith("publish") else "public"


@pytest.mark.parametrize(("case", "entry"), PARAMS, ids=[f"{c.name}-{e}" for c, e in PARAMS])
def test_an_unusable_key_is_one_line(
    tmp_path: Path, signed: Path, monkeypatch: pytest.MonkeyPatch, case: KeyCase, entry: str
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    key = case.make(keys, half_for(entry))
    folder = Path(shutil.copytree(signed, tmp_path / "ckpt"))
    if entry.startswith("publish"):
        for name in ("ckptpub.json", "model.sig"):
            (folder / name).unlink()
    before = snapshot(folder)
    if entry in CLI_ENTRIES:
        message = refusal_of_the_cli(entry, key, folder)
    else:
        with deadline(30, f"{entry} with {case.name}"):
            message = refusal_in_process(entry, key, folder, monkeypatch)
    assert "\n" not in message, message
    assert "Traceback" not in message, message
    assert f"{key}" in message, message
    if entry != "verify --certificate-chain":  # a chain is certificates: key types are said otherwise
        assert case.message in message, message
    assert snapshot(folder) == before, f"{entry} with {case.name} changed the folder"


def refusal_of_the_cli(entry: str, key: Path, folder: Path) -> str:
    """The CLI's one error line; exit 2 and nothing on stdout (a hang fails the run's timeout)."""
    verb, option = entry.split()
    result = run_cli(verb, option, key, folder, timeout=60)
    assert result.returncode == 2, (entry, result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("ckptpub: error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


def refusal_in_process(entry: str, key: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The refusal's text: a ``CkptpubError`` from the Python API, the engine's one-line refusal."""
    if entry.startswith("engine"):
        return engine_refusal(entry, key, folder, monkeypatch)
    calls: dict[str, Callable[[], object]] = {
        "publish(sign=)": lambda: ckptpub.publish(folder, sign=key),
        "check_signature": lambda: signing.check_signature(folder, signing.TrustedKey(key)),
    }
    with pytest.raises(ckptpub.CkptpubError) as raised:
        calls[entry]()
    assert type(raised.value) is ckptpub.CkptpubError
    return str(raised.value)


def engine_refusal(entry: str, key: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("vllm")
    from ckptpub_vllm.shared.key import read_folder_manifest
    from ckptpub_vllm.shared.options import split_extra_config
    from ckptpub_vllm.shared.startup import check_before_start

    from ckptpub.integration import PUBLIC_KEY_ENV
    from ckptpub.serving import RefusedError

    if entry == "engine CKPTPUB_PUBLIC_KEY":  # daemons, plain ipc_cache engines: the cache key's read
        monkeypatch.setenv(PUBLIC_KEY_ENV, str(key))
    options = split_extra_config({"public_key": str(key)} if entry == "engine public_key" else {})[0]
    with pytest.raises(RefusedError) as raised:
        (check_before_start(str(folder), options) if options.trusted else read_folder_manifest(str(folder)))
    message = str(raised.value)
    assert message.startswith(f"ckptpub: refusing to serve {folder}: "), message
    return message
