"""Every subcommand's ``--help`` ends with 2–4 examples, and every example runs as printed.

Each subcommand's lines run in order in an empty directory holding only the files a user brings
(tests/cli_examples.py: ids, llm.c's files, tuned-lens translators), on the embedded model; a hub
name (``--model gpt2``, ``refgpt download …``) is served by the fake hub on 127.0.0.1 with a small
random GPT-2 in the embedded model's vocabulary (tests/fake_hub.py), into an empty HF cache."""

from __future__ import annotations

import re

import pytest

from cli_examples import commands, needs_matplotlib, run_line, user_files
from refgpt.cli import COMMANDS, name_of, build_parser

NAMES = [name_of(command) for command in COMMANDS]


def help_examples(cli, name: str) -> list[str]:
    """The example lines under ``examples:`` at the end of ``refgpt NAME --help``."""
    status, out, _ = cli.in_process(name, "--help")
    assert status == 0
    assert "\nexamples:\n" in out, f"refgpt {name} --help has no examples"
    section = out.split("\nexamples:\n", 1)[1]
    lines = [line[2:] for line in section.splitlines() if line.startswith("  ")]
    assert len(lines) == len(section.strip().splitlines()), f"refgpt {name} --help: stray text after the examples"
    return lines


def test_every_subcommand_is_listed():
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(subparsers.choices) == sorted(NAMES)


@pytest.fixture(scope="module")
def brought(tmp_path_factory):
    """The files a user brings (tests/cli_examples.py), made once."""
    directory = tmp_path_factory.mktemp("brought")
    user_files(directory)
    return directory


@pytest.mark.parametrize("name", NAMES)
def test_the_help_examples_run_as_printed(refgpt_cli, name, hub, hub_files, brought, tmp_path, monkeypatch):
    lines = help_examples(refgpt_cli, name)
    assert 2 <= len(lines) <= 4, lines
    assert any(argv[0] == name for line in lines for _, argv in commands(line)), f"no example runs refgpt {name}"
    hub.add_commit("openai-community/gpt2-medium", hub_files)  # `refgpt download openai-community/gpt2-medium`
    work = tmp_path / "work"
    work.mkdir()
    for path in brought.iterdir():
        (work / path.name).symlink_to(path)
    monkeypatch.chdir(work)
    for line in lines:
        needs_matplotlib(line)
        results = run_line(refgpt_cli, line, monkeypatch)
        if any("--json" in argv for _, argv in commands(line)):
            assert results[-1].stdout.lstrip().startswith("{")
    written = {p.name for p in work.iterdir()} - {p.name for p in brought.iterdir()}
    for line in lines:  # every file an example names with -o or --plot was written by it
        for option, path in re.findall(r"(-o|--plot|--debug-state) (\S+)", line):
            assert path in written, (line, path)
