"""Fixtures every group of tests shares (helpers that are not fixtures live beside this file:
random_models.py, peers.py, ln_bounds.py, doc_pages.py)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest


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
