"""The package's rooms and layers, read from its source: imports point down only, and nothing
imports in a circle.

refgpt/ holds a small top level and rooms named by idea, in layers from the bottom up:

    reference refgpt/reference/: GPT-2 and the rule that judges a port, NumPy and the standard
              library only: it imports nothing of refgpt, and the engine imports it (its weight map,
              score scale, activations' formulas are the ones the engine uses)
    base      refgpt/errors.py, version.py, dtypes.py, strict_json.py, threads.py, memory.py: what everything needs
              (threads.py: the row-parallel work of every room's ops; memory.py: where their big arrays live)
    gpt2      refgpt/gpt2/: GPT-2's math (the plain reading copy, the fast ops, config, tokenizer)
    tl        refgpt/tl/: TransformerLens compatibility (hooks, cache, decomposition, text, …)
    model     refgpt/model.py, backward.py, non_finite.py: the Model, forward and backward
    files     refgpt/files/: files and hub (safetensors, checkpoints, saving, the HF cache)
    analysis, oracle, train, tl_torch   each built on the layers below, never on each other
              (tl_torch: the torch-facing TransformerLens model, the one room that imports torch)
    sae       refgpt/sae/: SAELens's sparse autoencoders; its feature attribution is analysis's
              attribution with the features as components, so it sits above analysis, beside sweep
    sweep     refgpt/sweep/: one task over a corpus, serially or on Dask; its tasks are analysis's
              and oracle's (lens, attribution, golden files, comparison), so it sits above both
    cli       the refgpt command, on top of all of them

Every ``import`` statement of every module under refgpt/ is read with ``ast``, at module level and
inside functions alike (an import hidden in a function is still a dependency), and checked:

- no cycle among refgpt's modules;
- a module imports only its own layer and the layers below (analysis, oracle and train never
  each other);
- the core (base to files) imports no third-party package but numpy, safetensors and regex (never
  torch, transformers, transformer_lens, tiktoken, matplotlib or dask);
- Dask, an optional extra, is imported by refgpt/sweep/on_dask.py alone;
- the top level holds at most 12 modules, and every module sits in a known room;
- ``import refgpt`` loads the core only.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import refgpt

PACKAGE = Path(refgpt.__file__).parent
BASE = {"refgpt.errors", "refgpt.version", "refgpt.dtypes", "refgpt.strict_json", "refgpt.threads", "refgpt.memory"}
MODEL = {"refgpt.model", "refgpt.backward", "refgpt.non_finite"}
#: Layer of each room, bottom first; rooms of one rank never import each other. tl_torch (the
#: torch-facing model) loads checkpoints (files) and wraps the model, so it sits where analysis
#: does, and the optional torch stays out of everything below it. sae (sparse autoencoders) builds
#: its feature attribution on analysis's, so it sits above analysis, beside sweep.
RANK = {"reference": 0, "base": 0, "gpt2": 1, "tl": 2, "model": 3, "files": 4, "analysis": 5, "oracle": 5, "train": 5,
        "tl_torch": 5, "sae": 6, "sweep": 6, "cli": 7,
        # runtimes: other engines (ONNX Runtime, …) run as candidates on a golden's tokens; each an optional
        # extra imported inside functions, so the room sits beside oracle and never imports it
        "runtimes": 5}
CORE = {"reference", "base", "gpt2", "tl", "model", "files"}
CORE_THIRD_PARTY = {"numpy", "safetensors", "regex"}  # setup.cfg's install_requires
PEERS = {"torch", "transformers", "transformer_lens", "tiktoken", "matplotlib", "dask", "distributed",
         # the runtimes room's extras
         "onnx", "onnxscript", "onnxruntime", "tinygrad", "ctranslate2", "mlx", "mlx_lm", "polygraphy"}


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__.py)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("refgpt",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the module, module level and in functions.

    ``from X import y`` counts as an import of ``X.y`` when that is a module, else of ``X``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in MODULES else target, node.lineno))
    return found


def layer(module: str) -> str:
    """The room of a module ('base', 'gpt2', … 'cli'), 'package' (refgpt/__init__, __main__) or 'external'."""
    parts = module.split(".")
    if parts[0] != "refgpt":
        return "external"
    if module in ("refgpt", "refgpt.__main__"):
        return "package"
    if module in BASE:
        return "base"
    if module in MODEL:
        return "model"
    if parts[1] in RANK:
        return parts[1]
    return "unknown"


def edges() -> dict[str, list[tuple[str, int]]]:
    return {name: imports(name, path) for name, path in MODULES.items()}


EDGES = edges()


def where(module, line):
    return f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}"


def test_the_walk_sees_every_layer():
    layers = {layer(m) for m in MODULES}
    assert layers == {"package", *RANK}
    assert "refgpt.tl.decomposition" in {t for t, _ in EDGES["refgpt.tl.cache"]}  # from . import decomposition
    assert "refgpt.oracle.comparison" in {t for t, _ in EDGES["refgpt.cli.compare"]}  # from ..oracle import comparison
    assert "matplotlib.figure" in {t for t, _ in EDGES["refgpt.analysis.plots"]}  # inside a function


def test_every_module_sits_in_a_room_and_the_top_level_is_small():
    assert [m for m in MODULES if layer(m) == "unknown"] == []
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    rooms = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert set(rooms) == set(RANK) - {"base", "model"}, rooms


def test_no_cycle_among_refgpt_modules():
    graph = {m: sorted({t for t, _ in EDGES[m] if t in MODULES and t != m}) for m in MODULES}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == "open":
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m)


def test_imports_point_down():
    bad = []
    for m, found in EDGES.items():
        room = layer(m)
        if room == "package":
            continue
        for target, line in found:
            there = layer(target)
            if there in ("external", "package") and target.split(".")[0] != "refgpt":
                continue
            if there == "package" or RANK[there] > RANK[room] or (RANK[there] == RANK[room] and there != room):
                bad.append(f"{where(m, line)} imports {target} ({there}: not below {room})")
    assert not bad, "\n".join(bad)


def test_the_reference_imports_numpy_and_the_standard_library_only():
    """refgpt/reference/ is read on its own: nothing of refgpt (not even base), nothing but NumPy."""
    modules = [m for m in MODULES if layer(m) == "reference"]
    assert {"refgpt.reference.gpt2", "refgpt.reference.weights", "refgpt.reference.bounds",
            "refgpt.reference.compare", "refgpt.reference.golden"} <= set(modules)
    bad = [f"{where(m, line)} imports {t}" for m in modules for t, line in EDGES[m]
           if not (t == "numpy" or t.startswith("refgpt.reference") or t.split(".")[0] in sys.stdlib_module_names)]
    assert not bad, "\n".join(bad)


def test_core_imports_only_its_runtime_dependencies():
    bad = []
    for m, found in EDGES.items():
        if layer(m) not in CORE:
            continue
        for target, line in found:
            top = target.split(".")[0]
            if layer(target) == "external" and top not in sys.stdlib_module_names and top not in CORE_THIRD_PARTY:
                bad.append(f"{where(m, line)} imports {target} (not a runtime dependency)")
    assert not bad, "\n".join(bad)


def test_no_peer_package_in_the_core():
    bad = [f"{where(m, line)} imports {t}" for m, found in EDGES.items() if layer(m) in CORE | {"package"}
           for t, line in found if t.split(".")[0] in PEERS]
    assert not bad, "\n".join(bad)


def test_dask_is_imported_by_the_sweep_on_dask_module_alone():
    found = sorted({m for m, imported in EDGES.items() for t, _ in imported if t.split(".")[0] in ("dask", "distributed")})
    assert found == ["refgpt.sweep.on_dask"], found


def test_torch_is_imported_by_the_torch_room_only():
    """The torch-facing model (refgpt/tl_torch/) is optional: torch is imported there and nowhere
    else, and no core module imports the room (the core runs without torch installed). The runtimes
    room (refgpt/runtimes/) exports with torch.onnx through ``extras.require("torch", …)``, inside
    functions, never at import."""
    torch_users = sorted(m for m, found in EDGES.items() for t, _ in found if t.split(".")[0] == "torch")
    assert torch_users and all(layer(m) in ("tl_torch", "runtimes") for m in torch_users), torch_users
    importers = sorted(f"{where(m, line)}" for m, found in EDGES.items() if layer(m) != "tl_torch"
                       for t, line in found if layer(t) == "tl_torch")
    assert importers == [], importers


def test_import_refgpt_loads_the_core_only():
    """``import refgpt`` alone imports nothing heavy (so the refgpt command catches Ctrl-C from its
    first moment, refgpt/__main__.py); its names load the core, and the core only."""
    code = ("import sys, refgpt; bare = sorted(sys.modules); refgpt.load, refgpt.save, refgpt.Model, refgpt.Config; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('refgpt') "
            "or m.split('.')[0] in %r))); print(' '.join(m for m in bare if m.split('.')[0] in ('numpy', 'refgpt')))"
            % (PEERS,))
    loaded, bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout.split("\n")[:2]
    loaded = loaded.split()
    assert "refgpt.model" in loaded and "refgpt.files.saving" in loaded
    assert [m for m in loaded if layer(m) not in CORE | {"package"}] == []
    assert bare.split() == ["refgpt"]


def test_old_module_paths_are_gone():
    """0.1's module paths (refgpt.golden, refgpt.commands …) and the flat 0.2 paths were dropped in 0.3
    (CHANGELOG.md): no import hook stands in for them."""
    code = """
import importlib, refgpt
for old in ("refgpt.golden", "refgpt.commands", "refgpt.attention", "refgpt.hub", "refgpt.gpt2.plain"):
    try:
        importlib.import_module(old)
    except ModuleNotFoundError:
        continue
    raise SystemExit(old + " still imports")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # a fresh interpreter
    assert out.stdout.strip() == "ok", out.stderr + out.stdout


def test_the_public_api_is_all_of_import_refgpt():
    assert {"load", "load_default", "save", "Model", "Config", "Tokenizer", "RefGPTError"} <= set(refgpt.__all__)
    assert all(hasattr(refgpt, name) for name in refgpt.__all__)


def test_every_file_the_docs_and_docstrings_name_exists():
    """README.md, CONTRIBUTING.md, docs/*.md, weights/README.md and every module's text name files by
    path; each exists."""
    repo = PACKAGE.parent
    texts = [repo / "README.md", repo / "CONTRIBUTING.md", repo / "weights" / "README.md",
             *sorted((repo / "docs").glob("*.md")),
             *MODULES.values()]
    path = re.compile(r"(?<![\w/.])((?:refgpt|tests|docs|benchmarks|weights)/[\w/.-]*\w\.(?:py|md|json|txt|png))")
    missing = [f"{text.relative_to(repo)}: {name}" for text in texts
               for name in path.findall(text.read_text(encoding="utf-8")) if not (repo / name).exists()]
    assert not missing, "\n".join(missing)
