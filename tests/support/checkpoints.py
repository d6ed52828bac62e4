"""Build small, real checkpoint folders on disk for the tests.

Shards are written by the real ``safetensors`` library (numpy backend) and configs
are real JSON files, so the tests exercise ckptpub on the bytes users' tools write.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from support.safetensors_files import tensor_location

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "vocab_size": 128,
}


def model_tensors(seed: int = 0, layers: int = 2) -> dict[str, np.ndarray]:
    """A deterministic set of tensors shaped like a tiny decoder (several dtypes)."""
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((128, 64), dtype=np.float32)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        tensors[prefix + "self_attn.q_proj.weight"] = rng.standard_normal((64, 64), dtype=np.float32)
        tensors[prefix + "mlp.up_proj.weight"] = rng.standard_normal((96, 64)).astype(np.float16)
        tensors[prefix + "input_layernorm.weight"] = np.ones(64, dtype=np.float32)
        tensors[prefix + "step_count"] = np.array([layer], dtype=np.int64)
    tensors["model.norm.weight"] = np.ones(64, dtype=np.float32)
    return tensors


def write_checkpoint(
    folder: Path,
    tensors: dict[str, np.ndarray] | None = None,
    *,
    shards: int = 1,
    config: dict | None = None,
    metadata: dict[str, str] | None = None,
    extra_files: bool = True,
) -> Path:
    """Write a checkpoint folder: config, weights (one file or ``shards`` with an index), extras."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = model_tensors() if tensors is None else tensors
    (folder / "config.json").write_text(json.dumps(config or CONFIG, indent=2))
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(folder / "model.safetensors"), metadata=metadata)
    else:
        weight_map = {}
        for index in range(shards):
            shard = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            part = names[index::shards]
            save_file({n: tensors[n] for n in part}, str(folder / shard), metadata=metadata)
            weight_map.update({n: shard for n in part})
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    if extra_files:
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')
        (folder / "optimizer.pt").write_bytes(bytes(range(256)) * 16)
        (folder / "logs").mkdir(exist_ok=True)
        (folder / "logs" / "train.txt").write_text("step 1 loss 2.0\n")
    return folder


#: Manifests of the formats before ``ckptpub/3``, byte for byte as their writers wrote them (the /2 one by
#: ckptpub 0.1.0 at 45107bd, its last writer): nothing reads them now; each is refused in one line.
RETIRED = Path(__file__).parents[1] / "vectors" / "retired"


def with_retired_manifest(folder: Path, version: str) -> Path:
    """``folder`` with its ``ckptpub.json`` replaced by a manifest in ``version`` (``ckptpub/1`` or ``/2``),
    as a folder published before ``ckptpub/3`` settled has it."""
    (folder / "ckptpub.json").write_bytes((RETIRED / f"{version.replace('/', '-')}.json").read_bytes())
    return folder


def raw_shard(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A safetensors file of ``name -> (dtype, shape, raw bytes)``, in that order, written by hand."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


#: The folder of the whole-manifest vector (tests/vectors/manifest-v3.json).
VECTOR_FILES = {
    "config.json": b'{"model_type": "tiny", "hidden_size": 4}',
    "model.safetensors": raw_shard(
        {"w": ("F32", [2], bytes(range(8))), "b": ("BF16", [], b"\x80?"), "emb": ("U8", [1, 3], b"abc")}
    ),
    "extra/opt.safetensors": raw_shard({"m": ("F16", [2], b"\x00<\x00<")}),
    "notes.txt": b"trained on tiny data\n",
}


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder


def sparse_shard(path: Path, tensors: int, tensor_bytes: int) -> None:
    """A valid safetensors file of ``tensors`` U8 tensors whose data is a hole (reads as zeros):
    large to hash, free to write."""
    header = {
        f"{path.stem}.t{i}": {
            "dtype": "U8",
            "shape": [tensor_bytes],
            "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes],
        }
        for i in range(tensors)
    }
    encoded = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        handle.truncate(8 + len(encoded) + tensors * tensor_bytes)


def tensor_range(shard: Path, name: str) -> tuple[int, int]:
    """Absolute byte range of ``name`` in ``shard``, read from its header (``KeyError`` if absent)."""
    return tensor_location(str(shard), name)


def locate(folder: Path, name: str) -> tuple[Path, int, int]:
    """The shard holding tensor ``name`` in ``folder`` and the tensor's absolute byte range."""
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            return (shard, *tensor_range(shard, name))
        except KeyError:
            continue
    raise KeyError(name)


def flip_byte(path: Path, offset: int) -> None:
    """Invert one byte in place (size and header untouched)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([value[0] ^ 0xFF]))


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, and the folder's own mtime: to prove nothing changed."""
    state = {".": (b"", os.stat(folder).st_mtime_ns)}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            state[str(path.relative_to(folder))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return state


#: A ckptpub/3 manifest's first line holds these fields in this order (docs/format.md).
V3_HEADER_ORDER = ("format", "identity", "sizes", "config", "weights", "files", "provenance")


def v3_parts(data: bytes) -> tuple[dict, bytes, bytes]:
    """A ckptpub/3 manifest's header fields, and its two regions' bytes, found by the sizes the first
    line gives."""
    line, _, rest = data.partition(b"\n")
    header = json.loads(line.removesuffix(b',"model":[') + b"}")
    model = rest[: header["sizes"]["model"]]
    layout = rest[len(model) + len(b'\n],"layout":[\n') :][: header["sizes"]["layout"]]
    return header, model, layout


def v3_written(header: dict, model: bytes, layout: bytes) -> bytes:
    """A ckptpub/3 manifest of these first-line fields (in the dict's order) and regions, written by
    docs/format.md's layout (not by ckptpub's encoder), nothing recomputed: as a forger's edit leaves it."""
    from ckptpub._format.canonical import canonical_json

    line = b"{" + b",".join(b'"%s":%s' % (k.encode(), canonical_json(v)) for k, v in header.items())
    return line + b',"model":[\n' + model + b'\n],"layout":[\n' + layout + b"\n]}\n"


def v3_forged(header: dict, model: bytes, layout: bytes) -> bytes:
    """A ckptpub/3 manifest with these regions, sizes and identity recomputed, written by
    docs/format.md's layout (not by ckptpub's encoder), as a careful forger would."""
    from ckptpub._format.manifest import FileRecord, identity_of
    from ckptpub._format.regions import Regions

    files = [FileRecord(f["path"], f["size"], f["digest"], f.get("header_size")) for f in header["files"]]
    counts = tuple(f["tensors"] for f in header["files"] if "header_size" in f)
    identity = identity_of(Regions(model, layout, counts), files, header["weights"], header["config"])
    header = header | {"sizes": {"model": len(model), "layout": len(layout)}, "identity": identity}
    return v3_written({k: header[k] for k in V3_HEADER_ORDER}, model, layout)


def forged_regions(data: bytes, edit: Callable[[bytes, bytes], tuple[bytes, bytes]]) -> bytes:
    """The ckptpub/3 manifest ``data`` with its two regions edited (``edit(model, layout)``) and the
    first line's sizes and identity recomputed, as a careful forger would: only the rules of the
    entries themselves can catch it."""
    header, model, layout = v3_parts(data)
    return v3_forged(header, *edit(model, layout))


def swap_first_entries(entries: bytes) -> bytes:
    """The first two entries of a ckptpub/3 region (one a line) in each other's place."""
    first, second, rest = entries.split(b"\n", 2)
    return b"\n".join((second, first, rest))


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def run_cli(
    *args: object, timeout: float = 120, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m ckptpub`` as a real subprocess and capture its output (``env`` added to ours)."""
    return subprocess.run(
        [sys.executable, "-m", "ckptpub", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


@contextlib.contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """Fail (``TimeoutError``) instead of hanging when the block runs longer than ``seconds``.

    For calls made in the test's own process (the Python API, the loader's functions),
    as a subprocess's ``timeout`` does for the CLI. Main thread only (SIGALRM).
    """

    def hang(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
