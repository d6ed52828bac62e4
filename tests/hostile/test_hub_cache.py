"""Hostile Hugging Face caches through every entry point that resolves a hub id; hub ids never wait on a hub.

Generated: every case of ``hub_cases`` x the CLI verbs that take a hub id (``show``,
``verify``, ``publish``, ``publish --base``, ``diff``) as real subprocesses under a
timeout, and x the plugin's resolutions (``ckptpub.serving.model_folder``, the weight-cache
key under ``CKPTPUB_REQUIRE_MANIFEST=1``) in one subprocess per case. A damaged ref or
snapshot is refused in one line naming it (exit 2; ``ckptpub: refusing to serve ID: ...``
from the plugin), nothing in the cache is changed and no manifest written; the valid
neighbours keep working.

Then the network: with ``HF_HUB_OFFLINE`` unset and ``HF_ENDPOINT`` a socket that accepts
and never answers, or an address that never answers a connection, every resolution of a
hub id (present or not) ends at once and the socket sees no connection: ckptpub's own
hub lookups read the cache alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.checkpoints import model_tensors, write_checkpoint
from support.hf_cache import SilentHub, cache_dir, cache_model, cache_state

import ckptpub
from tests.hostile.hub_cases import HUB_CASES, OTHER, REPO, Cache, HubCase

pytest.importorskip("huggingface_hub")

VERBS = ("show", "verify", "publish", "publish --base", "diff")
#: What a valid case's verbs end with (diff: another model, exit 1).
GOOD_EXIT = {"show": 0, "verify": 0, "publish": 0, "publish --base": 0, "diff": 1}
#: The plugin's resolutions of a hub id, in one process: each prints a JSON line.
PLUGIN_SCRIPT = """
import json, sys
from ckptpub.serving import RefusedError, model_folder
from ckptpub_vllm.shared.key import checkpoint_key
for name, call in (("model_folder", model_folder), ("key", checkpoint_key)):
    try:
        print(json.dumps({"entry": name, "result": call(sys.argv[1])}))
    except RefusedError as error:
        print(json.dumps({"entry": name, "refused": str(error)}))
"""


def build_cache(root: Path) -> tuple[Path, Cache]:
    """An ``HF_HOME`` with both models published in it, and where each lives."""
    home = root / "hf"
    snapshots = {}
    for repo, seed in ((REPO, 0), (OTHER, 3)):
        snapshot = Path(cache_model(home, repo, write_checkpoint(root / repo, model_tensors(seed=seed))))
        ckptpub.publish(snapshot)
        snapshots[repo] = snapshot
    first, other = snapshots[REPO], snapshots[OTHER]
    return home, Cache(first.parents[1], first.name, other.parents[1], other.name)


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HOME": str(home), **extra}


def run(env: dict[str, str], *args: object, timeout: float = 60) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ckptpub", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def verb_args(verb: str, name: str, plain: Path, published: Path) -> list[object]:
    return {
        "show": ["show", name],
        "verify": ["verify", name],
        "publish": ["publish", name],
        "publish --base": ["publish", plain, "--base", name],
        "diff": ["diff", name, published],
    }[verb]


def manifests(home: Path) -> dict[str, bytes]:
    """Every ckptpub.json under the cache (``cache_state`` leaves them out), with its bytes."""
    return {str(p): p.read_bytes() for p in Path(cache_dir(home)).rglob("ckptpub.json") if p.is_file()}


def test_hub_corpus_size() -> None:
    runs = len(HUB_CASES) * (len(VERBS) + 2)
    print(f"hub caches: {len(HUB_CASES)} cases x {len(VERBS) + 2} entry points = {runs} runs")
    assert len({c.name for c in HUB_CASES}) == len(HUB_CASES) >= 20


@pytest.mark.parametrize("case", HUB_CASES, ids=[c.name for c in HUB_CASES])
def test_a_damaged_ref_or_snapshot_is_refused_by_name_and_never_followed(
    tmp_path: Path, case: HubCase
) -> None:
    home, cache = build_cache(tmp_path)
    case.damage(cache)
    revision = None if case.revision is None else case.revision.format(commit=cache.commit)
    name = REPO if revision is None else f"{REPO}@{revision}"
    plain = write_checkpoint(tmp_path / "plain", model_tensors(seed=5))
    published = write_checkpoint(tmp_path / "published", model_tensors(seed=6))
    ckptpub.publish(published)
    env = environment(home, HF_HUB_OFFLINE="1")
    before, written = cache_state(home), manifests(home)
    fragment = case.message.format(
        ref=cache.repository / "refs" / "main", repository=cache.repository, commit=cache.commit
    )
    for verb in VERBS:
        result = run(env, *verb_args(verb, name, plain, published))
        if not case.message:
            assert result.returncode == GOOD_EXIT[verb], (verb, result.stderr)
            continue
        assert result.returncode == 2, (verb, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1, (verb, result.stderr)  # one line, no traceback
        assert fragment in result.stderr, (verb, fragment, result.stderr)
        assert "internal error" not in result.stderr
    assert not (plain / ckptpub.MANIFEST_NAME).exists() or not case.message
    plugin = subprocess.run(
        [sys.executable, "-c", PLUGIN_SCRIPT, name],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "CKPTPUB_REQUIRE_MANIFEST": "1"},
    )
    answers = [json.loads(line) for line in plugin.stdout.splitlines()]
    assert [a["entry"] for a in answers] == ["model_folder", "key"], plugin.stderr
    snapshot = os.path.realpath(cache.repository / "snapshots" / cache.commit)
    for answer in answers:
        if not case.message:
            expected = (
                snapshot if answer["entry"] == "model_folder" else ckptpub.read_manifest(snapshot).identity
            )
            assert answer.get("result") == expected, answer
            continue
        line = answer.get("refused", "")
        assert line.startswith(f"ckptpub: refusing to serve {name}: "), answer
        assert fragment in line, answer
        assert "\n" not in line, answer
    if case.message:
        assert (cache_state(home), manifests(home)) == (before, written)  # nothing changed, nothing written


@pytest.fixture
def silent_hub() -> Iterator[SilentHub]:
    hub = SilentHub()
    yield hub
    hub.close()


@pytest.mark.parametrize("endpoint", ["a socket that never answers", "an address that never answers"])
def test_hub_ids_resolve_from_the_cache_without_asking_a_hub(
    tmp_path: Path, silent_hub: SilentHub, endpoint: str
) -> None:
    """``HF_HUB_OFFLINE`` unset: ckptpub still asks no hub, so nothing waits on one that does not answer."""
    home, cache = build_cache(tmp_path)
    url = silent_hub.url if endpoint.startswith("a socket") else "http://10.255.255.1"
    env = environment(home, HF_ENDPOINT=url)
    identity = ckptpub.read_manifest(cache.repository / "snapshots" / cache.commit).identity
    started = time.monotonic()
    for args, code, words in [
        (["show", REPO], 0, identity),
        (["verify", REPO], 0, identity),
        (["publish", REPO], 0, identity),
        (["show", "acme/absent"], 2, "`hf download acme/absent` downloads it"),
    ]:
        result = run(env, *args, timeout=30)
        assert result.returncode == code, (args, result.stderr)
        assert words in result.stdout + result.stderr, (args, result.stdout, result.stderr)
    plugin = subprocess.run(
        [sys.executable, "-c", PLUGIN_SCRIPT, "acme/absent"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "CKPTPUB_REQUIRE_MANIFEST": "1"},
    )
    for line in plugin.stdout.splitlines():
        refused = json.loads(line)["refused"]
        assert (
            "download it with `hf download acme/absent`, then publish it with `ckptpub publish acme/absent`"
            in (refused)
        )
    assert time.monotonic() - started < 30  # five processes; a lookup would have waited for its timeout
    assert silent_hub.connections == []
    shutil.rmtree(home)
