"""Fine-tunes of models in the Hugging Face cache record their base without a step by hand.

Real Trainer runs (``hub_train.py``, one subprocess for every run here) load the base
with ``from_pretrained(hub id)`` from a cache built offline, with ``HF_HOME`` and
``HF_HUB_OFFLINE=1``; the manifests and the CLI's views are read afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import run_cli
from support.hf_cache import cache_model, cache_state
from support.runs import checkpoints

import ckptpub

pytestmark = pytest.mark.slow  # Trainer runs in a subprocess

HERE = Path(__file__).parent
PUBLISHED, CONSENTING, UNPUBLISHED = "acme/published", "acme/consenting", "acme/unpublished"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    from support import tiny_model

    root = tmp_path_factory.mktemp("hub-runs")
    source = root / "download"
    tiny_model.build_model().save_pretrained(source)
    tiny_model.build_tokenizer().save_pretrained(source)
    home = root / "hf"
    snapshots = {repo: cache_model(home, repo, source) for repo in (PUBLISHED, CONSENTING, UNPUBLISHED)}
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    published = run_cli("publish", PUBLISHED, env=env)
    assert published.returncode == 0, published.stderr
    before = cache_state(home)
    jobs = {
        "by_id": {"model": PUBLISHED, "options": {}},
        "by_snapshot": {"model": snapshots[PUBLISHED], "options": {}},
        "consent": {"model": CONSENTING, "options": {"publish_base": True}},
        "no_consent": {"model": UNPUBLISHED, "options": {}},
        "named": {"model": None, "options": {"base": f"{PUBLISHED}@main", "background": False}},
    }
    for name, job in jobs.items():
        job["out"] = str(root / name)
    proc = subprocess.run(
        [sys.executable, str(HERE / "hub_train.py"), json.dumps(list(jobs.values()))],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CKPTPUB_RESULT ")]
    results = [json.loads(line.split(" ", 1)[1]) for line in lines]
    assert len(results) == len(jobs), proc.stderr[-4000:]
    return {
        "home": home,
        "env": env,
        "before": before,
        "snapshots": snapshots,
        "results": dict(zip(jobs, results, strict=True)),
        "out": {name: Path(job["out"]) for name, job in jobs.items()},
    }


def steps_provenance(run_dir: Path) -> list[dict]:
    names = checkpoints(run_dir)
    assert names == ["checkpoint-5", "checkpoint-10"]
    return [ckptpub.read_manifest(run_dir / name).provenance for name in names]


def cli(runs: dict, *args: str) -> str:
    """The CLI's output, run where ``HF_HOME`` is the tests' cache."""
    return run_cli(*args, env=runs["env"]).stdout


@pytest.mark.parametrize("job", ["by_id", "by_snapshot", "named"])
def test_every_step_records_the_published_base(runs, job) -> None:
    result = runs["results"][job]
    assert result["warnings"] == []
    base = runs["snapshots"][PUBLISHED]
    identity = ckptpub.read_manifest(base).identity
    for provenance in steps_provenance(runs["out"][job]):
        assert provenance["base_identity"] == identity
        assert provenance["base_hub"] == {"repo_id": PUBLISHED, "revision": Path(base).name}


def test_with_consent_the_base_is_published_in_the_background_once(runs) -> None:
    result = runs["results"]["consent"]
    assert result["warnings"] == []
    assert result["base_published_on"] == "ckptpub-publisher"  # never on the training thread
    base = runs["snapshots"][CONSENTING]
    manifest = ckptpub.read_manifest(base)
    assert manifest.provenance["hub"] == {"repo_id": CONSENTING, "revision": Path(base).name}
    for provenance in steps_provenance(runs["out"]["consent"]):
        assert provenance["base_identity"] == manifest.identity
        assert provenance["base_hub"] == {"repo_id": CONSENTING, "revision": Path(base).name}
    assert cache_state(runs["home"]) == runs["before"]  # blobs and links as they were


def test_without_consent_one_warning_says_how_to_record_the_base(runs) -> None:
    result = runs["results"]["no_consent"]
    base = runs["snapshots"][UNPUBLISHED]
    assert result["warnings"] == [
        f"ckptpub: the base model {UNPUBLISHED} (revision {Path(base).name}, {base}) has no ckptpub.json, "
        "so this run's checkpoints will record no base_identity; publish it before training: "
        f"ckptpub publish {UNPUBLISHED} --revision {Path(base).name}, or pass "
        "PublishCallback(publish_base=True) to publish it in the background"
    ]
    assert not os.path.lexists(os.path.join(base, "ckptpub.json"))
    for provenance in steps_provenance(runs["out"]["no_consent"]):
        assert provenance["base_identity"] is None
        assert "base_hub" not in provenance


def test_show_and_log_name_the_base_by_hub_id_and_commit(runs) -> None:
    base = runs["snapshots"][PUBLISHED]
    identity, commit = ckptpub.read_manifest(base).identity, Path(base).name
    run_dir = runs["out"]["by_id"]
    shown = cli(runs, "show", str(run_dir / "checkpoint-10"))
    assert f"kind:          model on base {identity} ({PUBLISHED}@{commit})" in shown
    log = cli(runs, "log", str(run_dir)).splitlines()
    assert log[0] == f"base {identity[:19]} {PUBLISHED}@{commit[:12]} (not in this run)"
    diff = cli(runs, "diff", PUBLISHED, str(run_dir / "checkpoint-5"))
    assert f"lineage  b records a ({PUBLISHED}@{commit[:12]}) as its base" in diff
