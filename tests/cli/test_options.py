"""A subcommand uses every option it takes, and refuses the rest: never accepted and ignored.

For every subcommand and every shared option (``--model``, ``--dtype``, ``--json``, ``--bos``):
if the subcommand declares it (``USES``), giving it changes what the command does (``--dtype
float32`` changes the answer, ``--json`` prints JSON, ``--bos`` adds a token, a missing
``--model`` is an error of its own); if not, giving it is a usage error, exit status 2 with one
line ``refgpt: error: …``. Then the subcommands' own options that would be ignored in some
combination (golden's ``--bos`` with ``--tokens``, generate's ``--seed`` when greedy, …)."""

from __future__ import annotations

import json
import re

import pytest

from refgpt.cli import COMMANDS, name_of
from refgpt.cli._chosen_model import SHARED

NAMES = {name_of(command): command for command in COMMANDS}
GOLDEN = "g.safetensors"

#: Each subcommand run cheaply on the embedded model, in a directory holding GOLDEN.
BASE = {
    "predict": ["predict", "To be"],
    "inspect": ["inspect", "To be"],
    "generate": ["generate", "To be", "-n", "2"],
    "attribute": ["attribute", "To be", "--target", " be"],
    "golden": ["golden", "To be", "-o", "out.safetensors"],
    "compare": ["compare", GOLDEN, GOLDEN],
    "steer": ["steer", "To be", "--plus", "a", "--minus", "b", "--layer", "1"],
    "lens": ["lens", "To be"],
    "train-lens": ["train-lens", "--text", "prompts.txt", "-o", "{out}", "--steps", "1", "--tokens-per-step", "4",
                   "--window", "4"],
    "eval-lens": ["eval-lens", "--text", "prompts.txt", "--window", "4", "--no-tuned"],
    "explore": ["explore", "To be", "-o", "page.html"],
    "eval-sae": ["eval-sae", "default", "To be, or not to be"],
    "sweep": ["sweep", "prompts.txt", "--task", "loss", "--workers", "0", "-o", "{out}"],
    "download": ["download", "gpt2"],
}
#: A value for each shared option that takes one: what a subcommand must refuse, or use.
REFUSED = {"--model": ["--model", "/nonexistent"], "--dtype": ["--dtype", "banana"], "--json": ["--json"],
           "--bos": ["--bos"]}


@pytest.fixture(scope="module")
def golden_file(refgpt_cli, tmp_path_factory):
    path = tmp_path_factory.mktemp("options") / GOLDEN
    assert refgpt_cli.in_process("golden", "To be", "-o", path).returncode == 0
    return path


@pytest.fixture
def work(golden_file, tmp_path, monkeypatch, hf_env):
    """A directory of the test's own holding GOLDEN (a link to one made once) and a one-prompt
    corpus, the hub unreachable (hf_env)."""
    (tmp_path / GOLDEN).symlink_to(golden_file)
    (tmp_path / "prompts.txt").write_text("To be\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


class Fresh:
    """``refgpt_cli`` with each "{out}" in a command line made a new directory: a sweep's OUT belongs
    to one sweep, and each run here is another (another dtype, --bos)."""

    def __init__(self, cli):
        self.cli, self.n = cli, 0

    def in_process(self, *argv):
        self.n += 1
        return self.cli.in_process(*(f"out{self.n}" if a == "{out}" else a for a in argv))


def test_every_subcommand_has_a_base_command_line_and_declares_only_shared_options():
    assert set(BASE) == set(NAMES)
    for name, command in NAMES.items():
        assert set(command.USES) <= set(SHARED), name


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(SHARED))
@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_shared_option_is_used_or_refused(refgpt_cli, work, name, option):
    refgpt_cli, base = Fresh(refgpt_cli), BASE[name]
    if option not in NAMES[name].USES:
        status, out, err = refgpt_cli.in_process(*base, *REFUSED[option])
        assert status == 2 and out == "", (name, option, err)
        assert re.fullmatch(rf"refgpt: error: {name} takes no {option}: [^\n]*\n", err), err
        return
    plain = refgpt_cli.in_process(*base)
    assert plain.returncode == 0, plain.stderr
    if option == "--model":  # it is read: a missing model is an error, not the default
        status, out, err = refgpt_cli.in_process(*base, "--model", work / "nowhere")
        assert status == 1 and "not found" in err, err
    elif option == "--dtype":  # validated, and it changes the answer
        assert refgpt_cli.in_process(*base, "--dtype", "banana").returncode == 2
        changed = refgpt_cli.in_process(*base, "--dtype", "float32", *json_flag(name))
        assert changed.returncode == 0 and "float32" in changed.stdout
        assert "float32" not in refgpt_cli.in_process(*base, *json_flag(name)).stdout
    elif option == "--json":
        changed = refgpt_cli.in_process(*base, "--json")
        assert changed.returncode == 0 and isinstance(json.loads(changed.stdout), dict)
    else:  # --bos: one more token, <|endoftext|>, first
        changed = refgpt_cli.in_process(*base, "--bos", *json_flag(name))
        assert changed.returncode == 0
        assert n_tokens(changed.stdout) == n_tokens(refgpt_cli.in_process(*base, *json_flag(name)).stdout) + 1


def json_flag(name) -> list[str]:
    return ["--json"] if "--json" in NAMES[name].USES else []


def n_tokens(out: str) -> int:
    """How many tokens a --json answer says the model ran on (a one-prompt loss sweep: its targets + 1)."""
    answer = json.loads(out)
    if "summary" in answer:
        return answer["summary"]["result"]["targets"] + 1
    return len(answer["tokens"]) if "tokens" in answer else answer["tokens_shape"][-1]


def test_the_issue_s_command_line_is_refused(refgpt_cli, work):
    """refgpt compare g g --model /nonexistent --dtype banana said OK, exit 0 (issue 23)."""
    status, out, err = refgpt_cli.in_process("compare", GOLDEN, GOLDEN, "--model", "/nonexistent", "--dtype", "banana")
    assert (status, out) == (2, "") and err == "refgpt: error: compare takes no --model: it runs no model\n"
    assert "--model" not in refgpt_cli.in_process("compare", "--help").stdout


@pytest.mark.parametrize("argv,message", [
    (["golden", "--tokens", "ids.txt", "-o", "x.safetensors", "--bos"], "--bos goes with TEXT"),
    (["golden", "To be", "-o", "x.safetensors", "--tokens-dtype", "int32"], "--tokens-dtype describes --tokens FILE"),
    (["golden", "To be", "-o", "x.safetensors", "--tokens-shape", "1,2"], "--tokens-shape describes --tokens FILE"),
    (["generate", "To be", "-n", "2", "--temperature", "0", "--seed", "3"], "--seed is for sampling"),
    (["generate", "To be", "-n", "2", "--temperature", "0", "--top-k", "5"], "--top-k is for sampling"),
    (["compare", GOLDEN, GOLDEN, "--profile", "float32", "--atol", "1"], "either --profile or --atol"),
    (["compare", GOLDEN, GOLDEN, "--json", "--failing"], "--json gives every tensor"),
    (["golden", "To be", "-o", "x.safetensors", "--padding-side", "left"], "one row has nothing to pad"),
    (["golden", "--tokens", "ids.txt", "-o", "x.safetensors", "--greedy"], "--greedy goes with --tokens FILE --generate N"),
    (["lens", "To be", "--translators", GOLDEN], "--lens PATH and --ignore-unembed-hash go with --kind tuned"),
])
def test_an_own_option_that_would_be_ignored_is_refused(refgpt_cli, work, argv, message):
    (work / "ids.txt").write_text("1 2 3\n")
    status, out, err = refgpt_cli.in_process(*argv)
    assert (status, out) == (2, "") and err.startswith("refgpt: error: ") and message in err, err
    assert err.count("\n") == 1


def test_tokens_shape_for_a_file_that_holds_its_shape_is_refused(refgpt_cli, work):
    (work / "ids.txt").write_text("1 2 3\n4 5 6\n")
    status, _, err = refgpt_cli.in_process("golden", "--tokens", "ids.txt", "-o", "x.safetensors", "--tokens-shape", "1,6")
    assert status == 1 and "--tokens-shape B,T is for raw ids" in err and err.count("\n") == 1
    assert refgpt_cli.in_process("golden", "--tokens", "ids.txt", "-o", "x.safetensors").returncode == 0


def test_greedy_generation_reports_no_seed_and_sampling_its_seed(refgpt_cli, work):
    greedy = json.loads(refgpt_cli.in_process("generate", "To be", "-n", "2", "--temperature", "0", "--json").stdout)
    sampled = json.loads(refgpt_cli.in_process("generate", "To be", "-n", "2", "--json").stdout)
    seeded = json.loads(refgpt_cli.in_process("generate", "To be", "-n", "2", "--seed", "0", "--json").stdout)
    assert greedy["seed"] is None and sampled["seed"] == 0 and sampled["new_tokens"] == seeded["new_tokens"]
