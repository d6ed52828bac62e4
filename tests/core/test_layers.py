"""The layers of the core and of the vLLM plugin, read from their source: no import cycle, and no
import going up a layer.

Every ``import`` and ``from ... import`` of ``src/ckptpub`` (or of the plugin) counts, wherever it
is: at the top of a module, inside a function (a deferred import) or under ``TYPE_CHECKING``.
A cycle held open by a deferred or type-only import is still a cycle for a reader: each
of those modules can be understood only together with the others.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "ckptpub"
PLUGIN = SOURCE.parents[1] / "integrations" / "vllm" / "src" / "ckptpub_vllm"
SGLANG_PLUGIN = SOURCE.parents[1] / "integrations" / "sglang" / "src" / "ckptpub_sglang"

#: Lowest first. A module may import its own layer (no cycle) and the layers listed before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ckptpub.errors", "ckptpub._version", "ckptpub._settings"),
    ("ckptpub._format",),
    ("ckptpub._filesystem",),
    ("ckptpub._hashing",),
    ("ckptpub._operations",),
    ("ckptpub._serving",),
    ("ckptpub._torch",),  # the serving checks' torch side: imports torch
    ("ckptpub._runs",),
    ("ckptpub._training",),
    ("ckptpub._cli",),
    (  # the public modules: what users and integrations import
        "ckptpub",
        "ckptpub.__main__",
        "ckptpub.cli",
        "ckptpub.console",
        "ckptpub.distributed",
        "ckptpub.integration",
        "ckptpub.serving",
        "ckptpub.serving_torch",
        "ckptpub.signing",
    ),
)

#: The plugin's layers, by the process their code runs in, lowest first (docs/design.md). A
#: package's name stands for its modules too; the root, ``ckptpub_vllm`` (``register``), for itself.
PLUGIN_LAYERS: tuple[tuple[str, ...], ...] = (
    ("ckptpub_vllm.shared",),  # every process
    ("ckptpub_vllm.worker",),  # engine workers (and a daemon's load)
    ("ckptpub_vllm.engine_core",),
    ("ckptpub_vllm.frontend",),  # the process that starts an engine
    ("ckptpub_vllm.daemon",),  # vllm preload's CLI and its daemon children
    ("ckptpub_vllm.preload",),  # the supervisor: imports the shared layer only (see below)
    ("ckptpub_vllm",),  # the entry point
)

#: The SGLang plugin's modules, lowest first (the same rules): what imports neither SGLang nor torch, the
#: key and the disk loader, the engine's and the daemons' hooks, the entry point.
SGLANG_LAYERS: tuple[tuple[str, ...], ...] = (
    ("ckptpub_sglang.log", "ckptpub_sglang.decision"),
    ("ckptpub_sglang.key", "ckptpub_sglang.loader"),
    ("ckptpub_sglang.engine", "ckptpub_sglang.daemon"),
    ("ckptpub_sglang",),
)


def module_names(source: Path = SOURCE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` is the package)."""
    names = {}
    for path in sorted(source.rglob("*.py")):
        parts = path.relative_to(source.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``name`` imports anywhere in its source (functions, TYPE_CHECKING too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # ``from PKG import NAME`` imports the module PKG.NAME when there is one, else PKG.
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import a.b.c`` of a package's module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(source: Path = SOURCE) -> dict[str, set[str]]:
    modules = module_names(source)
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int:
    """The index in ``layers`` of the layer ``module`` belongs to (the longest prefix named there).

    A package's root (``ckptpub``, ``ckptpub_vllm``) names itself only, so that a new module is
    placed on purpose, not by falling under the root.
    """
    best, index = "", -1
    for number, names in enumerate(layers):
        for prefix in names:
            below = "." in prefix and module.startswith(prefix + ".")
            if (module == prefix or below) and len(prefix) > len(best):
                best, index = prefix, number
    return index


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None: a depth-first walk that keeps its own stack."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        pending = [iter([start])]
        while pending:
            target = next(pending[-1], None)
            if target is None:
                pending.pop()
                if path:
                    done.add(path.pop())
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target not in done:
                path.append(target)
                pending.append(iter(sorted(graph[target])))
    return None


def test_the_graph_is_read_from_the_source() -> None:
    """The reading itself: known imports are found, deferred and type-only ones included."""
    graph = import_graph()
    assert "ckptpub._format.names" in graph["ckptpub._filesystem.scan"]
    assert "ckptpub._operations.signing" in graph["ckptpub._operations.publishing"]  # deferred
    assert "ckptpub._hashing.distributed" in graph["ckptpub._operations.publishing"]  # TYPE_CHECKING
    assert "ckptpub._training.callback" in graph["ckptpub"]  # PEP 562 __getattr__ and TYPE_CHECKING
    assert "ckptpub.errors" in graph["ckptpub._format.strict_json"]  # from .. import through a package
    assert "ckptpub._hashing.ranks" in graph["ckptpub._hashing.distributed"]  # rank rules below the hasher


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_would_be_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted(name for name in import_graph() if layer_of(name) < 0)
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"


def test_imports_go_downwards_only() -> None:
    assert not upward_imports(import_graph(), LAYERS)


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each import of ``graph`` that goes up ``layers``, in words."""
    return sorted(
        f"{module} (layer {layer_of(module, layers)}) imports {target} (layer {layer_of(target, layers)})"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target, layers) > layer_of(module, layers)
    )


def test_the_plugin_graph_is_read_from_the_source() -> None:
    graph = import_graph(PLUGIN)
    assert "ckptpub_vllm.shared.startup" in graph["ckptpub_vllm.daemon"]
    assert "ckptpub_vllm.worker.loader" in graph["ckptpub_vllm"]  # deferred, inside register()
    assert "ckptpub_vllm.shared.daemon_reports" in graph["ckptpub_vllm.preload.daemon_process"]
    assert "ckptpub_vllm.preload.supervisor" in graph["ckptpub_vllm.preload.cli"]  # deferred


def test_the_plugin_has_no_import_cycle() -> None:
    """Over the whole plugin, ``preload`` included: every package of it is free of cycles."""
    cycle = find_cycle(import_graph(PLUGIN))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_plugin_module_belongs_to_a_layer() -> None:
    unplaced = sorted(name for name in import_graph(PLUGIN) if layer_of(name, PLUGIN_LAYERS) < 0)
    assert not unplaced, f"add these modules to a layer in PLUGIN_LAYERS: {unplaced}"


def test_the_plugin_imports_go_downwards_only() -> None:
    assert not upward_imports(import_graph(PLUGIN), PLUGIN_LAYERS)


def test_the_preload_supervisor_imports_only_the_shared_layer() -> None:
    """``ckptpub preload`` runs beside vLLM, not in it: of the plugin, it imports ``shared`` only."""
    allowed = ("ckptpub_vllm.shared", "ckptpub_vllm.preload")
    reaching = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph(PLUGIN).items()
        if module.startswith("ckptpub_vllm.preload")
        for target in targets
        if not target.startswith(allowed)
    )
    assert not reaching, reaching


def test_the_shared_layer_and_the_supervisor_import_no_vllm_and_no_torch() -> None:
    """Importing them (as ``ckptpub preload`` and its CLI do) loads neither vLLM nor torch."""
    modules = sorted(
        name
        for name in module_names(PLUGIN)
        if name.startswith(("ckptpub_vllm.shared", "ckptpub_vllm.preload")) or name == "ckptpub_vllm"
    )
    program = (
        f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
        "print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_sglang_plugin_has_no_cycle_and_its_imports_go_downwards_only() -> None:
    graph = import_graph(SGLANG_PLUGIN)
    assert "ckptpub_sglang.decision" in graph["ckptpub_sglang.key"]
    assert "ckptpub_sglang.daemon" in graph["ckptpub_sglang"]  # deferred, inside register()
    assert find_cycle(graph) is None
    unplaced = sorted(name for name in graph if layer_of(name, SGLANG_LAYERS) < 0)
    assert not unplaced, f"add these modules to a layer in SGLANG_LAYERS: {unplaced}"
    assert not upward_imports(graph, SGLANG_LAYERS)


def test_the_sglang_plugin_imports_no_sglang_and_no_torch_until_it_registers() -> None:
    """Importing the package and its lowest layer (as a tool that only reads the decision would) is cheap."""
    names = [name for name in module_names(SGLANG_PLUGIN) if layer_of(name, SGLANG_LAYERS) in (0, 3)]
    program = f"import sys; sys.path.insert(0, {str(SGLANG_PLUGIN.parent)!r}); import {', '.join(names)}; "
    program += "print(sorted({'torch', 'sglang'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_import_ckptpub_needs_only_the_standard_library_and_blake3() -> None:
    program = (
        "import sys; before = set(sys.modules); import ckptpub, ckptpub.cli; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['blake3', 'ckptpub']"


def test_integrations_use_only_public_modules_and_the_core_imports_none() -> None:
    """The plugins import ckptpub's public modules only (``ckptpub.integration`` and the like), and
    nothing in ``src/ckptpub`` imports them: so the layers can change beneath them."""
    private = []
    for plugin, path in (
        (p.parent, path) for p in (PLUGIN, SGLANG_PLUGIN) for path in sorted(p.parent.rglob("*.py"))
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            private += [
                f"{path.relative_to(plugin)}: {name}"
                for name in names
                if name.split(".")[0] == "ckptpub" and any(part.startswith("_") for part in name.split("."))
            ]
    assert not private, private
    core_imports = {target for path in SOURCE.rglob("*.py") for target in _absolute_imports(path)}
    assert not {name for name in core_imports if name.split(".")[0] in ("ckptpub_vllm", "ckptpub_sglang")}


#: The rules an engine's ranks share with distributed publish: an integration hands them bytes.
ENGINE_NEUTRAL = ("_hashing/ranks.py", "distributed.py")


def test_the_rank_rules_import_no_torch_and_no_engine() -> None:
    """``ckptpub.distributed``'s rank rules: torch only inside the hasher's functions, never at import."""
    imported = {name.split(".")[0] for path in ENGINE_NEUTRAL for name in _absolute_imports(SOURCE / path)}
    assert not imported & {"torch", "vllm", "sglang"}, imported
    program = "import sys, ckptpub.distributed; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_serving_checks_import_no_torch() -> None:
    """``ckptpub.serving`` (what ``ckptpub preload`` and an engine-neutral integration import) loads no
    torch: only ``_torch``, behind ``ckptpub.serving_torch``, imports it at import."""
    importers = sorted(
        str(path.relative_to(SOURCE))
        for path in [
            SOURCE / "serving.py",
            *(SOURCE / "_serving").rglob("*.py"),
            *(SOURCE / "_torch").rglob("*.py"),
        ]
        if "torch" in {name.split(".")[0] for name in _absolute_imports(path)}
    )
    assert importers == ["_torch/staging.py", "_torch/tensor_bytes.py"]
    program = "import sys, ckptpub.serving; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _absolute_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found
