"""Does an SGLang release still have every name the ckptpub SGLang plugin touches?

    python check_sglang_api.py SOURCE [--plugin DIR]

SOURCE is a directory holding the ``sglang/`` package (a ``site-packages``; ``make
compat-sglang`` passes .venv-sglang's, the release pinned in requirements/sglang.txt). It is
read with :mod:`ast`: nothing is imported, so it runs anywhere in seconds.

What is checked is found by reading the plugin's own source (``ckptpub_sglang/**``), so a
new use of an SGLang name is checked without editing this file:

* ``target``: every string constant naming an SGLang object (the hook registry's targets,
  ``"sglang.srt.weight_cache.protocol.CacheConfig"``, ...) names a module, then a class or
  function in it, then a method or attribute of that class;
* ``import``: every ``from sglang.X import N`` names a module ``X`` with a top-level ``N``
  (or a submodule ``X.N``);

plus the facts the plugin relies on that are not names (``fact`` rows): the key's fields
the plugin rewrites (``model_path``, ``revision``) and its ``from_dict`` being ``cls(**d)``,
the daemon's ``model_path`` and ``revision`` attributes, the signatures the hooks forward,
and the entry-point group ``sglang.srt.plugins``.

Exit code: 0 when every check passes, 1 when one fails, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "src" / "ckptpub_sglang"


def module_file(source: Path, dotted: str) -> Path | None:
    path = source.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module's or a class's body defines (functions, classes, assignments, annotations)."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
    return names


def resolve(source: Path, dotted: str) -> ast.stmt | Path | None:
    """The definition ``dotted`` names in the release (a module's path for a module), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(source, ".".join(parts[:cut]))
        if path is None:
            continue
        node: ast.stmt | Path = path
        body = ast.parse(path.read_text(), str(path)).body
        for name in parts[cut:]:
            found = defined(body).get(name)
            if found is None:
                return None
            node = found
            body = found.body if isinstance(found, ast.ClassDef) else []
        return node
    return None


def plugin_names(plugin: Path) -> tuple[set[str], set[str]]:
    """The dotted SGLang names in the plugin's string constants, and those it imports or reads as
    ``from sglang.X import N`` then ``N.attr`` (checked when ``N`` is a module or a class)."""
    targets, imports = set(), set()
    for path in sorted(plugin.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("sglang.") and " " not in node.value and node.value.count(".") > 2:
                    targets.add(node.value)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
                imports.update(f"{node.module}.{alias.name}" for alias in node.names)
                aliases.update(
                    {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                imports.add(f"{aliases[node.value.id]}.{node.attr}")
    return targets, imports


def parameters(node: ast.stmt | Path | None) -> list[str]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    arguments = node.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def facts(source: Path) -> list[tuple[str, bool]]:
    weight_cache = "sglang.srt.weight_cache."
    key = resolve(source, weight_cache + "protocol.CacheConfig")
    fields = set(defined(key.body)) if isinstance(key, ast.ClassDef) else set()
    from_dict = resolve(source, weight_cache + "protocol.CacheConfig.from_dict")
    init = resolve(source, weight_cache + "daemon.WeightCacheDaemon.__init__")
    init_text = ast.unparse(init) if isinstance(init, ast.FunctionDef) else ""
    plugins = module_file(source, "sglang.srt.plugins")
    return [
        ("the key has model_path and revision", {"model_path", "revision"} <= fields),
        (
            "the key's from_dict is cls(**d)",
            isinstance(from_dict, ast.FunctionDef) and "cls(**" in ast.unparse(from_dict),
        ),
        (
            "the daemon sets self.model_path and self.revision",
            "self.model_path" in init_text and "self.revision" in init_text,
        ),
        (
            "spawn_weight_cache_daemon(server_args, *, gpu_id, tp_rank, pp_rank, dist_init_method)",
            parameters(resolve(source, weight_cache + "daemon.spawn_weight_cache_daemon"))
            == ["server_args", "gpu_id", "tp_rank", "pp_rank", "dist_init_method"],
        ),
        (
            "run_weight_cache_daemon(server_args, gpu_id, tp_rank, pp_rank, dist_init_method)",
            parameters(resolve(source, weight_cache + "daemon.run_weight_cache_daemon"))
            == ["server_args", "gpu_id", "tp_rank", "pp_rank", "dist_init_method"],
        ),
        (
            "IpcModelLoader.load_model(self, *, model_config, device_config)",
            parameters(resolve(source, weight_cache + "ipc_loader.IpcModelLoader.load_model"))
            == ["self", "model_config", "device_config"],
        ),
        (
            "IpcModelLoader._fetch_from_cache(self, model_config, device_config)",
            parameters(resolve(source, weight_cache + "ipc_loader.IpcModelLoader._fetch_from_cache"))
            == ["self", "model_config", "device_config"],
        ),
        (
            "plugins load from the entry-point group sglang.srt.plugins",
            plugins is not None and '"sglang.srt.plugins"' in plugins.read_text(),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a directory holding the sglang/ package")
    parser.add_argument("--plugin", type=Path, default=PLUGIN, help="the plugin's package directory")
    arguments = parser.parse_args(argv)
    if module_file(arguments.source, "sglang") is None or not arguments.plugin.is_dir():
        print(f"check_sglang_api: no sglang/ package in {arguments.source}", file=sys.stderr)
        return 2
    targets, imports = plugin_names(arguments.plugin)
    rows = [(f"target {name}", resolve(arguments.source, name) is not None) for name in sorted(targets)]
    for name in sorted(imports):
        base = resolve(arguments.source, name.rpartition(".")[0])
        if (
            name in imports
            and name.rpartition(".")[0] in imports
            and not isinstance(base, (Path, ast.ClassDef))
        ):
            continue  # an attribute of an object (``current_platform.get_device_uuid``): not statically known
        rows.append((f"import {name}", resolve(arguments.source, name) is not None))
    rows += [(f"fact {what}", ok) for what, ok in facts(arguments.source)]
    for what, ok in rows:
        print(f"{what}: {'OK' if ok else 'MISSING'}")
    failed = sum(not ok for _, ok in rows)
    print(f"{len(rows) - failed} of {len(rows)} checks passed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
