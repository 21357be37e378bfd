"""Mutation testing of refgpt's core: does the test suite reject every wrong GPT-2 it could become?

    python benchmarks/mutation.py                         # every module in MODULES
    python benchmarks/mutation.py attention layernorm     # some modules
    python benchmarks/mutation.py --only-survivors benchmarks/MUTATION.json   # rerun old survivors
    python benchmarks/mutation.py --merge a.json b.json --rev COMMIT             # one report of several runs
    python benchmarks/mutation.py --local --sample 8 layernorm attention   # do local verdicts name the mutated op?

For each module it makes every mutant (one small edit of the source), runs that module's tests
(``MODULES`` maps each module to the test files that should notice) with ``pytest -x`` and a
timeout, and records whether the tests failed (killed), timed out (killed: an endless loop is
noticed) or passed (survived). Each survivor is looked up in ``EQUIVALENT``, the reviewed table
of mutants that compute the same numbers (dead code, a speed path with identical results, …),
each with its reason; the rest are real gaps. It writes benchmarks/MUTATION.md and
benchmarks/MUTATION.json. Not part of CI: on two busy shared cores the five modules of the last report took about 70
minutes with three jobs; every module, several hours.

With ``--local`` (the forward's modules, ``LOCAL_MODULES``; their *_backward functions left out) no
test runs: each mutant's refgpt runs a small random model's float64 forward as a *port* would
(``_FORWARD``, in the tree copy), and refgpt/oracle/local.py, unmutated, judges its dumped
activations against the unmutated weights. The op the mutant changed is the first tensor, in the
forward's order, that differs (bit for bit) from the unmutated refgpt's: every tensor before it is
the same, so every input of that op is. Each mutant is then *named* (the first local flag is at
that op), *named elsewhere* (flagged, first at another op), *within bounds* (it changed numbers,
no flag), *not dumped* (the first such tensor is missing from the dump: the report skips its op,
saying so), *unchanged* (no tensor differs: the mutated line is not on this model's path, or
computes the same bits) or *error* (its forward raised, or its dump is one the judge cannot read). The section "Local verdicts of the forward's
mutants" of MUTATION.md holds the last such run (``write_report`` keeps it).

Mutants run in a copy of the tree (``--workdir``, default a temporary directory), never in the
checkout, under ``nice``, ``--jobs`` at a time (default 1).

Why a mutator of our own (this file), rather than mutmut or cosmic-ray: mutmut 3 rewrites every
function of the package into trampolines in a ``mutants/`` copy and picks tests from its own
coverage run of the whole suite, and cosmic-ray needs a session database and a config per
module; neither has the NumPy-specific operators this issue asks for (``keepdims``/``axis``
arguments, slice bounds of the blocked loops, ``min`` ↔ ``max``), and both would have run far
more tests per mutant than the per-module map below. This one is plain ``ast``: each mutant is
the module unparsed with one node changed, so the report can show the edit as source.

Operators (``mutants``):
- arithmetic  + ↔ −, * ↔ /, // → /, ** → *, | ↔ &, @ stays (shape errors only), in expressions and
  augmented assignments (``out += b`` → ``out -= b``);
- comparisons < ↔ <=, > ↔ >=, == ↔ !=, in ↔ not in, is ↔ is not; ``and`` ↔ ``or``; ``not x`` → x;
  −x → x;
- constants: an int n → n + 1 and n − 1; a float c → 1.1·c (0.0 → 1.0); True ↔ False (this is
  how ``keepdims=True``, ``copy=False``, ``in_place=…`` flags are flipped, and ``axis=-1`` →
  ``axis=0`` / ``axis=-2``);
- slice bounds: a bound b → b + 1, b − 1, or dropped;
- calls: ``min`` ↔ ``max``; the first two positional arguments swapped (unless one is a constant:
  ``point("hook_q", q)`` swapped only fails, and costs a test run; or both are the same expression,
  ``reshape(d, d)``: no mutant at all);
- statements deleted (→ ``pass``): expression statements, augmented assignments, ``raise``,
  ``if``, ``for``, assignments into a subscript or attribute, and re-assignments of a name that
  is already bound in the function.
Not mutated: docstrings and other string constants (error texts: a mutant there is equivalent
by construction, and the tests that match error messages are the bad-input tests), imports,
annotations, ``__repr__``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module → stages of tests that should notice a wrong module. A stage runs only if the ones before
# it passed (``pytest -x``: the first failure ends it), so cheap NumPy-only tests come first and the
# peer tests (importing torch, transformers and TransformerLens alone takes ~5 CPU-seconds) last.
# The tests issue 13 added, and the core tests added since (``NEW``), run after the older ones of the same cost, so that one run
# tells the score before them too (``before``, below).
_OLD_FAST = ["tests/core/test_model_invariants.py", "tests/core/test_kv_cache.py", "tests/core/test_hooks_and_cache.py",
             "tests/core/test_bad_input.py"]
_OLD_PEERS = ["tests/core/test_peers_hf.py", "tests/core/test_peers_tl.py"]
_NEW_PEERS = ["tests/core/test_peers_boundaries.py"]
# Core tests added since issue 13 was filed (issues 12, 14, 16 and the TL ports): NumPy-only, then peers.
_LATER_FAST = ["tests/core/test_non_finite.py", "tests/core/test_tl_semantics.py", "tests/core/test_hook_points.py",
               "tests/core/test_padding.py"]
_LATER_PEERS = ["tests/core/test_tl_ported_hooks_cache.py"]
# Loading tests added since issue 13 (issue 12's fuzzing, issue 11's writer, read back).
_LOADING = ["tests/core/test_safetensors_fuzz.py", "tests/core/test_file_fuzz.py", "tests/core/test_saving.py"]
# KV-cached decoding of padded batches (issue 16), NumPy-only.
_PADDING = ["tests/core/test_padding.py", "tests/core/test_tl_ported_padding.py", "tests/analysis/test_steered_generation.py"]
NEW = {*_LOADING, *_PADDING, "tests/core/test_forward_paths.py", "tests/core/test_plain.py", "tests/core/test_activations.py",
       "tests/core/test_config.py",
       "tests/core/test_checkpoint.py", "tests/core/test_fused_qkv.py", *_NEW_PEERS, *_LATER_FAST, *_LATER_PEERS}
# Every fast path against the plain reading copy (refgpt/reference/gpt2.py), then the paths against each other.
_PATHS = ["tests/core/test_plain.py", "tests/core/test_forward_paths.py"]
# The backward is also judged by plain.backward and the backward hooks (NumPy-only) and by TL's torch gradients (peers).
_BACKWARD_TESTS = [["tests/core/test_backward.py", "tests/core/test_plain.py", "tests/oracle/test_gradients.py",
                    "tests/core/test_tl_semantics.py"],
                   ["tests/core/test_tl_ported_hooks_cache.py"]]
MODULES = {
    "layernorm": [_OLD_FAST + ["tests/core/test_ln_views.py"], _PATHS, _OLD_PEERS + ["tests/core/test_mission.py"], _NEW_PEERS],
    "attention": [_OLD_FAST, _PATHS + _LATER_FAST + _PADDING + ["tests/core/test_fused_qkv.py"], _OLD_PEERS,
                  _NEW_PEERS + _LATER_PEERS],
    "mlp": [_OLD_FAST, _PATHS, _OLD_PEERS, _NEW_PEERS],
    "activations": [_OLD_FAST, ["tests/core/test_activations.py"] + _PATHS, _OLD_PEERS, _NEW_PEERS],
    "linear": [_OLD_FAST, _PATHS, _OLD_PEERS, _NEW_PEERS],
    "model": [_OLD_FAST, _PATHS + ["tests/core/test_checkpoint.py", "tests/core/test_fused_qkv.py"] + _LATER_FAST,
              _OLD_PEERS + ["tests/core/test_mission.py", "tests/core/test_default_model.py"], _NEW_PEERS + _LATER_PEERS],
    "checkpoint": [["tests/core/test_bad_input.py", "tests/core/test_processing.py"],
                   ["tests/core/test_checkpoint.py"] + _LOADING,
                   ["tests/core/test_peers_hf.py", "tests/core/test_default_model.py"], _NEW_PEERS],
    "safetensors_file": [["tests/core/test_bad_input.py"],
                         _LOADING + ["tests/oracle/test_streaming.py", "tests/oracle/test_oracle_file_fuzz.py",
                                     "tests/oracle/test_compare_fails_closed.py"],
                         ["tests/core/test_default_model.py", "tests/core/test_peers_hf.py"], []],
    "config": [["tests/core/test_bad_input.py"], ["tests/core/test_config.py"],
               ["tests/core/test_peers_hf.py", "tests/core/test_default_model.py"], _NEW_PEERS],
    "kv_cache": [["tests/core/test_kv_cache.py", "tests/core/test_bad_input.py"], _PATHS + _PADDING, [], _NEW_PEERS],
    "backward": _BACKWARD_TESTS,
    "decomposition": [["tests/core/test_decomposition.py", "tests/core/test_mission.py", "tests/core/test_ln_views.py",
                       "tests/core/test_hook_points.py"],
                      ["tests/core/test_decomposition_tl.py", "tests/core/test_tl_ported_hooks_cache.py"]],
    "tokenizer": [["tests/core/test_tokenizer.py", "tests/train/test_bpe_trainer.py", "tests/core/test_file_fuzz.py"],
                  ["tests/core/test_tl_ported_tokens.py"]],
    "analysis.attribution": [["tests/analysis/test_attribution.py", "tests/core/test_hook_points.py"],
                             ["tests/cli/test_attribute_cli.py"]],
}


def before(m: "Mutant", stages) -> str:
    """The outcome under the tests from before issue 13, from the test that killed the mutant
    (older tests run first within a stage): killed if an older test did; survived if it survived,
    or if a new test killed it when no older test was left to run; "unknown" if older tests of a
    later stage did not run — ``resolve_before`` then runs them alone."""
    if m.before_outcome:
        return m.before_outcome
    if m.outcome not in ("killed", "timeout"):
        return "survived"
    if m.killer.split("::")[0] not in NEW:
        return "killed"
    later_old = [t for stage in stages[m.stage + 1:] for t in stage if t not in NEW]
    return "unknown" if later_old else "survived"


def fast_first(stages):
    """Two stages instead of four: every NumPy-only test, then every peer test (older tests first
    in each). Kills sooner, but leaves "before" unknown for mutants only new tests kill."""
    return [stages[0] + stages[1], stages[2] + stages[3]] if len(stages) == 4 else stages


#: functions named *_backward inside a forward module are measured against the backward's tests.
BACKWARD_UNIT = "backward"


def module_path(module: str) -> Path:
    """refgpt/<module>.py, or the module of that name in one of the rooms (MUTATION.json's names
    predate them: "attention" is refgpt/gpt2/attention.py)."""
    path = Path("refgpt") / (module.replace(".", "/") + ".py")
    if path.exists():
        return path
    found = sorted(Path("refgpt").glob(f"*/{module.replace('.', '/')}.py"))
    return found[0] if len(found) == 1 else path


# ---- making mutants ---------------------------------------------------------------------------

_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
               ast.FloorDiv: ast.Div, ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv, ast.BitOr: ast.BitAnd,
               ast.BitAnd: ast.BitOr}
_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass
class Mutant:
    module: str
    unit: str  # the module, or "backward" for its *_backward functions
    function: str
    line: int
    operator: str
    before: str
    after: str
    outcome: str = ""  # killed | timeout | survived | error
    seconds: float = 0.0
    killer: str = ""
    stage: int = -1  # the stage that killed it
    before_outcome: str = ""  # set by resolve_before
    source: str = ""  # the mutated line, as written
    occurrence: int = 1  # the n-th mutant with this module, function, line text and edit
    fast_first: bool = False  # run with --fast-first (two stages)

    @property
    def key(self) -> str:
        """Names the mutant across runs and edits elsewhere in the file (not by line number)."""
        n = f" #{self.occurrence}" if self.occurrence > 1 else ""
        return f"{self.module}:{self.function}: {self.source} :: {self.before} → {self.after}{n}"


def _docstring_nodes(tree) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                ids.add(id(body[0]))
    return ids


def _replacements(node, parents, bound) -> list[tuple[str, ast.AST]]:
    """(operator, replacement node) pairs for one node; the replacement may be a new node or a
    mutated copy."""
    out = []
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        out.append(("arith", ast.BinOp(node.left, _BINOP_SWAP[type(node.op)](), node.right)))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
        out.append(("arith", ast.AugAssign(node.target, _BINOP_SWAP[type(node.op)](), node.value)))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                ops = list(node.ops)
                ops[i] = _CMP_SWAP[type(op)]()
                out.append(("compare", ast.Compare(node.left, ops, node.comparators)))
    elif isinstance(node, ast.BoolOp):
        out.append(("boolean", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        c = node.operand
        if isinstance(node.op, ast.USub) and isinstance(c, ast.Constant):
            if isinstance(c.value, int) and not isinstance(c.value, bool):  # −n (axis=-1): −n ± 1
                out += [("constant", ast.Constant(-c.value + 1)), ("constant", ast.Constant(-c.value - 1))]
            elif isinstance(c.value, float):
                out.append(("constant", ast.Constant(-1.1 * c.value)))
        else:
            out.append(("unary", node.operand))
    elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)) and node.value is not None:
        v = node.value
        parent = parents.get(id(node))
        negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
        if isinstance(v, bool):
            out.append(("constant", ast.Constant(not v)))
        elif isinstance(v, int) and not negated:
            out += [("constant", ast.Constant(v + 1)), ("constant", ast.Constant(v - 1))]
        elif isinstance(v, float) and not negated:
            out.append(("constant", ast.Constant(1.0 if v == 0 else v * 1.1)))
    elif isinstance(node, ast.Slice):
        for side in ("lower", "upper"):
            b = getattr(node, side)
            if b is None:
                continue
            for op in (ast.Add(), ast.Sub()):
                s = copy.copy(node)
                setattr(s, side, ast.BinOp(b, op, ast.Constant(1)))
                out.append(("slice", s))
            s = copy.copy(node)
            setattr(s, side, None)
            out.append(("slice", s))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            c = copy.copy(node)
            c.func = ast.Name("max" if node.func.id == "min" else "min", ast.Load())
            out.append(("call", c))
        if (len(node.args) >= 2 and not any(isinstance(a, (ast.Starred, ast.Constant)) for a in node.args[:2])
                and ast.dump(node.args[0]) != ast.dump(node.args[1])):  # reshape(d, d) swapped is itself
            c = copy.copy(node)
            c.args = [node.args[1], node.args[0], *node.args[2:]]
            out.append(("swap args", c))
    if isinstance(node, ast.stmt) and _deletable(node, bound):
        out.append(("delete", ast.Pass()))
    return out


def _deletable(node, bound) -> bool:
    if isinstance(node, (ast.Expr, ast.AugAssign, ast.Raise, ast.If, ast.For)):
        return True
    if isinstance(node, ast.Assign):
        t = node.targets[0]
        if isinstance(t, (ast.Subscript, ast.Attribute)):
            return True
        return isinstance(t, ast.Name) and t.id in bound
    return False


def _skipped_ids(tree) -> set[int]:
    """Nodes never mutated: docstrings, strings, imports, annotations, f-strings, __repr__."""
    skip = set()

    def all_under(n):
        for m in ast.walk(n):
            skip.add(id(m))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.JoinedStr)):
            all_under(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in ("__repr__",):
                all_under(node)
            for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                if a.annotation is not None:
                    all_under(a.annotation)
            if node.returns is not None:
                all_under(node.returns)
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                all_under(d)  # defaults: mutating them mostly changes the API, not the numbers
        elif isinstance(node, ast.AnnAssign):
            all_under(node.annotation)
    for d in _docstring_nodes(tree):
        skip.add(d)
    return skip


class _Locator(ast.NodeVisitor):
    """For every node: its parent, its enclosing function, and the names bound before it there."""

    def __init__(self):
        self.parents, self.function, self.bound = {}, {}, {}
        self._stack = ["<module>"]
        self._bound = [set()]

    def generic_visit(self, node):
        for child in ast.iter_child_nodes(node):
            self.parents[id(child)] = node
        self.function[id(node)] = self._stack[-1]
        self.bound[id(node)] = set(self._bound[-1])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._stack.append(node.name if self._stack[-1] == "<module>" else f"{self._stack[-1]}.{node.name}")
            self._bound.append({a.arg for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]})
            super().generic_visit(node)
            self._stack.pop()
            self._bound.pop()
            return
        super().generic_visit(node)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self._bound[-1].add(n.id)


def make_mutants(module: str, source: str) -> list[tuple[Mutant, str]]:
    """Every mutant of ``source`` as (Mutant, mutated source)."""
    tree = ast.parse(source)
    locator = _Locator()
    locator.visit(tree)
    skip = _skipped_ids(tree)
    lines = source.splitlines()
    mutants = []
    for node in list(ast.walk(tree)):
        if id(node) in skip or not hasattr(node, "lineno"):
            if not isinstance(node, ast.Slice) or id(node) in skip:
                continue
        function = locator.function.get(id(node), "<module>")
        for operator, replacement in _replacements(node, locator.parents, locator.bound.get(id(node), set())):
            parent = locator.parents.get(id(node))
            if parent is None:
                continue
            mutated = _replace(tree, parent, node, replacement)
            if mutated is None:
                continue
            try:
                new_source = ast.unparse(mutated)
                compile(new_source, module, "exec")
            except (SyntaxError, ValueError):
                continue
            line = getattr(node, "lineno", getattr(parent, "lineno", 0))
            before = ast.unparse(node) if not isinstance(node, ast.stmt) else lines[line - 1].strip()
            after = "pass" if operator == "delete" else ast.unparse(replacement)
            if isinstance(node, ast.Slice):
                before, after = f"[{before}]", f"[{after}]"
            unit = BACKWARD_UNIT if function.split(".")[0].endswith("_backward") else module
            m = Mutant(module, unit, function, line, operator, before[:120], after[:120],
                       source=lines[line - 1].split("  #")[0].strip() if line else "")
            # the n-th with this key text, in the order made (a line with four -1s: 1, 2, 3, 4)
            m.occurrence = 1 + sum((o.function, o.source, o.before, o.after) == (m.function, m.source, m.before, m.after)
                                   for o, _ in mutants)
            mutants.append((m, new_source))
    return mutants


def _replace(tree, parent, node, replacement):
    """A deep copy of ``tree`` with ``node`` (a child of ``parent``) replaced."""
    for field, value in ast.iter_fields(parent):
        if value is node:
            setattr(parent, field, replacement)
            try:
                return ast.fix_missing_locations(copy.deepcopy(tree))
            finally:
                setattr(parent, field, node)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is node:
                    value[i] = replacement
                    try:
                        return ast.fix_missing_locations(copy.deepcopy(tree))
                    finally:
                        value[i] = node
    return None


# ---- running them -----------------------------------------------------------------------------


def _copy_tree(dest: Path, rev: str | None) -> Path:
    """The checkout's files (tracked and untracked, not ignored), or those of commit ``rev``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if rev:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    else:
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
        for f in files:
            src = ROOT / f
            if src.is_file():
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / f)
    (dest / "_mutation_profile.py").write_text(_PLUGIN)
    return dest


#: A pytest plugin written into each tree copy: Hypothesis without shrinking or its example
#: database. A killed mutant only has to fail, not fail minimally, and shrinking a failure of the
#: peer tests takes minutes.
_PLUGIN = '''
from hypothesis import Phase, settings
settings.register_profile("mutation", phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)
settings.load_profile("mutation")
'''


#: The real GPT-2 tokenizer files the tests read (tests/tl_port.py, tests/core/test_tokenizer.py): the
#: tests find them beside the repository, which a tree copy in --workdir is not, so they are named.
GPT2_TOKENIZER = ROOT.parent / "shared" / "gpt2"


def test_env(tree: Path) -> dict[str, str]:
    """The environment of a test run in a tree copy: that tree's refgpt, and GPT-2's tokenizer files
    (without them the tokenizer's tests against real GPT-2 and tiktoken would skip, not judge)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    if GPT2_TOKENIZER.is_dir():
        env.setdefault("REFGPT_GPT2_TOKENIZER", str(GPT2_TOKENIZER))
    return env


def _pytest(tree: Path, stages: list[list[str]], timeouts: list[float]) -> tuple[str, float, str, int]:
    """Run the stages in order; (outcome, seconds, the first failing test, its stage)."""
    env = test_env(tree)
    t0 = time.monotonic()
    for index, (tests, timeout) in enumerate(zip(stages, timeouts)):
        tests = [t for t in tests if (tree / t).exists()]
        if not tests:
            continue
        cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", "-p", "_mutation_profile", *tests]
        try:
            r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - t0, tests[0], index
        if r.returncode in (1, 2):  # test failures / collection errors (a mutant that breaks import)
            failed = [l.split(" ")[1] for l in r.stdout.splitlines() if l.startswith(("FAILED ", "ERROR "))]
            return "killed", time.monotonic() - t0, (failed[0] if failed else f"exit {r.returncode}"), index
        if r.returncode < 0:  # killed by a signal: the kernel's OOM killer ends a mutant that loops while allocating
            return "killed", time.monotonic() - t0, f"signal {-r.returncode} ({tests[0]})", index
        if r.returncode != 0:
            return "error", time.monotonic() - t0, r.stdout[-500:] + r.stderr[-500:], index
    return "survived", time.monotonic() - t0, "", -1


_BASELINES: dict[tuple[str, ...], float] = {}


def _baseline(tree, stages) -> list[float]:
    """Each stage's time unmutated (which must pass), measured once per stage."""
    seconds = []
    for stage in stages:
        if tuple(stage) not in _BASELINES:
            outcome, t, _, _ = _pytest(tree, [stage], [3600])
            if outcome != "survived":
                raise SystemExit(f"the unmutated tests {stage} do not pass ({outcome}); fix them first")
            _BASELINES[tuple(stage)] = t
        seconds.append(_BASELINES[tuple(stage)])
    return seconds


def run(modules, jobs, workdir: Path, only: dict[str, str] | None, timeout_factor: float, rev: str | None = None,
        skip_backward: bool = False, resolve_before: bool = True, sample: int = 1, progress=None,
        two_stages: bool = False, offset: int = 0, fixed_timeout: float | None = None,
        measured: frozenset = frozenset()):
    trees = [_copy_tree(workdir / f"tree{j}", rev) for j in range(jobs)]
    results: list[Mutant] = []
    for module in modules:
        path = module_path(module)
        source = (trees[0] / path).read_text()
        mutants = make_mutants(module, source)
        if only is not None:  # key → its outcome before issue 13's tests, from the earlier run
            mutants = [(m, s) for m, s in mutants if m.key in only]
            for m, _ in mutants:
                m.before_outcome = only[m.key]
        if skip_backward:
            mutants = [(m, s) for m, s in mutants if m.unit != BACKWARD_UNIT]
        if sample > 1:
            mutants = mutants[offset::sample]
        mutants = [(m, s) for m, s in mutants if m.key not in measured]
        stages = {unit: (_BACKWARD_TESTS if unit == BACKWARD_UNIT else MODULES[module])
                  for unit in {m.unit for m, _ in mutants}}
        if two_stages:
            stages = {unit: fast_first(st) for unit, st in stages.items()}
        if fixed_timeout:  # the unmutated tests are known to pass (e.g. the second chunk of a module): no baseline run
            timeouts = {unit: [fixed_timeout] * len(st) for unit, st in stages.items()}
        else:
            timeouts = {unit: [timeout_factor * t + 30 for t in _baseline(trees[0], st)] for unit, st in stages.items()}
        print(f"{module}: {len(mutants)} mutants; unmutated tests {timeouts}", flush=True)
        free = list(trees)

        def one(item):
            mutant, new_source = item
            tree = free.pop()
            try:
                (tree / path).write_text(new_source)
                mutant.fast_first = two_stages
                mutant.outcome, mutant.seconds, mutant.killer, mutant.stage = _pytest(
                    tree, stages[mutant.unit], timeouts[mutant.unit])
                if resolve_before and not mutant.before_outcome and before(mutant, stages[mutant.unit]) == "unknown":
                    k = mutant.stage + 1  # the older tests that did not run: they alone, now
                    old = [[t for t in st if t not in NEW] for st in stages[mutant.unit][k:]]
                    outcome, _, _, _ = _pytest(tree, old, timeouts[mutant.unit][k:])
                    mutant.before_outcome = "killed" if outcome in ("killed", "timeout") else "survived"
            finally:
                (tree / path).write_text(source)
                free.append(tree)
            return mutant

        with ThreadPoolExecutor(jobs) as pool:
            for i, m in enumerate(as_completed(pool.submit(one, item) for item in mutants)):
                m = m.result()
                results.append(m)
                if progress:  # the report as it stands after every mutant: a run cut short keeps what it measured
                    progress(sorted(results, key=lambda r: (r.module, r.line)))
                if m.outcome not in ("killed", "timeout"):
                    print(f"  [{i + 1}/{len(mutants)}] {m.outcome} {m.function} L{m.line} {m.operator}: "
                          f"{m.before} → {m.after}", flush=True)
        results.sort(key=lambda m: (m.module, m.line, m.occurrence))  # _load numbers them in this order
        if progress:
            progress(results)
        print(f"{module}: done", flush=True)
    return results


# ---- local verdicts of the forward's mutants (--local) ---------------------------------------

LOCAL_MODULES = ("attention", "layernorm", "mlp", "activations", "linear", "model")
LOCAL_SECTION = "## Local verdicts of the forward's mutants"
#: The model each mutant runs (its weights N(0, 0.3²) from seed 0, 2 × 24 tokens): two layers, so every
#: op of a block is read by a later one.
_LOCAL_CFG = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_mlp": 256, "d_vocab": 97, "n_ctx": 32}
#: Run by its own interpreter in the tree copy: that tree's (mutated) refgpt's forward, dumped as a port's.
_FORWARD = """
import json, sys
import numpy as np
from refgpt import Config, Model
case = np.load("_mutation_case.npz")
params = {k[len("param."):]: case[k] for k in case.files if k.startswith("param.")}
logits, cache = Model(Config(**json.loads(str(case["cfg"]))), params, dtype=sys.argv[2]).run_with_cache(case["tokens"])
np.savez(sys.argv[1], logits=logits, **cache.cache_dict)
"""


@dataclass
class LocalResult:
    module: str
    function: str
    line: int
    source: str
    edit: str
    outcome: str = ""  # named | named elsewhere | within bounds | not dumped | unchanged | error
    changed: str = ""  # the first tensor, in the forward's order, that differs from the unmutated forward's
    first: str = ""  # the first local flag (op at tensor), or the error
    ratio: float = 0.0


def _local_forward(tree: Path, out: Path, dtype: str, timeout: float = 300):
    """The tree's refgpt's forward of the case, its activations by name; or, if it fails, why (one line)."""
    import numpy as np
    try:
        r = subprocess.run(["nice", "-n", "10", sys.executable, "_mutation_forward.py", str(out), dtype], cwd=tree,
                           env=test_env(tree), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout ({timeout:.0f} s)"
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def _judge_mutant(m: Mutant, acts, reference, order, case, dtype) -> LocalResult:
    import numpy as np
    from refgpt.oracle import local
    r = LocalResult(m.module, m.function, m.line, m.source, "delete" if m.operator == "delete" else f"{m.before} → {m.after}")
    if isinstance(acts, str):
        r.outcome, r.first = "error", acts[:160]
        return r
    r.changed = next((n for n in order if n not in acts or not np.array_equal(acts[n], reference[n])), "")
    if not r.changed or r.changed not in acts:
        r.outcome = "not dumped" if r.changed else "unchanged"
        return r
    try:
        first = local.judge(*case, acts, dtype).first
    except Exception as error:  # a dump the judge cannot read (a shape changed): noticed, not localized
        r.outcome, r.first = "error", f"judge: {type(error).__name__}: {error}"[:160]
        return r
    if first is None:
        r.outcome = "within bounds"
    else:
        r.first, r.ratio = f"{first.op} at {first.name}", first.ratio
        r.outcome = "named" if first.name == r.changed else "named elsewhere"
    return r


def run_local(modules, workdir: Path, sample: int = 1, offset: int = 0, dtype: str = "float64",
              rev: str | None = None) -> list[LocalResult]:
    """Every ``sample``-th forward mutant of ``modules`` run as a port and judged locally (module docstring)."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "tests"))
    from random_models import random_params
    from refgpt import Config
    from refgpt.oracle import local
    tree = _copy_tree(workdir / "local", rev)
    cfg = Config(**_LOCAL_CFG)
    params = random_params(cfg, seed=0, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (2, 24))  # [batch, pos]
    np.savez(tree / "_mutation_case.npz", cfg=json.dumps(_LOCAL_CFG), tokens=tokens,
             **{f"param.{k}": v for k, v in params.items()})
    (tree / "_mutation_forward.py").write_text(_FORWARD)
    reference = _local_forward(tree, workdir / "unmutated.npz", dtype)
    if isinstance(reference, str):
        raise SystemExit(f"the unmutated forward fails: {reference}")
    report = local.judge(params, cfg, tokens, reference, dtype)
    if report.first is not None:
        raise SystemExit("the unmutated forward is flagged locally:\n" + local.format_local(report))
    order = [v.name for v in report.ops]
    results = []
    for module in modules:
        path = module_path(module)
        source = (tree / path).read_text()
        mutants = [(m, s) for m, s in make_mutants(module, source) if m.unit != BACKWARD_UNIT][offset::sample]
        print(f"{module}: {len(mutants)} mutants, each judged locally", flush=True)
        for i, (m, new_source) in enumerate(mutants):
            (tree / path).write_text(new_source)
            try:
                acts = _local_forward(tree, workdir / "mutant.npz", dtype)
            finally:
                (tree / path).write_text(source)
            results.append(_judge_mutant(m, acts, reference, order, (params, cfg, tokens), dtype))
            r = results[-1]
            print(f"  [{i + 1}/{len(mutants)}] {r.outcome}: {module}.py:{r.line} {r.edit} (changed {r.changed or '–'}; "
                  f"{r.first or 'no flag'})", flush=True)
    return results


def local_section(results: list[LocalResult], note: str) -> str:
    """MUTATION.md's section of a --local run."""
    outcomes = ("named", "named elsewhere", "within bounds", "not dumped", "unchanged", "error")
    lines = [LOCAL_SECTION, "", note, "", "| module | mutants | " + " | ".join(outcomes) + " |",
             "|---|---:|" + "---:|" * len(outcomes)]
    for module in sorted({r.module for r in results}):
        mine = [r for r in results if r.module == module]
        lines.append(f"| {module} | {len(mine)} | " + " | ".join(str(sum(r.outcome == o for r in mine)) for o in outcomes)
                     + " |")
    lines += ["", "Each mutant that changed numbers and was not named at the op it changed:", ""]
    for r in results:
        if r.outcome in ("named elsewhere", "within bounds"):
            flag = f"first flag {r.first} ({r.ratio:.3g}× its bound)" if r.first else "no flag"
            lines.append(f"- `{r.module}.py:{r.line}` `{r.source}`: {r.edit} — changed `{r.changed}`; {flag}")
    return "\n".join(lines) + "\n"


def split_local(md: Path) -> tuple[str, str]:
    """MUTATION.md as (the report, the --local section after it, or "")."""
    text = md.read_text() if md.exists() else ""
    at = text.find(LOCAL_SECTION)
    return (text, "") if at < 0 else (text[:at].rstrip("\n") + "\n", text[at:])


def write_local_section(md: Path, section: str):
    """``section`` as MUTATION.md's last section, in place of the one there."""
    md.write_text(split_local(md)[0] + "\n" + section)


# ---- the report -------------------------------------------------------------------------------

#: Reviewed survivors that compute the same numbers, key (Mutant.key) → reason.
_SCALE = "layernorm:centered_scale: e = np.clip(e, 0, np.finfo(dtype).maxexp - 2) :: "
_PEAK = ("layernorm:centered_scale: peak = np.maximum(centered.max(axis=-1, keepdims=True), "
         "-centered.min(axis=-1, keepdims=True)) :: ")
_SEEN = "attention:attend_in_blocks: seen = start + min(i + rows, pos) :: "
_POWERS = ("σ is computed as √(mean (c·2⁻ᵉ)² + ε·2⁻²ᵉ) · 2ᵉ, and scaling by a power of two commutes with "
           "rounding (no overflow, no underflow of what matters): any e that keeps (c·2⁻ᵉ)² finite gives "
           "the same bits")
_GELU_ROWS = "activations:gelu_new: rows_in, rows_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]) "
EQUIVALENT: dict[str, str] = {
    "attention:causal_bias: @functools.lru_cache(maxsize=8) :: 8 → 9":
        "the size of the cache of masks: which masks are remembered, not their values",
    "attention:causal_bias: @functools.lru_cache(maxsize=8) :: 8 → 7":
        "the size of the cache of masks: which masks are remembered, not their values",
    _SEEN + "min(i + rows, pos) → max(i + rows, pos)":
        "every block then reads all keys and the causal mask zeroes the extra ones exactly (exp(−∞) = 0): "
        "the same function with more work, sums over more exact zeros (rounding only)",
    _SEEN + "min(i + rows, pos) → min(pos, i + rows)": "min is symmetric",
    "attention:attend: blocks = [(i, start + min(i + rows, pos)) for i in range(0, pos, rows)] :: "
    "min(i + rows, pos) → min(pos, i + rows)": "min is symmetric",
    "attention:block_probabilities: return (padded_softmax if padded else softmax)(scores, in_place=True) :: "
    "True → False": "softmax into a new array instead of the block's own scores (every caller passes a block "
                    "nobody else holds: attend copies it into the cached scores first): the same numbers",
    "attention:attend_in_blocks: zh[:, :, i:i + rows] = softmax(scores, in_place=True) @ vh[:, :, :seen] :: True → False":
        "softmax into a new array instead of the block's own scores buffer: the same numbers",
    _PEAK + "np.maximum(centered.max(axis=-1, keepdims=True), -centered.min(axis=-1, keepdims=True)) → "
            "np.maximum(-centered.min(axis=-1, keepdims=True), centered.max(axis=-1, keepdims=True))":
        "np.maximum is symmetric",
    _PEAK + "-centered.min(axis=-1, keepdims=True) → centered.min(axis=-1, keepdims=True)":
        "peak becomes max c instead of max |c|; a centered row has max c ≥ |min c|/(n − 1), so the "
        "power of two is at most ~n too small, (c·2⁻ᵉ)² < n² stays finite, and " + _POWERS,
    _SCALE + "0 → 1":
        "an extra factor 2 of scaling down for small rows: " + _POWERS + "; only (c/2)² below 2⁻¹⁰²² "
        "could differ, and there ε·2⁻² dominates it unless ε = 0 (where the original loses σ to underflow too)",
    _SCALE + "0 → -1":
        "scaling up by at most 2 for small rows: " + _POWERS,
    _SCALE + "np.finfo(dtype).maxexp - 2 → np.finfo(dtype).maxexp + 2":
        "matters only for max|c| ≥ 2^(maxexp − 3); 2⁻ᵉ is then subnormal but exact, c·2⁻ᵉ is normal, "
        "ε·2⁻²ᵉ underflows to 0 where ε ≪ var anyway, and σ·2ᵉ is representable: the same bits",
    _SCALE + "2 → 3": "the same clip one power of two lower (see maxexp − 2 → maxexp + 2): " + _POWERS,
    _SCALE + "2 → 1": "the same clip one power of two higher (see maxexp − 2 → maxexp + 2)",
    "checkpoint:hf_tensors: [p[tl + f\"attn.W_{x}\"].transpose(1, 0, 2).reshape(d, d) for x in \"QKV\"], axis=1) :: "
    "p[tl + f'attn.W_{x}'].transpose(1, 0, 2).reshape(d, d) → p[tl + f'attn.W_{x}'].transpose(1, 0, 2).reshape(d, d)":
        "reshape(d, d) with its two (equal) arguments swapped is the same code (the mutator no longer makes it)",
    **{f"activations:<module>: _INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi) :: {edit}":
       "not in the forward: only gelu_backward reads 1/√(2π) (a module constant, so --skip-backward does not "
       "see it as backward); tests/core/test_backward.py::test_activation_derivatives_match_central_differences "
       "kills it (checked by hand for / → *)"
       for edit in ("1.0 / math.sqrt(2.0 * math.pi) → 1.0 * math.sqrt(2.0 * math.pi)", "1.0 → 1.1",
                    "2.0 * math.pi → 2.0 / math.pi", "2.0 → 2.2")},
    "activations:sigmoid: return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)) :: x >= 0 → x > 0":
        "at x = 0 both branches give 1/(1 + 1) = ½ exactly (e = e⁰ = 1): the same numbers",
    "activations:_gelu_new_into: np.multiply(x, x, out=t) :: np.multiply(x, x, out=t) → np.multiply(x, x, out=t)":
        "multiply(x, x) with its two (equal) arguments swapped is the same code (the mutator no longer makes it)",
    "activations:gelu_new: for i in range(0, len(rows_in), 64): :: 64 → 63":
        "blocks of 64 rows every 63 rows: every row is still covered, and the rows where two blocks overlap "
        "are computed a second time from the same input row into the same output row (out is a new array, "
        "never x; every step of _gelu_new_into is an elementwise ufunc, each result element from its own "
        "input element alone): the same values written again. Checked bit for bit, float32 and float64, "
        "1–300 rows × 1–3072 columns",
    **{_GELU_ROWS + f":: -1 → -2{n}":
       "reshape(-2, d) of x or of out (the first two of the line's four -1s, as make_mutants numbers them; "
       "the other two, x.shape[-1] → x.shape[-2], give rows_in and rows_out different shapes and fail): "
       "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array"
       for n in ("", " #2")},
    'checkpoint:_shown: return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)" :: '
    'len(text) <= limit → len(text) < limit':
        "an error text: a path of exactly 120 characters is shown whole either way, the mutant adds "
        "'… (120 characters)'; the error raised, and every number, are the same",
    "model:_bytes_held: buffers[start] = max(buffers.get(start, 0), array.nbytes) :: 0 → 1":
        "max(1, nbytes) differs from max(0, nbytes) only for an empty array, which no valid parameter is "
        "(every Config size is ≥ 1); Model refuses such params by their shape right after (or, if MemAvailable "
        "is within a byte of the need, by the memory check): the same inputs accepted, the same numbers",
    'model:_flatten_block: attn["W_O"] = p[b + "attn.W_O"].reshape(-1, d) :: -1 → -2':
        "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array",
    'config:from_hf: raise RefGPTError(str(error).replace("config:", f"{source}:", 1)) from None :: 1 → 2':
        "an error text: every Config message starts with the one 'config:' that is replaced",
    # ---- the extension: backward, decomposition, analysis.attribution, tokenizer, safetensors_file ----
    "backward:<module>: tied: bool = field(default=False) :: False → True":
        "the default is never read: Gradients are made in one place, backward(), which passes tied",
    "backward:backward: tied = bool(cfg.tie_word_embeddings and np.shares_memory(p[\"unembed.W_U\"], p[\"embed.W_E\"])) :: "
    "np.shares_memory(p['unembed.W_U'], p['embed.W_E']) → np.shares_memory(p['embed.W_E'], p['unembed.W_U'])":
        "np.shares_memory is symmetric",
    **{key: "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array"
       for key in ("backward:rows: return a.reshape(-1, a.shape[-1]) :: -1 → -2",
                   "analysis.attribution:attribute: g = (u @ W_O.reshape(-1, W_O.shape[-1]).T).reshape(z.shape) :: -1 → -2",
                   "backward:backward: np.add.at(g_W_E, tokens.reshape(-1), rows(g_embed)) :: -1 → -2")},
    "tokenizer:__init__: super().__init__(message) :: super().__init__(message) → pass":
        "_EntryError(message, …): BaseException.__new__ already keeps the positional arguments (args) that "
        "str() shows, and RefGPTError/ValueError define no __init__ of their own: the same message",
    "decomposition:get_full_resid_decomposition: if layer > 0: :: 0 → -1":
        "at layer 0 the branch adds an empty stack [0, batch, pos, width] (_neuron_stack and decompose_resid "
        "return _empty for layer 0) and no labels; its dtype is the model's, which every other part already "
        "has or exceeds (heads, embeddings and bias rows are in the model's dtype, or promoted by the "
        "projection): concatenating it changes no value, shape or dtype",
    "decomposition:head_results: return (z[..., None, :] @ W_O)[..., 0, :] :: 0 → -1":
        "index −1 of an axis of length 1 (z[..., None, :] @ W_O has one row per head) is index 0",
    "decomposition:token_id: return int(ids.reshape(-1)[0]) :: 0 → -1":
        "reached only when ids.size == 1 (the line before refuses any other size): the last element is the first",
    "decomposition:token_id: return ids[0] :: 0 → -1":
        "reached only when len(ids) == 1 (the line before refuses any other length): ids[-1] is ids[0]",
    "decomposition:token_id: return int(ids.reshape(-1)[0]) :: -1 → -2":
        "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array",
    **{key: ("const(b, v) with its arguments swapped: for a vector v both compute np.full(shape, b @ v) or "
             "np.full(shape, v @ b), a dot product of two vectors (the same products, summed by the same BLAS "
             "kernel in an order set by the length alone: equal bit for bit, checked for lengths 1–1600, both "
             "dtypes, unaligned starts); for v [batch, pos, d_model] the mutant's np.full(shape, v @ b) is the "
             "original's v @ b, in the same dtype")
       for key in ("analysis.attribution:attribute: constants, names = [const(p[\"ln_final.b\"], direction)], [\"ln_final.b\"] :: "
                   "const(p['ln_final.b'], direction) → const(direction, p['ln_final.b'])",
                   "analysis.attribution:attribute: b_O, b_out = const(p[blk + \"attn.b_O\"], u)[None], const(p[blk + \"mlp.b_out\"], u)[None] :: "
                   "const(p[blk + 'attn.b_O'], u) → const(u, p[blk + 'attn.b_O'])",
                   "analysis.attribution:attribute: b_O, b_out = const(p[blk + \"attn.b_O\"], u)[None], const(p[blk + \"mlp.b_out\"], u)[None] :: "
                   "const(p[blk + 'mlp.b_out'], u) → const(u, p[blk + 'mlp.b_out'])")},
    "safetensors_file:release: self._map.madvise(mmap.MADV_DONTNEED, first, end - first) :: end - first → end + first":
        "mmap.madvise clips a length past the end of the map to the map's end: the tensor's pages are dropped, "
        "and so are the later tensors' (each read again from the file when touched): the same bytes, more I/O",
    'safetensors_file:_diagnose: what = "overlaps the tensor before it" if begin < covered else f"leaves a hole at byte '
    '{covered}" :: begin < covered → begin <= covered':
        "inside `if begin != covered`: there begin <= covered is begin < covered",
    'safetensors_file:header_bytes: dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else '
    'np.dtype(dtype) :: np.dtype(dtype).itemsize > 1 → np.dtype(dtype).itemsize >= 1':
        "a one-byte dtype has no byte order ('|'): newbyteorder('<') returns an equal dtype (u1, i1, bool)",
    **{key: "a dimension above 2⁶³ − 1 in a file the reference accepted means no elements (else the file would "
            "hold ≥ 2⁶³ bytes), so without this check np.empty is reached with count 0 and refuses the shape "
            "with ValueError ('Maximum allowed dimension exceeded'), raised as the same too_large error"
       for key in ("safetensors_file:raw: if any(d > np.iinfo(np.intp).max for d in shape): :: "
                   "if any(d > np.iinfo(np.intp).max for d in shape): → pass",
                   "safetensors_file:raw: raise too_large :: raise too_large → pass")},
    'safetensors_file:header_bytes: text += b" " * max(0, length - 8 - len(text)) :: 0 → -1':
        "b' ' * n is b'' for every n <= 0: max(-1, x) and max(0, x) pad the same",
    "safetensors_file:__init__: self._file.truncate(offset) :: self._file.truncate(offset) → pass":
        "sizes the file early only: close() succeeds only once every tensor is written, and the tensors tile "
        "[header, offset) exactly, so the writes alone fill every byte up to offset: the same file",
    'safetensors_file:write: self._file.write(memoryview(data.reshape(-1)).cast("B")) :: -1 → -2':
        "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array",
    "safetensors_file:float_tensor: if not DTYPES.get(code, (None, False))[1]: :: False → True":
        "the default is read only for codes refgpt does not know (F8_E4M3, …); the file is refused either way "
        "with a RefGPTError naming the tensor and its code, from raw() ('which refgpt does not read') "
        "instead of here ('expected a float tensor'): an error text",
    # ---- the forward pass: model and attention (issue 13's second pass over their survivors) ----
    **{f"attention:per_head_affine: d_model = W.shape[0] :: {edit}":
       "W is W_Q, W_K or W_V [d_model, head·d_head], and Config refuses n_heads not dividing d_model and sets "
       "d_head = d_model // n_heads: head·d_head = d_model, so W.shape[1] (= W.shape[-1]) is W.shape[0]"
       for edit in ("0 → 1", "0 → -1")},
    **{f"model:_flatten_block: n = W[0].shape[-1] :: {edit}":
       "W[0], W[1], W[2] are W_Q, W_K, W_V flattened, each [d_model, head·d_head] = [d, d] (Config: d_head = "
       "d_model // n_heads, n_heads divides d_model): every axis of every one of them has length d"
       for edit in ("-1 → 0", "-1 → -2", "0 → 1", "0 → -1")},
    "model:_flatten_block: W = [p[b + f\"attn.W_{x}\"].transpose(1, 0, 2).reshape(d, -1) for x in \"QKV\"] :: "
    "p[b + f'attn.W_{x}'].transpose(1, 0, 2).reshape(d, -1) → p[b + f'attn.W_{x}'].transpose(1, 0, 2).reshape(-1, d)":
        "the array has d·head·d_head = d·d elements (head·d_head = d_model): reshape(-1, d) and reshape(d, -1) "
        "are both [d, d], in the same C order: the same array",
    'model:_flatten_block: attn["W_O"] = p[b + "attn.W_O"].reshape(-1, d) :: '
    "p[b + 'attn.W_O'].reshape(-1, d) → p[b + 'attn.W_O'].reshape(d, -1)":
        "W_O [head, d_head, d_model] has d·d elements (head·d_head = d_model): reshape(d, -1) and reshape(-1, d) "
        "are both [d, d], in the same C order: the same array",
    **{key: "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array"
       for key in ('model:_flatten_block: W = [p[b + f"attn.W_{x}"].transpose(1, 0, 2).reshape(d, -1) for x in "QKV"] :: -1 → -2',
                   "model:check_tokens: array = array.reshape(-1, array.shape[-1]).astype(np.int64, copy=False) :: -1 → -2",
                   'attention:attention: return affine(z.reshape(batch, pos, -1), w["W_O"], w["b_O"]) :: -1 → -2',
                   'attention:per_head_affine: return np.einsum("bphd,dhe->bphe", x, W.reshape(d_model, n_heads, -1)) + '
                   'b.reshape(n_heads, -1) :: -1 → -2',
                   'attention:per_head_affine: return np.einsum("bphd,dhe->bphe", x, W.reshape(d_model, n_heads, -1)) + '
                   'b.reshape(n_heads, -1) :: -1 → -2 #2')},
    **{"model:side_by_side: and byte_bounds(root)[0] <= byte_bounds(first)[0] and byte_bounds(last)[1] <= "
       f"byte_bounds(root)[1]) :: {edit} #2":
       "root is the end of first's .base chain, so first lies inside root's memory: root's start is at or before "
       "first's start, hence before its end ([-1] is [1]): the comparison is true either way"
       for edit in ("0 → 1", "0 → -1")},
    # Reviewed at the end of the session (17:20): the last chunks' survivors.
    'attention:attention: W_O = w["W_O"].reshape(n_heads, -1, w["W_O"].shape[-1]) :: -1 → -2 #2':
        "W_O is [head·d_head, d_model] and Config requires head·d_head = d_model: shape[-2] = shape[-1]",
    'model:_flatten_block: bias = [p[b + f"attn.b_{x}"].reshape(-1) for x in "QKV"] :: -1 → -2':
        "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array",
    # Reviewed in the fourth round.
    'attention:fused_qkv: if "W_QKV" in w: :: if "W_QKV" in w: → pass':
        "the model's block weights hold W_QKV and W_Q, W_K, W_V as views of its column blocks (b_* of b_QKV; "
        "model.py _flatten_block), so joining the parts makes a copy of W_QKV: the same numbers, one copy more",
    **{key: "NumPy (2.4) reads any negative size in reshape as the one inferred dimension: the same array"
       for key in ("attention:attention: qkv = affine(x, *fused_qkv(w)).reshape(batch, pos, 3, n_heads, -1) :: -1 → -2",
                   'attention:attention: W_O = w["W_O"].reshape(n_heads, -1, w["W_O"].shape[-1]) :: -1 → -2')},
    'attention:attention: W_O = w["W_O"].reshape(n_heads, -1, w["W_O"].shape[-1]) :: -1 → 0 #2':
        "W_O is [head·d_head, d_model] and Config requires head·d_head = d_model: shape[0] = shape[-1]",
    "attention:block_scores: diagonal = max(0, seen - rows) :: 0 → 1":
        "only the first block (seen ≤ rows) changes: the causal mask is then added from key 1 on instead of "
        "key 0, and the mask's column of key 0 is all zeros (every query sees the first key): the same numbers",
    **{f"attention:attend: scores[:, :, i:i + rows, seen:] = -np.inf :: [i:i + rows] → {rows}":
       "the blocks fill the full scores in order of i, and seen grows with i: rows before the block already "
       "hold −∞ from their own seen on (≤ this seen), and rows after it are written again by their own block, "
       "values left of their seen and −∞ from it on: -∞ written into more rows ends in the same array"
       for rows in ("[:i + rows]", "[i:i + rows + 1]", "[i:]")},
    "model:_bytes_held: buffers[start] = max(buffers.get(start, 0), array.nbytes) :: "
    "max(buffers.get(start, 0), array.nbytes) → max(array.nbytes, buffers.get(start, 0))": "max is symmetric",
    "model:_bytes_held: buffers[start] = max(buffers.get(start, 0), array.nbytes) :: 0 → -1":
        "max(-1, nbytes) = max(0, nbytes) = nbytes: an array's size is never negative",
    **{key: "an unbatched input is a batch of one: logits[-1] is logits[0]"
       for key in ("model:_run: return (logits if batched else logits[0]), cache :: 0 → -1",
                   'model:_run: return (loss if return_type == "loss" else Output(logits if batched else logits[0], '
                   'loss)), cache :: 0 → -1')},
    **{f'safetensors_file:__init__: n = int.from_bytes(self._map[:8], "little") :: {edit}':
       "read after the reference (the safetensors package) accepted the file, whose header length is then at most "
       "100,000,000 < 2^56: the 8th byte is 0, and 7 bytes give the same n (a file the reference refuses is worded "
       "by _diagnose, which reads all 8: tests/core/test_safetensors_fuzz.py, \"length's top byte set\")"
       for edit in ("[:8] → [:8 - 1]", "8 → 7")},
    'safetensors_file:header_bytes: dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 '
    'else np.dtype(dtype) :: 1 → 0':
        "a one-byte dtype has no byte order: newbyteorder('<') returns the same dtype",
    'analysis.attribution:attribute: scale = need(cache, "ln_final.hook_scale", *_NEEDED_BY)[..., 0] :: 0 → -1':
        "hook_scale is [batch, pos, 1]: index -1 of a one-long axis is index 0",
    "decomposition:get_full_resid_decomposition: stack = stack[..., 0] :: 0 → -1":
        "squeezed only when project_output_onto was one vector, made [d_model, 1]: the last axis is one long",
    "decomposition:_layer: if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer "
    "<= n: :: 0 → -1": "layer = -1 has already returned n two lines above: [-1, n] and [0, n] admit the same layers here",
    "safetensors_file:close: self._partial.unlink(missing_ok=True) :: True → False":
        "close() removes NAME.partial only when tensors are missing, right after closing the file it made and "
        "held: the file exists, so missing_ok never matters (unless another process removed it meanwhile)",
    "model:check_tokens: array = array.reshape(-1, array.shape[-1]).astype(np.int64, copy=False) :: False → True":
        "a copy of the token ids instead of (for int64 input) a view: the same values, read only",
    **{f"attention:attend: visible = seen if not hooked[..., seen:].any() else keys :: [seen:] → {edit}":
       "after a pattern hook: the test also looks at keys < seen, which hold the block's probabilities (not all "
       "0), so pattern·v reads whole rows instead of the first seen keys; the rest of each row is 0 (the hook "
       "left it so, or the test would have found it): products with exact zeros added, the same function "
       "(rounding only, as for the max(i + rows, pos) mutant of attend_in_blocks)"
       for edit in ("[:]", "[seen - 1:]")},
}


def _stages_of(m):
    stages = _BACKWARD_TESTS if m.unit == BACKWARD_UNIT else MODULES[m.module]
    return fast_first(stages) if m.fast_first else stages


def score(results):
    table = {}
    for m in results:
        row = table.setdefault(m.unit if m.unit == m.module else f"{m.module} ({m.unit})",
                               {"mutants": 0, "killed": 0, "survived": 0, "equivalent": 0, "killed_before": 0,
                                "unknown_before": 0})
        row["mutants"] += 1
        b = before(m, _stages_of(m))
        row["killed_before"] += b == "killed"
        row["unknown_before"] += b == "unknown"
        if m.outcome in ("killed", "timeout"):
            row["killed"] += 1
        elif m.key in EQUIVALENT:
            row["equivalent"] += 1
        else:
            row["survived"] += 1
    return table


def _describe(m):
    edit = "delete" if m.operator == "delete" else f"{m.operator} `{m.before}` → `{m.after}`"
    return f"`{m.module}.py:{m.line}` `{m.source}`: {edit}"


def _pct(a, b):
    return f"{100 * a / b:.1f} %" if b else "–"


def write_report(results, md: Path, js: Path, note: str = ""):
    table = score(results)
    lines = ["# Mutation testing of refgpt's core", "",
             "Made by `python benchmarks/mutation.py` (operators and method: its docstring). A mutant is",
             "*killed* when its module's tests (the script's `MODULES` map) fail or time out. *Equivalent*",
             "survivors compute the same numbers (reason given below); *survived* are real gaps. The score",
             "is killed / non-equivalent mutants; *before* is the same with the tests from before issue 13",
             "(the script's `NEW` files left out).", ""]
    if note:
        lines += [note, ""]
    lines += ["| module | mutants | equivalent | killed before | score before | killed | survived (real) | score |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for unit, row in sorted(table.items()):
        real = row["mutants"] - row["equivalent"]
        unknown = f" (+{row['unknown_before']}?)" if row["unknown_before"] else ""
        lines.append(f"| {unit} | {row['mutants']} | {row['equivalent']} | {row['killed_before']}{unknown} | "
                     f"{_pct(row['killed_before'], real)} | {row['killed']} | {row['survived']} | {_pct(row['killed'], real)} |")
    lines += ["", "## Survivors", ""]
    for m in results:
        if m.outcome in ("killed", "timeout"):
            continue
        verdict = f"equivalent: {EQUIVALENT[m.key]}" if m.key in EQUIVALENT else f"**not equivalent** ({m.outcome})"
        lines.append(f"- {_describe(m)} — {verdict}")
    lines += ["", "## Killed only by the tests issue 13 added (and the core tests added since)", ""]
    for m in results:
        if m.outcome in ("killed", "timeout") and before(m, _stages_of(m)) != "killed":
            lines.append(f"- {_describe(m)} — by `{m.killer}`")
    kept = split_local(md)[1]  # a --local run's section: kept, last
    md.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    js.write_text(json.dumps({"score": table, "mutants": [asdict(m) | {"key": m.key} for m in results]},
                             indent=1, ensure_ascii=False) + "\n")


def _load(path: Path, rev: str | None = None) -> list[Mutant]:
    """A mutation.json's mutants; a missing ``source`` is filled in from the module as of commit
    ``rev`` (the one the run mutated), or as checked out."""
    mutants = [Mutant(**{k: v for k, v in m.items() if k != "key"}) for m in json.loads(path.read_text())["mutants"]]
    for m in mutants:
        if not m.source and m.line:
            text = (subprocess.run(["git", "show", f"{rev}:{module_path(m.module)}"], cwd=ROOT, capture_output=True,
                                   text=True, check=True).stdout if rev else (ROOT / module_path(m.module)).read_text())
            m.source = text.splitlines()[m.line - 1].split("  #")[0].strip()
    # Occurrences come from the JSON (make_mutants numbered them over the whole module); renumbering
    # here would be wrong for a sampled run, which holds the second of two equal edits without the first.
    return mutants


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--only-survivors", type=Path, default=None,
                    help="a previous mutation.json: rerun only its survivors, keep its killed mutants")
    ap.add_argument("--timeout-factor", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per test stage, instead of timing the unmutated tests first (they must pass)")
    ap.add_argument("--fast-first", action="store_true",
                    help="all NumPy-only tests, then all peer tests; no rerun of older tests for the 'before' score")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="earlier mutation.json files to report with this run")
    ap.add_argument("--note", default="", help="a paragraph for the report (what was measured, where)")
    ap.add_argument("--sample", type=int, default=1, help="only every n-th mutant (a quicker estimate)")
    ap.add_argument("--offset", type=int, default=0,
                    help="with --sample n: start at the k-th mutant (runs with offsets 0 … n − 1 together cover all)")
    ap.add_argument("--skip-backward", action="store_true", help="leave out the *_backward functions of forward modules")
    ap.add_argument("--skip-measured", type=Path, nargs="*", default=[],
                    help="earlier mutation.json files: leave out the mutants they hold (by key: the same edit of the "
                         "same source line), to finish a module a cut-short or sampled run began")
    ap.add_argument("--rev", default=None, help="test the tree of this commit (e.g. the tests before a change)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "MUTATION.md")
    ap.add_argument("--list", action="store_true", help="only list the mutants")
    ap.add_argument("--local", action="store_true",
                    help="run the forward modules' mutants as ports and judge them locally (no tests; module docstring)")
    ap.add_argument("--local-dtype", default="float64", choices=["float64", "float32"],
                    help="with --local: the dtype of the mutated forward (judged at that precision)")
    args = ap.parse_args(argv)
    if args.local:
        wrong = [m for m in args.modules or [] if m not in LOCAL_MODULES]
        if wrong:
            ap.error(f"--local judges the forward's modules ({', '.join(LOCAL_MODULES)}), not {', '.join(wrong)}")
        results = run_local(args.modules or list(LOCAL_MODULES), args.workdir or Path(tempfile.mkdtemp(prefix="refgpt-local-")),
                            args.sample, args.offset, args.local_dtype, args.rev)
        note = args.note + (f" Every {args.sample}-th forward mutant (--sample {args.sample} --offset {args.offset}), "
                            f"{args.local_dtype}." if args.sample > 1 else f" Every forward mutant, {args.local_dtype}.")
        write_local_section(args.out, local_section(results, note.strip()))
        return
    if args.modules is None or (not args.modules and not args.merge):
        args.modules = list(MODULES)
    if args.list:
        for module in args.modules:
            for m, _ in make_mutants(module, (ROOT / module_path(module)).read_text()):
                print(f"{m.module}:{m.line} {m.unit} {m.operator}: {m.before} → {m.after}")
        return
    only, kept = None, []
    if args.only_survivors:
        old = _load(args.only_survivors, args.rev)
        only = {m.key: before(m, _stages_of(m)) for m in old if m.outcome not in ("killed", "timeout")}
        kept = [m for m in old if m.outcome in ("killed", "timeout") or m.module not in args.modules]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="refgpt-mutation-"))
    note = args.note + (f" Every {args.sample}-th mutant only (--sample {args.sample} --offset {args.offset})."
                        if args.sample > 1 else "")

    def save(results):
        write_report(kept + results, args.out, args.out.with_suffix(".json"), note)

    for path in args.merge:
        kept += _load(path, args.rev)
    if not args.modules:
        save([])
        return
    run(args.modules, args.jobs, workdir, only, args.timeout_factor, args.rev, args.skip_backward,
        sample=args.sample, progress=save, resolve_before=not args.fast_first, two_stages=args.fast_first,
        offset=args.offset, fixed_timeout=args.timeout,
        measured=frozenset(m.key for path in args.skip_measured for m in _load(path, args.rev)))


if __name__ == "__main__":
    main()
