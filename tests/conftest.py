"""Fixtures every group of tests shares (helpers that are not fixtures live beside this file:
random_models.py, peers.py, ln_bounds.py, doc_pages.py, fake_hub.py)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import settings

from fake_hub import FakeHub, closed_port, tiny_gpt2_files

# CI (CI=true, as .ci/run is run) draws the same examples on every run, so a red CI is reproducible
# and never a coin toss; local runs keep exploring new examples and replay failures from .hypothesis/.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

TESTS = Path(__file__).resolve().parent
#: The markers of every test below a directory of tests/ (the vendored TransformerLens tests in
#: tl_torch/ stay as written, without a pytestmark of their own). tests/test_fast_lane.py reads it.
DIRECTORY_MARKS = {"tl_torch": ("peer",), "runtimes": ("peer",)}  # runtimes: torch.onnx, transformers and the runtime extras
#: The markers the fast lane (``-m fast``) leaves out; setup.cfg registers them all.
NOT_FAST = ("slow", "peer", "browser")


def _wholly_not_fast(path: Path) -> bool:
    """Whether every test of a module (or directory) carries one of NOT_FAST: by DIRECTORY_MARKS, or
    by a one-line module-level ``pytestmark`` naming one (a module written otherwise is imported and judged)."""
    if TESTS in path.parents and set(DIRECTORY_MARKS.get(path.relative_to(TESTS).parts[0], ())) & set(NOT_FAST):
        return True
    if not (path.name.startswith("test_") and path.suffix == ".py"):
        return False
    marks = re.findall(r"^pytestmark = (.*)$", path.read_text(encoding="utf-8"), re.M)
    return any(re.search(rf"\bpytest\.mark\.{mark}\b", line) for line in marks for mark in NOT_FAST)


def pytest_ignore_collect(collection_path, config):
    """With exactly ``-m fast``, modules none of whose tests are fast are not even imported (their
    tests would all be deselected): the fast lane does not pay for importing torch and TransformerLens."""
    return True if config.option.markexpr == "fast" and _wholly_not_fast(collection_path) else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Give DIRECTORY_MARKS, then ``fast`` to every test marked none of NOT_FAST."""
    for item in items:
        path = item.path.resolve()
        if TESTS in path.parents:
            for mark in DIRECTORY_MARKS.get(path.relative_to(TESTS).parts[0], ()):
                item.add_marker(getattr(pytest.mark, mark))
        if not any(item.get_closest_marker(mark) for mark in NOT_FAST):
            item.add_marker(pytest.mark.fast)


class CLIResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


class RefgptCLI:
    """The ``refgpt`` command, run the two ways tests need.

    ``refgpt_cli(*args)``: as a user runs it, ``python -m refgpt args`` in a subprocess (UTF-8 output;
    ``console_script=True`` runs the installed ``refgpt`` script instead). ``refgpt_cli.in_process(*args)``:
    through ``refgpt.cli.main`` in this process, faster, with argparse's exits caught. Both give
    (returncode, stdout, stderr); arguments may be paths or numbers.
    """

    def __call__(self, *args, console_script=False, timeout=300) -> CLIResult:
        command = [shutil.which("refgpt")] if console_script else [sys.executable, "-m", "refgpt"]
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        done = subprocess.run(command + [str(a) for a in args], capture_output=True, text=True, env=env,
                              timeout=timeout)
        return CLIResult(done.returncode, done.stdout, done.stderr)

    def in_process(self, *args) -> CLIResult:
        from refgpt.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main([str(a) for a in args])
            except SystemExit as exit_:  # argparse's usage errors and --help
                status = exit_.code
        return CLIResult(status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def refgpt_cli() -> RefgptCLI:
    """Run the refgpt command (see RefgptCLI)."""
    return RefgptCLI()


@pytest.fixture(scope="session")
def _tl_pair_once(tmp_path_factory):
    import peers

    peers.require_peers()
    import tl_port

    return tl_port.gpt2_pair(tmp_path_factory.mktemp("tl_gpt2"), seed=5, n_layers=7)  # 7: TL's test_left_padding reads "k6a"


@pytest.fixture(scope="session")
def _tl_torch_once(_tl_pair_once):
    import tl_port

    return tl_port.torch_model(_tl_pair_once[0])


@pytest.fixture
def tl_torch(_tl_torch_once, _tl_pair_once):
    """refgpt's torch-facing HookedTransformer (refgpt/tl_torch/) over ``tl_pair``'s refgpt model: the
    same random GPT-2, built once per session, reset like the pair around each test."""
    import tl_port

    tl_port.reset([_tl_torch_once])
    yield _tl_torch_once
    tl_port.reset([_tl_torch_once])


@pytest.fixture
def tl_pair(_tl_pair_once):
    """(refgpt Model, TransformerLens HookedTransformer): one random float64 GPT-2 with d_vocab 50,257
    and GPT-2's tokenizer (tests/tl_port.py), built once for all the ported TransformerLens tests and
    reset to ``from_pretrained("gpt2")``'s state (BOS, right padding, no hooks, switches off) around
    each test. A peer fixture: it skips without the ``peers`` extra."""
    import tl_port

    yield tl_port.reset(_tl_pair_once)
    tl_port.reset(_tl_pair_once)


@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    """An empty HF cache of the test's own (HF_HUB_CACHE, returned), online, with the hub endpoint at a
    closed loopback port: nothing a test does with the hub can leave the machine."""
    for var in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    return tmp_path / "hub"


@pytest.fixture(scope="session")
def hub_files() -> dict:
    """The files of the small random GPT-2 the ``hub`` fixture serves (fake_hub.tiny_gpt2_files)."""
    return tiny_gpt2_files(seed=1)


@pytest.fixture
def hub(hf_env, hub_files, monkeypatch):
    """A fake hub on 127.0.0.1 (HF_ENDPOINT) serving ``hub_files`` as openai-community/gpt2 (main → one
    commit, ``hub.commit``); the bare name gpt2 redirects to it, as on the real hub."""
    with FakeHub() as fake:
        fake.commit = fake.add_commit("openai-community/gpt2", hub_files)
        fake.renamed["gpt2"] = "openai-community/gpt2"
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake
