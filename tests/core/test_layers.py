"""The package's layers, read from its source: imports point down only, and nothing imports in a circle.

Every ``import`` statement of every module under refgpt/ is read with ``ast``, at module level and
inside functions alike (an import hidden in a function is still a dependency), and checked:

- no cycle among refgpt's modules;
- the core (the modules flat in refgpt/) imports nothing from refgpt.analysis, refgpt.oracle,
  refgpt.train or refgpt.cli, and no third-party package but numpy, safetensors and regex (never
  torch, transformers, transformer_lens, tiktoken or matplotlib);
- analysis, oracle and train each import only the core and their own modules, never each other;
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
SUBPACKAGES = ("analysis", "oracle", "train", "cli")
CORE_THIRD_PARTY = {"numpy", "safetensors", "regex"}  # setup.cfg's install_requires
PEERS = {"torch", "transformers", "transformer_lens", "tiktoken", "matplotlib"}


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
    """'core', a subpackage's name, 'package' (refgpt/__init__, __main__) or 'external'."""
    parts = module.split(".")
    if parts[0] != "refgpt":
        return "external"
    if module in ("refgpt", "refgpt.__main__"):
        return "package"
    return parts[1] if parts[1] in SUBPACKAGES else "core"


def edges() -> dict[str, list[tuple[str, int]]]:
    return {name: imports(name, path) for name, path in MODULES.items()}


EDGES = edges()


def where(module, line):
    return f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}"


def test_the_walk_sees_every_layer():
    layers = {layer(m) for m in MODULES}
    assert layers == {"core", "package", *SUBPACKAGES}
    assert "refgpt.decomposition" in {t for t, _ in EDGES["refgpt.cache"]}  # from . import decomposition
    assert "refgpt.oracle.comparison" in {t for t, _ in EDGES["refgpt.cli.compare"]}  # from ..oracle import comparison
    assert "matplotlib.figure" in {t for t, _ in EDGES["refgpt.analysis.plots"]}  # inside a function


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


def test_core_imports_only_core_and_its_runtime_dependencies():
    bad = []
    for m, found in EDGES.items():
        if layer(m) != "core":
            continue
        for target, line in found:
            top = target.split(".")[0]
            if layer(target) not in ("core", "external"):
                bad.append(f"{where(m, line)} imports {target} ({layer(target)}: above the core)")
            elif layer(target) == "external" and top not in sys.stdlib_module_names and top not in CORE_THIRD_PARTY:
                bad.append(f"{where(m, line)} imports {target} (not a runtime dependency)")
    assert not bad, "\n".join(bad)


def test_no_peer_package_in_the_core():
    bad = [f"{where(m, line)} imports {t}" for m, found in EDGES.items() if layer(m) in ("core", "package")
           for t, line in found if t.split(".")[0] in PEERS]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("room", ["analysis", "oracle", "train"])
def test_analysis_oracle_and_train_build_on_the_core_only(room):
    bad = [f"{where(m, line)} imports {t} ({layer(t)})" for m, found in EDGES.items() if layer(m) == room
           for t, line in found if layer(t) not in ("core", room, "external")]
    assert not bad, "\n".join(bad)


def test_import_refgpt_loads_the_core_only():
    code = ("import sys, refgpt; print(' '.join(sorted(m for m in sys.modules if m.startswith('refgpt') "
            "or m.split('.')[0] in %r)))" % (PEERS,))
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "refgpt.model" in loaded
    assert [m for m in loaded if layer(m) not in ("core", "package")] == []


def test_old_module_paths_still_import_the_moved_modules():
    code = """
import importlib, sys, refgpt
for old, new in refgpt.MOVED.items():
    assert importlib.import_module(old) is importlib.import_module(new), old
    assert getattr(refgpt, old.rsplit(".", 1)[1]) is sys.modules[new], old
import refgpt.commands.predict, refgpt.cli.predict
assert refgpt.commands.predict is refgpt.cli.predict and refgpt.cli.predict.__name__ == "refgpt.cli.predict"
from refgpt.oracle import compare, comparison
assert compare is comparison.compare
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # a fresh interpreter
    assert out.stdout.strip() == "ok", out.stderr


def test_the_public_api_is_all_of_import_refgpt():
    assert {"load", "load_default", "save", "Model", "Config", "Tokenizer", "RefGPTError"} <= set(refgpt.__all__)
    assert all(hasattr(refgpt, name) for name in refgpt.__all__)


def test_every_file_the_docs_and_docstrings_name_exists():
    """README.md, docs/*.md, weights/README.md and every module's text name files by path; each exists."""
    repo = PACKAGE.parent
    texts = [repo / "README.md", repo / "weights" / "README.md", *sorted((repo / "docs").glob("*.md")),
             *MODULES.values()]
    path = re.compile(r"(?<![\w/.])((?:refgpt|tests|docs|benchmarks|weights)/[\w/.-]*\w\.(?:py|md|json|txt|png))")
    missing = [f"{text.relative_to(repo)}: {name}" for text in texts
               for name in path.findall(text.read_text(encoding="utf-8")) if not (repo / name).exists()]
    assert not missing, "\n".join(missing)
