"""The fast lane stays honest (CONTRIBUTING.md, "The fast lane").

- the markers are registered in setup.cfg and unknown ones are an error (``--strict-markers``);
- every test that needs a peer package (the ``peers`` extra: torch, transformers, transformer-lens,
  tiktoken, tuned-lens, huggingface_hub) carries ``peer``, and every test that opens the headless
  browser carries ``browser``: read from the source with ``ast`` (the test's own body, the module's
  top level, the fixtures and helpers of its module it uses, conftest.py's fixtures), so the fast
  lane never runs a peer or browser test by mistake and never skips one in silence;
- the README and CONTRIBUTING give the same fast command, and CONTRIBUTING's tables name real tests,
  every directory of tests and every ``REFGPT_*`` switch.

Nothing here times anything: the seconds in CONTRIBUTING are a measured record, not a test.
"""

from __future__ import annotations

import ast
import configparser
import functools
import re
import shlex
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MARKERS = {"fast", "slow", "peer", "browser"}
FAST = ["python", "-m", "pytest", "-q", "-m", "fast"]

#: The peers extra's packages (setup.cfg), by import name, and the tests' helpers that need them.
PEER_PACKAGES = {"torch", "transformers", "transformer_lens", "tiktoken", "tuned_lens", "huggingface_hub", "sae_lens",
                 "ctranslate2"}
PEER_HELPERS = {"require_peers", "require_tuned_lens", "require_sae_lens"}  # tests/peers.py, tuned_lens_peer.py, sae_peer.py
PEER_MODULES = {"tl_port"}  # a helper module of the tests to import only after require_peers()
BROWSER_HELPERS = {"need_browser", "Browser"}  # tests/browser.py


def pytest_ini() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg["tool:pytest"]


def registered() -> dict[str, str]:
    lines = [line.strip() for line in pytest_ini()["markers"].splitlines() if line.strip()]
    return dict(line.split(":", 1) for line in lines)


@functools.cache
def _conftest_constant(name: str):
    for node in ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise KeyError(name)


def test_the_markers_are_registered_and_strict_and_fast_is_only_given_by_conftest():
    assert set(registered()) == MARKERS and all(meaning.strip() for meaning in registered().values())
    assert "--strict-markers" in pytest_ini()["addopts"].split()
    assert set(_conftest_constant("NOT_FAST")) == MARKERS - {"fast"}
    by_hand = [p.relative_to(REPO) for p in TESTS.rglob("*.py") if "mark.fast" in p.read_text(encoding="utf-8")
               and p not in (Path(__file__), TESTS / "conftest.py")]
    assert by_hand == []


# ---- what each test needs, and what it is marked ------------------------------------------------


def _marks(expr: ast.AST | None) -> set[str]:
    """The ``pytest.mark.NAME`` in a decorator or pytestmark expression (lists, calls, pytest.param too)."""
    if expr is None:
        return set()
    return {node.attr for node in ast.walk(expr) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"}


def _direct_needs(node: ast.AST) -> set[str]:
    """What a piece of code needs by itself: 'peer' and/or 'browser'."""
    needs = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            names = [alias.name for alias in sub.names]
        elif isinstance(sub, ast.ImportFrom):
            names = [sub.module or ""]
        else:
            names = []
        if any(n.split(".")[0] in PEER_PACKAGES | PEER_MODULES or n == "refgpt.tl_torch" for n in names):
            needs.add("peer")
        if isinstance(sub, ast.Call):
            name = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", "")
            if name in PEER_HELPERS:
                needs.add("peer")
            if name in BROWSER_HELPERS:
                needs.add("browser")
            if (name == "importorskip" and sub.args and isinstance(sub.args[0], ast.Constant)
                    and str(sub.args[0].value).split(".")[0] in PEER_PACKAGES):
                needs.add("peer")
    return needs


def _functions(tree: ast.Module):
    """(qualified name, class or None, function) for every function at the top level or in a class."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, None, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", node, sub


#: Words without which a piece of code cannot need a peer or the browser (the fast path of _direct_needs).
TRIGGERS = PEER_PACKAGES | PEER_MODULES | PEER_HELPERS | BROWSER_HELPERS | {"importorskip", "tl_torch"}


def _used_names(function: ast.AST) -> set[str]:
    """The names a function calls or takes as fixtures (self.helper too), read from its code, not its strings."""
    names = {a.arg for a in function.args.args + function.args.kwonlyargs}
    for node in ast.walk(function):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def _needs_by_name(tree: ast.Module, source: str, outside: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every function's needs, through the module's functions and fixtures it uses (to a fixed point)
    and ``outside``'s (conftest.py's fixtures). The words of a function's text sift quickly; its code
    (``_used_names``, ``_direct_needs``) decides."""
    lines = source.splitlines()
    functions = {qualified: node for qualified, _, node in _functions(tree)}
    words = {q: set(re.findall(r"[A-Za-z_]\w*", "\n".join(lines[node.lineno - 1:node.end_lineno])))
             for q, node in functions.items()}
    needs = {q: _direct_needs(node) if words[q] & TRIGGERS else set() for q, node in functions.items()}
    used: dict[str, set[str]] = {}
    changed = True
    while changed:
        changed = False
        by_short: dict[str, set[str]] = {}
        for q, n in needs.items():
            if n:
                by_short.setdefault(q.rsplit(".", 1)[-1], set()).update(n)
        needy = by_short | {name: n for name, n in outside.items() if n}
        for q, node in functions.items():
            if words[q] & needy.keys():
                if q not in used:
                    used[q] = _used_names(node)
                more = set().union(*(needy.get(u, ()) for u in used[q]))
                if not more <= needs[q]:
                    needs[q] |= more
                    changed = True
    return needs


def _conftests(path: Path) -> list[Path]:
    return [d / "conftest.py" for d in [path.parent, *path.parent.parents] if (d / "conftest.py").is_file()
            and TESTS in [d, *d.parents]]


def _directory_marks(path: Path) -> set[str]:
    """What tests/conftest.py's DIRECTORY_MARKS gives every test of a module."""
    return set(_conftest_constant("DIRECTORY_MARKS").get(path.relative_to(TESTS).parts[0], ()))


@functools.cache
def _conftest_fixture_needs(directory: Path) -> dict[str, set[str]]:
    """The needs of the fixtures of the conftest.py files from tests/ down to ``directory``."""
    needs: dict[str, set[str]] = {}
    for conftest in reversed(_conftests(directory / "x.py")):
        source = conftest.read_text(encoding="utf-8")
        needs.update(_needs_by_name(ast.parse(source), source, needs))
    return needs


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))



def _module_marks(path: Path, tree: ast.Module) -> set[str]:
    marks = _directory_marks(path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["pytestmark"]:
            marks |= _marks(node.value)
    return marks


def _tests(tree: ast.Module):
    """(qualified name, marks of its own and its class's, function) of every test function pytest collects."""
    for qualified, cls, function in _functions(tree):
        if function.name.startswith("test_") and (cls is None or cls.name.startswith("Test")):
            own = set().union(*map(_marks, function.decorator_list), *map(_marks, cls.decorator_list if cls else []))
            yield qualified, own, function


def marks_of(node_id: str) -> set[str]:
    """The markers a test id (tests/x/test_y.py::test_z[param]) carries, as the check reads them."""
    file, _, name = node_id.partition("::")
    path = REPO / file
    tree = ast.parse(path.read_text(encoding="utf-8"))
    qualified = name.split("[", 1)[0].replace("::", ".")
    (own,) = [own for q, own, _ in _tests(tree) if q == qualified]
    return (_module_marks(path, tree) | own) & MARKERS


def unmarked_needs() -> list[str]:
    wrong = []
    for path in _test_modules():
        source = path.read_text(encoding="utf-8")
        outside = _conftest_fixture_needs(path.parent)
        if not set(re.findall(r"[A-Za-z_]\w*", source)) & (TRIGGERS | {name for name, n in outside.items() if n}):
            continue  # nothing in it could need a peer or the browser
        tree = ast.parse(source)
        module_marks = _module_marks(path, tree)
        top_level = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        module_needs = set().union(*map(_direct_needs, top_level))
        needs = _needs_by_name(tree, source, outside)
        for qualified, own, _ in _tests(tree):
            missing = (needs[qualified] | module_needs) - module_marks - own
            if missing:
                wrong.append(f"{path.relative_to(REPO)}::{qualified} needs {sorted(missing)}")
    return wrong


def test_every_peer_and_browser_test_is_marked():
    assert unmarked_needs() == []


def test_the_check_sees_a_missing_mark(tmp_path):
    """The check itself: a module-level peer import, a peer fixture of the module and a browser helper
    are each seen, and the marks that cover them are read from where they may stand."""
    source = '''
import pytest
from browser import need_browser

@pytest.fixture
def hf():
    return pytest.importorskip("transformers")

def test_uses_the_fixture(hf): pass

def test_opens_the_browser():
    need_browser()

@pytest.mark.parametrize("x", [1])
@pytest.mark.browser
def test_marked(x):
    need_browser()

def test_needs_nothing(): pass
'''
    tree = ast.parse(source)
    needs = _needs_by_name(tree, source, {})
    assert needs["test_uses_the_fixture"] == {"peer"} and needs["test_opens_the_browser"] == {"browser"}
    assert needs["test_needs_nothing"] == set() and needs["test_marked"] == {"browser"}
    marked = next(f for q, _, f in _functions(tree) if q == "test_marked")
    assert set().union(*map(_marks, marked.decorator_list)) == {"parametrize", "browser"}
    assert _direct_needs(ast.parse("import torch")) == {"peer"}
    assert _marks(ast.parse("pytestmark = [pytest.mark.peer, pytest.mark.slow]").body[0].value) == {"peer", "slow"}


def test_the_tl_torch_directory_is_marked_peer_by_conftest():
    assert _directory_marks(TESTS / "tl_torch" / "tl_factored_matrix" / "test_tl_factored_matrix_properties.py") == {"peer"}
    assert _directory_marks(TESTS / "core" / "test_plain.py") == set()


# ---- what the docs say --------------------------------------------------------------------------


CONTRIBUTING = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")


def _fast_commands(text: str) -> list[list[str]]:
    """The pytest command lines with ``-m`` in a text: quoted inline, or a line of a code block."""
    return [shlex.split(c) for c in re.findall(r"(?:`|^)(python -m pytest [^`\n]*-m [^`\n]*)", text, re.M)]


def test_the_readme_and_contributing_give_the_same_fast_command():
    assert _fast_commands(README) == [FAST]
    assert FAST in _fast_commands(CONTRIBUTING)


def _table(heading: str) -> list[list[str]]:
    """The body rows (cells) of the first Markdown table after the first line containing ``heading``."""
    lines = CONTRIBUTING.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 2:end]]


def test_contributing_s_slowest_tests_exist_with_the_markers_it_says():
    """The record of the 25 slowest tests names real tests, with the markers they carry (none: the
    test stays in the fast lane)."""
    rows = _table("The 25 slowest tests")
    assert len(rows) == 25
    for seconds, node_id, marked in rows:
        said = set(re.findall(r"`(\w+)`", marked))
        assert marks_of(node_id.strip("`")) == said, node_id


def test_contributing_s_layout_names_every_directory_of_tests_and_times_real_ones():
    directories = {p.relative_to(REPO).parts[:2] for p in _test_modules() if p.parent != TESTS}
    directories = {"/".join(d) for d in directories}
    named = set(re.findall(r"^- `(tests/\w+)`", CONTRIBUTING, re.M))
    assert directories <= named, directories - named
    timed = {row[0].strip("`") for row in _table("### Layout, and where the time goes")}
    assert timed - {"all", "tests/ (top)"} <= directories


def test_contributing_lists_every_refgpt_switch():
    sources = "".join(p.read_text(encoding="utf-8") for folder in ("refgpt", "tests", "benchmarks")
                      for p in (REPO / folder).rglob("*.py") if p != Path(__file__))
    switches = set(re.findall(r"\bREFGPT_[A-Z0-9_]+", sources)) - {"REFGPT_ONLY_SUFFIX"}  # a constant, not a switch
    listed = {row[0].split("`")[1].split("=")[0] for row in _table("### The switches")}
    assert listed == switches


def test_the_modules_the_fast_lane_does_not_import_have_no_fast_test(request):
    """tests/conftest.py's pytest_ignore_collect skips, under ``-m fast``, the modules it reads as wholly
    slow, peer or browser: each such module's tests all carry one of those markers."""
    conftest = request.config.pluginmanager.get_plugin(str(TESTS / "conftest.py"))
    skipped = [path for path in _test_modules() if conftest._wholly_not_fast(path)]
    assert len(skipped) >= 20  # tests/tl_torch and the peer modules of tests/core, at least
    for path in skipped:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = _module_marks(path, tree)
        for qualified, own, _ in _tests(tree):
            assert (module | own) & (MARKERS - {"fast"}), f"{path.relative_to(REPO)}::{qualified}"
