"""The CLI never prints a traceback: whatever the arguments and files, ``refgpt`` exits 0, or
exits 1/2 with exactly one stderr line ``refgpt: error: …``. Arguments are drawn per subcommand
from hostile pools (NaN, ∞, 1e-320, -1, huge integers, a newline in a path, a device as output,
files that are empty, binary, not UTF-8 or of the wrong kind; a socket stands for a device: a test
never aims a write at /dev/null)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refgpt
from fuzzing import fuzz_settings, socket_file
from random_models import random_params
from refgpt import Config, Model
from refgpt.oracle import golden
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=32, d_vocab=259, n_ctx=8)
OUTCOMES: dict[int, int] = {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny checkpoint with a tokenizer, a golden file of it, and a drawer of hostile files."""
    d = tmp_path_factory.mktemp("cli")
    symbols = [bytes_to_unicode()[b] for b in range(256)]
    params = random_params(CFG, 2)
    params["unembed.W_U"] = params["embed.W_E"].T  # tied, as GPT-2 is
    model = Model(CFG, params)
    model.tokenizer = Tokenizer({**{c: i for i, c in enumerate(symbols)}, "ab": 256, "Ġa": 257,
                                 "<|endoftext|>": 258}, [("a", "b"), ("Ġ", "a")])
    ckpt = refgpt.save(model, d / "model", dtype="float32")
    golden.write(d / "golden.safetensors", golden.make(refgpt.load(ckpt), np.array([[1, 2, 3]])))
    files = {"ids.txt": b"1 2 3\n", "empty": b"", "binary": bytes(range(256)), "latin1": "1 2 \xe9".encode("latin-1"),
             "odd.txt": "1 \u0662 3".encode(), "huge.txt": b"9" * 5000, "neg.txt": b"1 -2", "ragged.txt": b"1 2\n3\n",
             "nested.json": b"[" * 100_000, "ids.npy": None, "cand.npz": b"PK\x03\x04junk"}
    for name, content in files.items():
        if content is not None:
            (d / name).write_bytes(content)
    np.save(d / "ids.npy", np.array([[1.5, 2.0]]))
    (d / "dir.safetensors").mkdir()
    (d / "link.safetensors").symlink_to(socket_file(d / "socket"))
    return d


TEXTS = ["ab", "a b", "", " ", "\n", "<|endoftext|>", "x" * 40, "\udcff", "é"]
NUMBERS = ["nan", "inf", "-inf", "1e-320", "-1", "0", "1", "3", "1e308", "9" * 400, "0x10", "", "1.5", "#1", "#-1"]


@st.composite
def argv(draw, d):
    command = draw(st.sampled_from(["predict", "inspect", "generate", "attribute", "golden", "compare", "steer", "lens"]))
    path = lambda: draw(st.sampled_from([str(d / n) for n in ("ids.txt", "empty", "binary", "latin1", "odd.txt", "huge.txt",
                                                                "neg.txt", "ragged.txt", "nested.json", "ids.npy", "cand.npz",
                                                                "golden.safetensors", "dir.safetensors", "missing")]
                                        + [str(d / "new\nline.safetensors"), str(d / "socket"), str(d / "link.safetensors")]))
    number = lambda: draw(st.sampled_from(NUMBERS))
    args = [command]
    if command == "compare":
        args += [str(d / "golden.safetensors") if draw(st.booleans()) else path(), path()]
    elif command == "golden":
        args += draw(st.sampled_from([[draw(st.sampled_from(TEXTS))], ["--tokens", path()]]))
        args += ["-o", draw(st.sampled_from([str(d / n) for n in ("out.safetensors", "socket", "link.safetensors",
                                                                  "dir.safetensors", "new\nline.safetensors", "no/x")]))]
    else:
        args.append(draw(st.sampled_from(TEXTS)))
    options = {"predict": [["--top-k", number()], ["--bos"]],
               "inspect": [["--bos"]],
               "generate": [["-n", number()], ["--temperature", number()], ["--top-k", number()], ["--seed", number()]],
               "attribute": [["--target", draw(st.sampled_from(TEXTS + ["#1", "#999", "#x"]))], ["--target-id", number()],
                             ["--pos", number()], ["--top", number()], ["--granularity", draw(st.sampled_from(["layer", "head", "neuron", "x"]))]],
               "golden": [["--names", draw(st.sampled_from(["*", "blocks.9.*", "[", ""]))]],
               "compare": [["--atol", number()], ["--rtol", number()], ["--profile", "float32"], ["--map", draw(st.sampled_from(["hf", "llmc", "tl"]))]],
               "steer": [["--plus", draw(st.sampled_from(TEXTS))], ["--minus", draw(st.sampled_from(TEXTS))],
                         ["--layer", number()], ["--coeff", number()]],
               "lens": [["--kind", draw(st.sampled_from(["logit", "final-scale", "tuned"]))], ["--translators", path()],
                        ["--target", draw(st.sampled_from(TEXTS))]]}[command]
    for option in draw(st.lists(st.sampled_from(options), max_size=3, unique_by=lambda o: o[0])):
        args += option
    if command == "steer" and draw(st.booleans()):
        args += ["--plus", "a", "--minus", "b", "--layer", "1"]
    if command != "compare" or draw(st.booleans()):
        args += ["--model", str(d / "model")]
    args += draw(st.sampled_from([[], ["--json"], ["--dtype", "float32"], ["--dtype", "x"]]))
    return args


@pytest.mark.slow
@fuzz_settings(150)
@given(data=st.data())
def test_the_cli_never_prints_a_traceback(world, refgpt_cli, data):
    args = data.draw(argv(world))
    result = refgpt_cli.in_process(*args)
    OUTCOMES[result.returncode] = OUTCOMES.get(result.returncode, 0) + 1
    assert result.returncode in (0, 1, 2), (args, result.stderr)
    failed_comparison = args[0] == "compare" and result.returncode == 1 and result.stderr == ""  # the report says why
    if result.returncode and not failed_comparison:
        assert re.fullmatch(r"refgpt: error: [^\n]*\n", result.stderr), (args, result.stderr)
    assert "Traceback" not in result.stderr and "nan" not in result.stdout.lower().replace("nanosecond", "")


def test_the_cli_fuzzer_saw_successes_and_errors():
    if not OUTCOMES:
        pytest.skip("run together with the fuzz test")
    assert OUTCOMES.get(0, 0) >= 5 and OUTCOMES.get(1, 0) >= 5 and OUTCOMES.get(2, 0) >= 5, OUTCOMES


@pytest.mark.parametrize("argv_tail,match", [
    (["golden", "ab", "-o", "{d}/new\nline/x.safetensors"], r"new\\nline"),
    (["golden", "ab", "-o", "{d}/socket"], "will not overwrite it: it is not a regular file"),
    (["golden", "ab", "-o", "{d}/link.safetensors"], "a link to .*socket"),
    (["golden", "--tokens", "{d}/latin1", "-o", "{d}/o.safetensors"], "a binary file, not text ids"),
    (["golden", "--tokens", "{d}/empty", "-o", "{d}/o.safetensors"], "no token ids"),
    (["golden", "--tokens", "{d}/odd.txt", "-o", "{d}/o.safetensors"], "is not an integer token id"),
    (["golden", "--tokens", "{d}/ids.npy", "-o", "{d}/o.safetensors"], "token ids must be integers"),
    (["generate", "ab", "-n", "2", "--temperature", "1e-320"], "so small"),
    (["generate", "ab", "-n", "2", "--temperature", "inf"], "must be a finite number"),
    (["generate", "ab", "-n", "2", "--seed", "-1"], "must be a whole number ≥ 0"),
    (["steer", "ab", "--plus", "a", "--minus", "b", "--layer", "1", "--coeff", "nan"], "must be a finite number"),
    (["steer", "ab", "--plus", "a", "--minus", "b", "--layer", "1", "--coeff", "1e308"], "overflows float64|produced -?inf at blocks"),
    (["compare", "{d}/golden.safetensors", "{d}/cand.npz"], "not a readable .npz"),
])
def test_known_hostile_commands_are_one_line(world, refgpt_cli, argv_tail, match):
    args = [a.format(d=world) for a in argv_tail]
    if args[0] != "compare":
        args += ["--model", str(world / "model")]
    result = refgpt_cli.in_process(*args)
    assert result.returncode in (1, 2) and re.fullmatch(r"refgpt: error: [^\n]*\n", result.stderr), result
    assert re.search(match, result.stderr), result.stderr
