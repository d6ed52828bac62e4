"""Every path to an adapter folder is that folder (issue 34, A1 and A2), generated.

An ``adapter_identities`` pin keyed by a folder must meet every request that reaches
that folder, however the request (or the pin) spells it: a symlink to it, a chain of
them, a relative one, a symlinked parent, ``..``, ``~``, a relative path, a trailing
slash. Each spelling of the request times each spelling of the pin's key goes through
the worker's own load (``load_checked``: refused before vLLM reads anything) and its
check (``check_adapter``: served when the pin is the folder's identity).

Neighbours of the same rule: vLLM keys what a worker holds by LoRA id alone, so a
request under a held id is answered by the held adapter only when it names the same
folder (by any spelling) and no pin of its own name differs (``check_held``).

No engine: the folders are small published checkpoints (only ``ckptpub.json`` is read
before a refusal), the requests vLLM's own ``LoRARequest``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from ckptpub_vllm.shared.options import split_extra_config  # noqa: E402
from ckptpub_vllm.worker import adapters  # noqa: E402
from support.checkpoints import model_tensors, write_checkpoint  # noqa: E402

import ckptpub  # noqa: E402
from ckptpub.serving import RefusedError  # noqa: E402

OTHER = "blake3:" + "7" * 64


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``real/pinned`` (a published folder), ``real/sibling`` (another one), and links to them."""
    root = tmp_path_factory.mktemp("adapter_paths")
    real = root / "real"
    for name, seed in (("pinned", 0), ("sibling", 1)):
        folder = write_checkpoint(real / name, model_tensors(seed=seed), extra_files=False)
        ckptpub.publish(folder)
    (root / "link").symlink_to(real / "pinned")
    (root / "chain").symlink_to(root / "link")
    (root / "relative_link").symlink_to(Path("real") / "pinned")
    (root / "parent_link").symlink_to(real)
    (root / "home").mkdir()
    (root / "home" / "adapters").symlink_to(real)
    return {"root": root, "real": real, "pinned": real / "pinned", "sibling": real / "sibling"}


#: How a request (or a pin's key) can name ``real/pinned``: each is a function of the places.
SPELLINGS: dict[str, Callable[[dict[str, Path]], str]] = {
    "the folder": lambda p: str(p["pinned"]),
    "a symlink to it": lambda p: str(p["root"] / "link"),
    "a symlink to that symlink": lambda p: str(p["root"] / "chain"),
    "a relative symlink to it": lambda p: str(p["root"] / "relative_link"),
    "a symlinked parent": lambda p: str(p["root"] / "parent_link" / "pinned"),
    "a path through its sibling and ..": lambda p: str(p["sibling"] / ".." / "pinned"),
    "a path with a trailing slash": lambda p: str(p["pinned"]) + "/",
    "a path with doubled slashes": lambda p: str(p["real"]) + "//pinned",
    "a path through ~": lambda p: "~/adapters/pinned",
    "a relative path": lambda p: os.path.join("real", "pinned"),
}
#: The pin's key: the same spellings but those that hang on the process's state only.
KEY_SPELLINGS = [s for s in SPELLINGS if s not in ("a relative path", "a path through ~")]


@pytest.fixture
def at_root(places, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Run in the places' root (for the relative path), with ``~`` its ``home``."""
    monkeypatch.chdir(places["root"])
    monkeypatch.setenv("HOME", str(places["root"] / "home"))
    return places


def _base(places: dict[str, Path], pins: dict[str, str]) -> adapters.ServedBase:
    options = split_extra_config({"adapter_identities": pins})[0]
    return adapters.ServedBase(str(places["sibling"]), None, options)


def _request(name: str, path: str, lora_id: int = 1):
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, lora_id, path)


@pytest.mark.parametrize("key", KEY_SPELLINGS)
@pytest.mark.parametrize("asked", list(SPELLINGS))
def test_every_path_to_a_pinned_folder_meets_its_pin(at_root, asked, key):
    places = at_root
    path, pin_key = SPELLINGS[asked](places), SPELLINGS[key](places)
    identity = ckptpub.read_manifest(places["pinned"]).identity
    loads: list[object] = []
    with pytest.raises(RefusedError) as refused:
        adapters.load_checked(_request("any-name", path), _base(places, {pin_key: OTHER}), loads.append)
    assert loads == [], "vLLM must read nothing of a refused adapter"
    assert str(refused.value) == (
        f"ckptpub: refusing to serve adapter {places['pinned']}: its identity {identity} is not the "
        f"expected {OTHER}"
    )
    # The right pin, by the same key, serves it (its manifest, read from the folder itself).
    base = _base(places, {pin_key: identity})
    assert adapters.check_adapter(adapters.adapter_folder(path), "any-name", base).identity == identity


@pytest.mark.parametrize("asked", list(SPELLINGS))
def test_two_pins_of_one_folder_by_two_paths_are_two_pins(at_root, asked):
    """Pinned by one path and by another to two identities: refused, by whichever path it is asked."""
    places = at_root
    pins = {str(places["pinned"]): OTHER, str(places["root"] / "link"): "blake3:" + "8" * 64}
    with pytest.raises(RefusedError, match="it is pinned to two identities"):
        adapters.load_checked(_request("n", SPELLINGS[asked](places)), _base(places, pins), list.append)


def test_a_pin_on_another_folder_is_not_this_ones(at_root):
    """The sibling's pin does not reach ``pinned`` through ``..``: the resolved folders differ."""
    places = at_root
    base = _base(places, {str(places["sibling"]): OTHER})
    manifest = adapters.check_adapter(str(places["pinned"]), "n", base)
    assert manifest is not None


# -- a LoRA id the worker holds ---------------------------------------------------------------


def _held(
    places: dict[str, Path], name: str = "held", identity: str | None = "pinned"
) -> adapters.ServedAdapter:
    if identity == "pinned":
        identity = ckptpub.read_manifest(places["pinned"]).identity
    path = str(places["pinned"])
    return adapters.ServedAdapter(1, name, path, path, identity, None)


HELD_CASES: dict[str, tuple[Callable[[dict[str, Path]], tuple[str, str]], dict, str]] = {
    # case: (the request's name and path, the pins, "" when answered by the held adapter or the refusal)
    "the same name and path": (lambda p: ("held", str(p["pinned"])), {}, ""),
    "the same name, the folder through a symlink": (lambda p: ("held", str(p["root"] / "link")), {}, ""),
    "the same name, the folder through a symlinked parent": (
        lambda p: ("held", str(p["root"] / "parent_link" / "pinned")),
        {},
        "",
    ),
    "another name, the same folder, no pin": (lambda p: ("other", str(p["pinned"])), {}, ""),
    "the same name, another folder": (
        lambda p: ("held", str(p["sibling"])),
        {},
        "LoRA id 1 already holds adapter 'held' from",
    ),
    "another name, another folder through a symlink to it": (
        lambda p: ("other", str(p["parent_link_sibling"])),
        {},
        "LoRA id 1 already holds adapter 'held' from",
    ),
    "another name pinned to another identity": (
        lambda p: ("other", str(p["pinned"])),
        {"other": OTHER},
        f"not the expected {OTHER}",
    ),
    "another name, its folder pinned by a symlink to another identity": (
        lambda p: ("other", str(p["pinned"])),
        {"link": OTHER},
        f"not the expected {OTHER}",
    ),
}


@pytest.mark.parametrize("case", list(HELD_CASES))
def test_a_held_lora_id_answers_only_for_its_own_folder_and_pins(at_root, case):
    places = dict(at_root, parent_link_sibling=at_root["root"] / "parent_link" / "sibling")
    asked, pins, refusal = HELD_CASES[case]
    name, path = asked(places)
    pins = {str(places["root"] / key) if key == "link" else key: pin for key, pin in pins.items()}
    request, base = _request(name, path), _base(places, pins)
    if not refusal:
        adapters.check_held(_held(places), request, base)
        return
    with pytest.raises(RefusedError) as refused:
        adapters.check_held(_held(places), request, base)
    assert str(refused.value).startswith("ckptpub: refusing to serve adapter "), refused.value
    assert refusal in str(refused.value)


def test_a_held_lora_id_ckptpub_did_not_load_answers_nothing(at_root):
    with pytest.raises(RefusedError, match="already holds an adapter ckptpub did not load"):
        adapters.check_held(None, _request("held", str(at_root["pinned"])), _base(at_root, {}))


def test_a_pin_cannot_be_met_by_a_held_adapter_served_without_a_manifest(at_root):
    held = _held(at_root, identity=None)
    with pytest.raises(RefusedError, match="holds it with identity unknown"):
        adapters.check_held(held, _request("other", str(at_root["pinned"])), _base(at_root, {"other": OTHER}))
