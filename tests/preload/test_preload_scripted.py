"""A scripted training run of 24 publish events followed by a real supervisor process.

Each event is published with ``ckptpub.publish`` on checkpoints written by the real
``safetensors`` library, and recorded in the run index as the Trainer callback does.
The supervisor (``ckptpub preload --follow RUN``, daemon command = the stand-in)
must re-preload exactly when the newest step's identity differs from the held one:
the test counts the stand-in daemons that actually started (from the stand-in's own
record) and checks the decision log's ``why`` for every event.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil

from support.checkpoints import CONFIG, model_tensors, write_checkpoint
from support.preload_helpers import Run, SupervisorProc, make_checkpoint, ready_with, wait_for

import ckptpub

REPLACE_WHYS = {"weights-changed", "config-changed", "weights-and-config"}


class Script:
    """Performs events on a run folder and says what the supervisor must do about each."""

    def __init__(self, root):
        self.run = Run(root)
        self.root = root
        self.step = 0
        self.current: str | None = None  # rel path of the newest step
        self.held: str | None = None  # identity a correct supervisor holds after the event
        self.expected: list[tuple[str, str, bool, str]] = []  # (kind, why, preload?, identity)

    def _folder(self, step):
        return f"checkpoint-{step}"

    def _record(self, kind, rel, identity, whys):
        self.run.append(self.step, rel, identity)
        self.current = rel
        preload = identity != self.held
        self.expected.append((kind, whys, preload, identity))
        if preload:
            self.held = identity
        return identity

    def _next(self, step_delta=10):
        self.step += step_delta
        return self._folder(self.step)

    # -- event kinds ------------------------------------------------------

    def new_weights(self, seed):
        config = (
            json.loads((self.root / self.current / "config.json").read_text()) if self.current else CONFIG
        )
        rel = self._next()
        identity = make_checkpoint(self.root / rel, seed=seed, config=config, provenance={"step": self.step})
        whys = "first-preload" if self.held is None else "weights-changed"
        return self._record("new-weights", rel, identity, whys)

    def republish(self):
        """``ckptpub publish`` again on the newest folder (same bytes): the manifest is rewritten."""
        rel = self.current
        identity = ckptpub.publish(self.root / rel).identity
        return self._record("republish", rel, identity, "same-identity-republished")

    def copy_new_path(self, with_manifest=True):
        """The newest checkpoint copied to the next step's folder (e.g. a step where nothing was learned)."""
        src, rel = self.root / self.current, self._next()
        shutil.copytree(src, self.root / rel)
        if not with_manifest:
            os.remove(self.root / rel / ckptpub.MANIFEST_NAME)
        identity = ckptpub.publish(self.root / rel).identity
        return self._record("copy-new-path", rel, identity, "same-identity-new-path")

    def config_change(self, **changes):
        src, rel = self.root / self.current, self._next()
        shutil.copytree(src, self.root / rel)
        config = json.loads((self.root / rel / "config.json").read_text())
        config.update(changes)
        (self.root / rel / "config.json").write_text(json.dumps(config, indent=2))
        identity = ckptpub.publish(self.root / rel).identity
        return self._record("config-only", rel, identity, "config-changed")

    def config_reformat(self):
        """Same config meaning, other formatting and key order: same identity."""
        src, rel = self.root / self.current, self._next()
        shutil.copytree(src, self.root / rel)
        config = json.loads((self.root / rel / "config.json").read_text())
        text = json.dumps(dict(sorted(config.items(), reverse=True)), indent=7) + "\n\n"
        (self.root / rel / "config.json").write_text(text)
        identity = ckptpub.publish(self.root / rel).identity
        return self._record("config-reformat", rel, identity, "same-identity-new-path")

    def reshard(self, seed):
        """Same tensors in two shards with an index and safetensors metadata: same identity as one shard."""
        rel = self._next()
        config = json.loads((self.root / self.current / "config.json").read_text())
        write_checkpoint(
            self.root / rel,
            model_tensors(seed=seed, layers=1),
            shards=2,
            config=config,
            metadata={"format": "pt", "note": "resharded"},
            extra_files=False,
        )
        identity = ckptpub.publish(self.root / rel).identity
        return self._record("reshard-new-path", rel, identity, "same-identity-new-path")

    def rotate_away_oldest(self, keep=3):
        """``save_total_limit``: old folders go; the newest is untouched (no event for the supervisor)."""
        steps = sorted(int(p.name.split("-")[1]) for p in self.root.glob("checkpoint-*"))
        for step in steps[:-keep]:
            shutil.rmtree(self.root / self._folder(step))


def _decision_for(sup, folder, stamp, after):
    """The first decision logged at index >= ``after`` for this observation (folder + manifest stamp)."""

    def find():
        entries = sup.decisions()
        for index in range(after, len(entries)):
            e = entries[index]
            t = e.get("target") or {}
            if e.get("event") == "decision" and t.get("folder") == folder and t.get("stamp") == stamp:
                return index, e
        return None

    return find


def test_scripted_run_zero_unnecessary_zero_missed(tmp_path):
    run_dir = tmp_path / "run"
    script = Script(run_dir)
    script.new_weights(seed=1)  # the supervisor starts with something to serve
    sup = SupervisorProc(tmp_path, ["--follow", str(run_dir)]).start()
    events = [
        lambda: None,  # event 1 (the initial publish above) is checked like the others
        script.republish,
        lambda: script.copy_new_path(with_manifest=True),
        lambda: script.new_weights(seed=2),
        script.republish,
        lambda: script.config_change(rope_theta=500000.0),
        lambda: script.copy_new_path(with_manifest=False),
        script.config_reformat,
        lambda: script.new_weights(seed=3),
        lambda: script.reshard(seed=3),
        script.republish,
        lambda: script.new_weights(seed=4),
        lambda: script.config_change(rms_norm_eps=1e-5),
        lambda: script.rotate_away_oldest(keep=2) or script.republish(),
        lambda: script.copy_new_path(with_manifest=True),
        lambda: script.new_weights(seed=1),  # back to step 10's weights: still differs from what is held
        lambda: script.config_change(rms_norm_eps=1e-4),  # config only, on top of the seed-1 weights
        lambda: script.copy_new_path(with_manifest=False),
        script.republish,
        lambda: script.new_weights(seed=5),
        lambda: script.reshard(seed=5),
        lambda: script.config_change(vocab_size=128, hidden_size=64),  # same values: identity unchanged
        lambda: script.config_change(rope_theta=250000.0),
        script.republish,
    ]
    try:
        cursor = 0
        outcomes = []
        for number, event in enumerate(events, start=1):
            event()
            kind, why, preload, identity = script.expected[number - 1]
            folder = os.path.realpath(run_dir / script.current)
            manifest = os.stat(os.path.join(folder, ckptpub.MANIFEST_NAME))
            stamp = [manifest.st_ino, manifest.st_mtime_ns, manifest.st_size]
            index, entry = wait_for(
                _decision_for(sup, folder, stamp, cursor), 30, f"decision for event {number}", sup
            )
            cursor = index + 1
            wait_for(ready_with(sup, script.held), 30, f"ready after event {number}", sup)
            outcomes.append((number, kind, entry))
        assert sup.terminate() == 0
    finally:
        sup.cleanup()

    assert len(events) >= 20
    # 1. Every event got the decision it deserved, with its reason.
    wrong = []
    for (number, kind, entry), (_, expected_why, preload, identity) in zip(
        outcomes, script.expected, strict=True
    ):
        expected_action = ("start" if expected_why == "first-preload" else "replace") if preload else "keep"
        # "config_change" with unchanged values is not an identity change: keep, same identity at a new path
        if kind == "config-only" and not preload:
            expected_why = "same-identity-new-path"
        if (entry["action"], entry["why"]) != (expected_action, expected_why) or entry["target"][
            "identity"
        ] != identity:
            wrong.append(
                (number, kind, expected_action, expected_why, entry["action"], entry["why"], entry["reason"])
            )
        assert entry["reason"], entry
    assert not wrong, "\n".join(map(str, wrong))

    # 2. Daemons that actually started (the stand-in's own record): exactly the identity changes, in order.
    starts = [r for r in sup.standin() if r["event"] == "start"]
    expected_preloads = [identity for (_, _, preload, identity) in script.expected if preload]
    assert [r["identity"] for r in starts] == expected_preloads
    unnecessary = sum(1 for a, b in itertools.pairwise(starts) if a["identity"] == b["identity"])
    assert unnecessary == 0
    # every event whose identity differs from the previously held one caused a start (zero missed)
    assert len(starts) == sum(1 for e in script.expected if e[2])

    # 3. The numbers, for the report.
    preload_decisions = [o for o in outcomes if o[2]["action"] in ("start", "replace")]
    keeps = [o for o in outcomes if o[2]["action"] == "keep"]
    kinds = {}
    for _, kind, entry in outcomes:
        kinds.setdefault(kind, []).append(entry["action"])
    print(
        f"\nscripted run: {len(events)} events, {len(preload_decisions)} preloads "
        f"({len(starts)} daemons started), {len(keeps)} keeps; by kind: "
        + ", ".join(
            f"{k} {len(v)} (" + ", ".join(f"{a} {v.count(a)}" for a in sorted(set(v))) + ")"
            for k, v in sorted(kinds.items())
        )
    )
    assert (len(preload_decisions), len(keeps)) == (10, 14)  # the script's own arithmetic, pinned
    # every old daemon was stopped once its successor was confirmed, and the last one by SIGTERM
    stops = [r for r in sup.standin() if r["event"] == "stop"]
    assert len(stops) == len(starts)
    assert all(s["during"] == "serve" for s in stops)
