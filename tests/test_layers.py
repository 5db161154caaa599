"""The layers of docs/ARCHITECTURE.md, enforced on the source (Python's ``ast``, nothing run).

Every module of ``minipar`` has exactly one layer (:data:`LAYERS`); an import points
down the table or stays in its layer; the families of layer 5 never import each other;
no cycle (lazy imports inside functions and ``TYPE_CHECKING`` imports included); no
import of another module's private name; no package attribute shadowing one of its
modules; and a module named in a string (a registry row, a launch target) obeys the
same rules as an import.  :data:`KNOWN` lists today's violations (without line
numbers): it may only shrink (a fixed violation still listed fails too, so the list
stays true).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "minipar"

#: layer -> module prefixes (a prefix covers a module and everything under it); the
#: longest prefix decides.  The same table is docs/ARCHITECTURE.md's "Layers".
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("minipar", "minipar.backend", "minipar.strict_device", "minipar.spans",
        "minipar.checks", "minipar.host_memory", "minipar.trees", "minipar.progress",
        "minipar.overlap",
        "minipar.trace", "minipar.registry", "minipar.glossary",
        "minipar.safetensors_io"),
    1: ("minipar.comm",),
    2: ("minipar.collectives",),
    3: ("minipar.nn", "minipar.nn.decoding",  # decoding: KV cache and sampling, forward only
        "minipar.optim", "minipar.precision", "minipar.quantize", "minipar.memory",
        "minipar.data",  # the package: batches, synthetic, tokenizer, text, corpus
        "minipar.plan"),
    4: ("minipar.parallel", "minipar.parallel.engine", "minipar.parallel.mappings",
        "minipar.parallel.remat", "minipar.parallel.offload",
        "minipar.parallel.parity", "minipar.parallel.common",
        "minipar.train"),  # the serial loop (the parity oracle); its verb is minipar.cli.train
    5: (),  # the families: FAMILIES
    6: ("minipar.parallel.hybrid",),
    7: ("minipar.parallel.strategies", "minipar.parallel.checkpoint", "minipar.parallel.loop"),
    8: ("minipar.launch", "minipar.run", "minipar.bench", "minipar.viz", "minipar.exercises",
        "minipar.cli"),  # minipar.cli.options too: option types, the one usage-error path
}

#: layer 5: family -> its module prefixes (families never import each other)
FAMILIES: dict[str, tuple[str, ...]] = {
    "data_parallel": ("minipar.parallel.data_parallel",),
    "zero": ("minipar.parallel.zero",),
    "tensor_parallel": ("minipar.parallel.tensor_parallel",),
    "context_parallel": ("minipar.parallel.context_parallel",),
    "expert_parallel": ("minipar.parallel.expert_parallel",),
    "pipeline": ("minipar.parallel.pipeline",),
}

#: the registries whose strings name front-end modules (layer 8)
REGISTRY = "minipar.registry"

#: violations not fixed yet, each as the test prints it (without its line): empty, and
#: it may only stay so
KNOWN: set[str] = set()


# -- reading the source ------------------------------------------------------------

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _match(name: str, prefix: str) -> bool:
    """``prefix`` covers itself and its submodules (the root package only itself)."""
    return name == prefix or (prefix != "minipar" and name.startswith(prefix + "."))


def _longest(name: str, table: dict) -> tuple[int, object] | None:
    best = None
    for key, prefixes in table.items():
        for p in prefixes:
            if _match(name, p) and (best is None or len(p) > best[0]):
                best = (len(p), key)
    return best


def layer_of(name: str) -> int | None:
    lay, fam = _longest(name, LAYERS), _longest(name, FAMILIES)
    if fam is not None and (lay is None or fam[0] >= lay[0]):
        return 5
    return None if lay is None else lay[1]


def family_of(name: str) -> str | None:
    fam, lay = _longest(name, FAMILIES), _longest(name, LAYERS)
    if fam is None or (lay is not None and lay[0] > fam[0]):
        return None
    return fam[1]


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(all_mods: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported module, private name or "", line) for every import and every
    string literal that is exactly a minipar module's dotted name."""
    out = []
    for mod, path in all_mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("minipar"):
                        out.append((mod, a.name, "", node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                if not base.startswith("minipar"):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in all_mods:  # `from pkg import module`
                        out.append((mod, sub, "", node.lineno))
                    else:
                        private = a.name.startswith("_") and not a.name.startswith("__")
                        out.append((mod, base, a.name if private else "", node.lineno))
        # a module named in a string: an argument of a call (a launch target,
        # import_module) anywhere, or any string of the registry
        strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant)] if mod == REGISTRY \
            else [a for n in ast.walk(tree) if isinstance(n, ast.Call)
                  for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Constant)]
        for node in strings:
            if isinstance(node.value, str) and node.value in all_mods and node.value != mod \
                    and "." in node.value:
                out.append((mod, node.value, "", node.lineno))
    return out


def _known_module(name: str, all_mods: dict[str, Path]) -> str:
    """The module an import names (``minipar.x.y`` may be a name y in module x)."""
    while name and name not in all_mods:
        name = name.rpartition(".")[0]
    return name


def _private_module(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def violations() -> list[str]:
    all_mods = modules()
    out = []
    for m in all_mods:
        if layer_of(m) is None:
            out.append(f"unlayered: {m} is in no layer of LAYERS/FAMILIES")
    graph: dict[str, set[str]] = {m: set() for m in all_mods}
    for src, dst, private, line in imports(all_mods):
        dst = _known_module(dst, all_mods)
        if not dst or dst == src:
            continue
        graph[src].add(dst)
        where = f"{src}:{line}"
        if src == REGISTRY:
            if layer_of(dst) != 8:
                out.append(f"registry: {where} names {dst}, which is not a front end (layer 8)")
            continue
        ls, ld = layer_of(src), layer_of(dst)
        if ls is not None and ld is not None and ld > ls:
            out.append(f"upward: {where} imports {dst} (layer {ls} -> {ld})")
        fs, fd = family_of(src), family_of(dst)
        if fs and fd and fs != fd:
            out.append(f"family: {where} imports {dst} ({fs} -> {fd})")
        if private:
            out.append(f"private: {where} imports {private} from {dst}")
        # a private module is imported only inside its own package
        if _private_module(dst):
            pkg = ".".join(p for p in dst.split(".") if not p.startswith("_") or p.startswith("__"))
            home = dst.rsplit(".", 1)[0]
            if not _match(src, home) and pkg:
                out.append(f"private: {where} imports the private module {dst}")
    graph.pop(REGISTRY, None)
    out += [f"cycle: {' -> '.join(c)}" for c in cycles(graph)]
    out += shadowing(all_mods)
    return sorted(set(out))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a
    closed path through it, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c + [c[0]] for c in sorted(comps)]


def shadowing(all_mods: dict[str, Path]) -> list[str]:
    """A package binding a name (def, class, assignment, or an imported non-module) equal
    to one of its submodules: ``import pkg.sub as s`` would then give that object."""
    out = []
    for mod, path in all_mods.items():
        if path.name != "__init__.py":
            continue
        subs = {m.rsplit(".", 1)[1] for m in all_mods if m.rpartition(".")[0] == mod}
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, True, node)
                names = [a.asname or a.name for a in node.names
                         if f"{base}.{a.name}" not in all_mods]
            for n in names:
                if n in subs:
                    out.append(f"shadow: {mod}.{n} is a module and, in {mod}, another object")
    return out


# -- the tests -------------------------------------------------------------------

def _key(violation: str) -> str:
    """A violation without its line number (KNOWN survives edits above the import)."""
    return re.sub(r"(minipar[\w.]*):\d+", r"\1", violation)


def test_every_module_obeys_the_layers():
    found = violations()
    new = [v for v in found if _key(v) not in KNOWN]
    fixed = sorted(KNOWN - {_key(v) for v in found})
    assert not new, "new layer violations:\n" + "\n".join(new)
    assert not fixed, "fixed (remove them from KNOWN in tests/test_layers.py):\n" + "\n".join(fixed)


def _with(tmp_path: Path, files: dict[str, str]) -> list[str]:
    """The violations of a small fake tree (``minipar`` under ``tmp_path``)."""
    global ROOT
    for rel, text in files.items():
        p = tmp_path / "minipar" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    saved, ROOT = ROOT, tmp_path / "minipar"
    try:
        return violations()
    finally:
        ROOT = saved


@pytest.mark.parametrize("files, expected", [
    ({"__init__.py": "", "spans.py": "import minipar.comm.traced\n",
      "comm/__init__.py": "", "comm/traced.py": ""},
     "upward: minipar.spans:1 imports minipar.comm.traced (layer 0 -> 1)"),
    ({"__init__.py": "", "nn/__init__.py": "", "nn/a.py": "def f():\n    from minipar.nn import b\n",
      "nn/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from minipar.nn.a import f\n"},
     "cycle: minipar.nn.a -> minipar.nn.b -> minipar.nn.a"),
    ({"__init__.py": "", "nn/__init__.py": "", "nn/a.py": "from minipar.nn.b import _secret\n",
      "nn/b.py": "_secret = 1\n"},
     "private: minipar.nn.a:1 imports _secret from minipar.nn.b"),
    ({"__init__.py": "", "parallel/__init__.py": "", "parallel/pipeline/__init__.py":
      "from minipar.parallel.pipeline.check import check\n", "parallel/pipeline/check.py": "def check(): pass\n"},
     "shadow: minipar.parallel.pipeline.check is a module and, in minipar.parallel.pipeline, another object"),
    ({"__init__.py": "", "parallel/__init__.py": "", "parallel/context_parallel/__init__.py": "",
      "parallel/context_parallel/ulysses.py": "import minipar.parallel.zero\n",
      "parallel/zero/__init__.py": ""},
     ("family: minipar.parallel.context_parallel.ulysses:1 imports minipar.parallel.zero "
     "(context_parallel -> zero)")),
    ({"__init__.py": "", "registry.py": "VERBS = {'x': ('minipar.nn.gpt', 'help')}\n",
      "nn/__init__.py": "", "nn/gpt.py": ""},
     "registry: minipar.registry:1 names minipar.nn.gpt, which is not a front end (layer 8)"),
    ({"__init__.py": "", "nn/__init__.py": "", "nn/gpt.py": "X = run('minipar.run.worker')\n",
      "run/__init__.py": "", "run/worker.py": ""},
     "upward: minipar.nn.gpt:1 imports minipar.run.worker (layer 3 -> 8)"),
    ({"__init__.py": "", "mystery.py": ""}, "unlayered: minipar.mystery is in no layer of LAYERS/FAMILIES"),
])
def test_the_checker_catches_each_kind_of_violation(tmp_path, files, expected):
    assert expected in _with(tmp_path, files)
