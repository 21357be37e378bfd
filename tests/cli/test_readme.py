"""README.md as a newcomer reads it: short, the quick start early and true, every command line and
every Python block run as printed, and what it says about them so.

- at most 1,500 words; the quick start's two commands before line 40: the first installs and
  predicts (its pasted output is what the command prints, with nothing downloaded), the second is
  the command CI runs (.ci/run);
- every other bash line runs as printed, in order, in one empty directory, on the embedded model,
  the hub served by tests/fake_hub.py (tests/cli_examples.py);
- every Python block runs, and does what its comments say;
- the command line and the API differ by <|endoftext|> exactly as the README says, and it says so
  where both first appear.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import refgpt
from cli_examples import commands, needs_matplotlib, run_line
from peers import F64_TOL

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
TEXT = "To be, or not to"


def section(title: str) -> str:
    """The text under ``## title`` (or ``### title``), up to the next heading of any level."""
    return re.split(rf"^#+ {re.escape(title)}\n", README, maxsplit=1, flags=re.M)[1].split("\n#", 1)[0]


def blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def bash_lines(text: str) -> list[str]:
    return [line for block in blocks("bash", text) for line in block.splitlines() if line.strip()]


# ---- short, and the quick start first ---------------------------------------------------------


def test_the_readme_is_short_and_the_quick_start_comes_before_line_40():
    assert len(README.split()) <= 1500  # as wc -w counts
    lines = README.splitlines()
    quick = lines.index("## Quick start")
    commands_end = next(i for i in range(quick, len(lines)) if lines[i] == "```" and lines[i - 1].startswith("pip"))
    assert commands_end + 1 < 40
    intro = [line for line in lines[1:quick] if line.strip()]
    assert len(intro) == 3  # what refgpt is, in three lines


def test_the_quick_start_is_two_commands_and_the_second_is_what_ci_runs():
    install, suite = bash_lines(section("Quick start"))
    assert [argv[:1] for _, argv in [(None, c) for c in _shell_commands(install)]] == [["pip"], ["refgpt"]]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").split(". .venv-ci/bin/activate\n", 1)[1]
    ci_commands = []
    for line in ci.splitlines():
        argv = shlex.split(line, comments=True)
        if argv[:3] == ["python", "-m", "pip"]:
            argv = ["pip", *[a for a in argv[3:] if a not in ("--quiet", "-q")]]
        if argv and argv != ["pip", "install", "--upgrade", "pip"]:  # the fresh venv's own pip: not a test need
            ci_commands.append(argv)
    assert _shell_commands(suite) == ci_commands


def _shell_commands(line: str) -> list[list[str]]:
    words = shlex.split(line, comments=True)
    out, current = [], []
    for word in words + ["&&"]:
        if word == "&&":
            out.append(current)
            current = []
        else:
            current.append(word)
    return out


def test_the_quick_start_output_is_what_the_command_prints_with_nothing_downloaded(refgpt_cli, hf_env):
    quick_start = section("Quick start")
    command = _shell_commands(bash_lines(quick_start)[0])[1]
    pasted = blocks("text", quick_start)[0]
    status, out, _ = refgpt_cli.in_process(*command[1:])  # the hub is unreachable (hf_env)
    assert status == 0
    assert re.sub(r"\S*/weights/default", "DEFAULT", pasted) == out.replace(str(refgpt.default_model_path()), "DEFAULT")
    assert not hf_env.exists() or not any(hf_env.iterdir())


# ---- every example runs -------------------------------------------------------------------------


@pytest.mark.slow
def test_every_command_line_after_the_quick_start_runs_as_printed(refgpt_cli, hf_env, hub, tmp_path, monkeypatch):
    rest = README.split("## Quick start", 1)[1].split("\n## ", 1)[1]
    lines = bash_lines(rest)
    assert len(lines) >= 8
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for line in lines:
        needs_matplotlib(line)
        outputs[line] = run_line(refgpt_cli, line, monkeypatch)
    real = bash_lines(section("Real GPT-2 weights"))
    assert [[argv[:1] for _, argv in commands(line)] for line in real] == [[["download"], ["predict"]]]
    assert outputs[real[0]][-1].stdout.startswith(f"model: {hf_env}/models--gpt2/snapshots/{hub.commit} (float64)")
    assert "`~/.cache/huggingface/hub/models--gpt2/`" in section("Real GPT-2 weights")
    assert {"golden.safetensors", "mine.safetensors"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.slow
def test_the_reference_block_runs_and_the_fast_path_agrees_with_the_reference(tmp_path, monkeypatch):
    (block,) = blocks("python", section("The reference"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    model, tokens, logits = namespace["model"], namespace["tokens"], namespace["logits"]
    assert tokens.ndim == 1 and tokens[0] == model.tokenizer.bos_token_id
    assert logits.shape == (len(tokens), model.cfg.d_vocab)
    # "agrees to rounding", and so do the gradients: within the float64 bound refgpt holds against
    # HF (tests/peers.py; measured here 1.6e-14 and 1.1e-15; tests/core/test_plain.py derives tighter ones)
    assert np.abs(logits - model(tokens)).max() <= F64_TOL * max(1.0, np.abs(logits).max())
    fast = model.loss_and_grads(tokens)
    assert abs(namespace["loss"] - fast.loss) <= F64_TOL
    for name, grad in fast.params.items():
        assert np.abs(namespace["grads"][name] - grad).max() <= F64_TOL * max(1.0, np.abs(grad).max()), name


@pytest.mark.slow
def test_the_transformerlens_block_runs_as_printed(tmp_path, monkeypatch, capsys):
    (block,) = blocks("python", section("TransformerLens"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    model, tokens = namespace["model"], namespace["tokens"]
    assert tokens.shape[0] == 1 and tokens[0, 0] == model.tokenizer.bos_token_id
    assert namespace["logits"].shape == (1, tokens.shape[1], model.cfg.d_vocab)
    assert namespace["batch"][0, 0] == model.tokenizer.pad_token_id  # left-padded
    assert namespace["cache"]["blocks.3.ln1.hook_scale"].shape == (1, tokens.shape[1], 1)
    assert (tmp_path / "out" / "config.json").is_file()
    assert "<|endoftext|>" in capsys.readouterr().out


# ---- what it says -------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cli_and_the_api_differ_by_bos_where_the_readme_says_so(refgpt_cli):
    """The CLI runs TEXT's tokens as they are, model(TEXT) puts <|endoftext|> first; --bos makes
    the CLI's answer the API's (to rounding: predict unembeds the last position only, and its
    ranking is the same); the README says so where both first appear."""
    model = refgpt.load_default()
    be = model.to_single_token(" be")
    top = lambda status_out: json.loads(status_out[1])["top_k"]
    cli = top(refgpt_cli.in_process("predict", TEXT, "--json", "--top-k", "1"))
    cli_bos = top(refgpt_cli.in_process("predict", TEXT, "--bos", "--json", "--top-k", str(model.cfg.d_vocab)))
    api = model(TEXT)[0, -1]  # [d_vocab]
    assert cli[0]["id"] == be and int(np.argmax(api)) == be  # trained with BOS windows: ' be' either way
    assert round(float(np.exp(api[be] - np.logaddexp.reduce(api))), 3) == 0.067
    assert [t["id"] for t in cli_bos] == np.argsort(-api, kind="stable").tolist()
    cli_logits = np.array([t["logit"] for t in sorted(cli_bos, key=lambda t: t["id"])])  # [d_vocab]
    assert np.abs(cli_logits - api).max() <= 1e-12 * max(1.0, np.abs(api).max())
    tokens = [t["id"] for t in json.loads(refgpt_cli.in_process("predict", TEXT, "--json").stdout)["tokens"]]
    assert tokens == model.to_tokens(TEXT, prepend_bos=False)[0].tolist() == model.tokenizer.encode(TEXT)
    first_api = README.index("model(")
    note = README.index("**The command line and the Python API tokenize differently by default.**")
    assert note < first_api < README.index("\n\n", note) and README.index("## Quick start") < note
    flowing = " ".join(README[note:README.index("\n\n", note)].split())
    for said in ("runs TEXT's tokens as HF's tokenizer and tiktoken encode it", "`--bos` puts `<|endoftext|>` first",
                 "`model(\"To be, or not to\")` puts `<|endoftext|>` first (the embedded model still ranks `' be'` first, 0.067)",
                 "as `refgpt predict \"To be, or not to\" --bos` does",
                 "`model.to_tokens(text, prepend_bos=False)` gives the command line's tokens"):
        assert said in flowing, said


@pytest.mark.peer
def test_hf_s_tokenizer_and_tiktoken_give_the_command_line_s_tokens(refgpt_cli):
    """The README: the command line runs TEXT's tokens as HF's tokenizer and tiktoken encode it
    (neither puts <|endoftext|> first), here on the embedded model's vocabulary."""
    transformers = pytest.importorskip("transformers", reason="the peer test needs the 'peers' extra")
    tiktoken = pytest.importorskip("tiktoken", reason="the peer test needs the 'peers' extra")
    from refgpt.gpt2.tokenizer import GPT2_PATTERN, bytes_to_unicode

    cli = [t["id"] for t in json.loads(refgpt_cli.in_process("predict", TEXT, "--json").stdout)["tokens"]]
    d = refgpt.default_model_path()
    hf = transformers.GPT2TokenizerFast.from_pretrained(str(d))  # vocab.json and merges.txt
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    eot = "<|endoftext|>"
    ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items() if token != eot}  # id = rank
    tt = tiktoken.Encoding(name="embedded", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={eot: vocab[eot]})
    assert hf(TEXT)["input_ids"] == tt.encode(TEXT) == cli


def test_the_facts_the_readme_states():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    requires = [re.match(r"[\w-]+", r).group() for r in cfg["options"]["install_requires"].split()]
    assert requires == ["numpy", "safetensors", "regex"] and "(numpy, safetensors, regex)" in README
    peers = {re.match(r"[\w-]+", r).group() for r in cfg["options.extras_require"]["peers"].splitlines()
             if r and not r.startswith("#")}
    assert {"torch", "transformers", "transformer-lens", "tiktoken"} <= peers
    assert '"torch==2.13.0"' in README and "torch==2.13.0" in cfg["options.extras_require"]["peers"]
    model = refgpt.load_default()
    n_params = sum(p.size for name, p in model.params.items() if name != "unembed.W_U")  # W_U is W_Eᵀ, tied
    assert model.cfg.n_layers == 4 and round(n_params / 1e6, 1) == 2.2
    assert "with 4 layers and 2.2 M parameters" in " ".join(README.split())
    spec = (REPO / "refgpt" / "reference" / "gpt2.py").read_text(encoding="utf-8")
    assert "def forward(" in spec and "def backward(" in spec


def test_contributing_s_commands_are_the_readme_s_and_its_variables_exist():
    """CONTRIBUTING.md: its test command is the README's, and every REFGPT_*/MALLOC_* variable it
    names is one the code, the tests, the benchmarks or the benchmarks' record read."""
    contributing = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert bash_lines(contributing)[0] == bash_lines(section("Quick start"))[1].split("   #")[0].rstrip()
    sources = "".join(p.read_text(encoding="utf-8") for folder in ("refgpt", "tests", "benchmarks")
                      for p in (REPO / folder).rglob("*.py")
                      if p != Path(__file__))
    sources += (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    for variable in set(re.findall(r"\b((?:REFGPT|MALLOC)_[A-Z_]+)", contributing + README)):
        assert variable in sources, variable
