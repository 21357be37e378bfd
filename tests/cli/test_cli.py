"""The ``refgpt`` command: predict and inspect print what the Python API computes, --json parses,
a model directory marked UNTRAINED says so (the trained default does not), and every error is one
line with exit status 2 (usage) or 1."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import refgpt
from random_models import random_model, save_checkpoint
from refgpt import Config
from refgpt.files.default_model import UNTRAINED_MARKER
from refgpt.gpt2.tokenizer import bytes_to_unicode

TEXT = "Hello, world\n"


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


def expected_token_text(token_id: int) -> str:
    """A byte-level vocabulary's token as predict --help says tables show it: ASCII bytes as str reprs,
    other bytes (never whole UTF-8) as bytes reprs, 256 <|endoftext|>."""
    if token_id == 256:
        return "'<|endoftext|>'"
    return repr(chr(token_id)) if token_id < 128 else repr(bytes([token_id]))


def shown_text(tokenizer, token_id: int) -> str:
    """Any vocabulary's token as predict --help says tables show it: repr of its text, or of its bytes
    if they are not whole UTF-8."""
    raw = tokenizer.decode_bytes([int(token_id)])
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(raw)


def table_rows(out: str, header_start: str) -> list[list[str]]:
    """The rows under the table header line that starts with ``header_start``, split on 2+ spaces."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


@pytest.fixture
def plain_checkpoint(tmp_path):
    """A random byte-vocabulary model (one token per byte, <|endoftext|> = 256) with no UNTRAINED
    marker, and W_U = 0 so every logit ties."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=6, tie_word_embeddings=False)
    m = random_model(cfg, seed=4)
    params = {**m.params, "unembed.W_U": np.zeros_like(m.params["unembed.W_U"])}
    directory = save_checkpoint(refgpt.Model(cfg, params), tmp_path / "plain")
    vocab = {char: byte for byte, char in bytes_to_unicode().items()} | {"<|endoftext|>": 256}
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return directory


# ---- predict --------------------------------------------------------------------------------


def test_predict_table_is_the_models_top_k_next_tokens(refgpt_cli, model):
    status, out, err = refgpt_cli.in_process("predict", TEXT, "--top-k", "7")
    assert status == 0 and err == ""
    logits = model(model.to_tokens(TEXT, prepend_bos=False)[0], last_only=True)[-1]  # [d_vocab], as predict computes it
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()  # [d_vocab]
    top = np.argsort(-logits)[:7]
    rows = table_rows(out, "rank")
    assert [int(r[0]) for r in rows] == list(range(1, 8))
    assert [int(r[1]) for r in rows] == [int(i) for i in top]
    for (_, _, shown, p, logit), t in zip(rows, top):
        assert shown == shown_text(model.tokenizer, t)
        assert p == f"{probs[t]:.8f}" and logit == f"{logits[t]:.6f}"


def test_predict_json_is_exactly_what_the_api_computes(refgpt_cli, model):
    n = model.cfg.d_vocab
    status, out, _ = refgpt_cli.in_process("predict", TEXT, "--json", "--top-k", str(n))
    answer = json.loads(out)
    logits = model(model.to_tokens(TEXT, prepend_bos=False)[0], last_only=True)[-1]  # [d_vocab], as predict computes it
    assert status == 0 and answer["untrained"] is False and answer["dtype"] == "float64"
    assert [t["id"] for t in answer["tokens"]] == model.to_tokens(TEXT, prepend_bos=False)[0].tolist()
    assert [t["id"] for t in answer["top_k"]] == [int(i) for i in np.argsort(-logits, kind="stable")]
    assert [t["logit"] for t in answer["top_k"]] == [float(logits[t["id"]]) for t in answer["top_k"]]
    # p_i = e_i / S with S = Σ e_j: S carries ≤ (n−1)u relative error, each division u, and summing
    # the n p_i another (n−1)u, so |Σ p_i − 1| ≤ (2n − 1)u < n·eps (u = eps/2, n = d_vocab = 8192).
    assert abs(sum(t["probability"] for t in answer["top_k"]) - 1) <= n * np.finfo(np.float64).eps


def test_predict_shows_token_text_with_repr(refgpt_cli, plain_checkpoint):
    """Every token of a byte-level vocabulary, so every kind of byte shows (the default's BPE tokens
    are whole words and pieces of them: test_predict_table_is_the_models_top_k_next_tokens)."""
    model = ["--model", str(plain_checkpoint)]
    _, out, _ = refgpt_cli.in_process("predict", "a b", *model, "--json", "--top-k", "257")
    by_id = {t["id"]: t for t in json.loads(out)["top_k"]}
    assert by_id[32]["text"] == " " and by_id[10]["text"] == "\n" and by_id[0xE2]["bytes"] == "e2"
    _, out, _ = refgpt_cli.in_process("predict", "a b", *model, "--top-k", "257")
    shown = {int(r[1]): r[2] for r in table_rows(out, "rank")}
    assert shown[32] == "' '" and shown[10] == "'\\n'" and shown[0xE2] == "b'\\xe2'"
    assert shown == {i: expected_token_text(i) for i in range(257)}


def test_predict_ranks_tied_logits_by_token_id(refgpt_cli, plain_checkpoint):
    status, out, _ = refgpt_cli.in_process("predict", "abc", "--model", str(plain_checkpoint), "--json", "--top-k", "5")
    top = json.loads(out)["top_k"]
    assert status == 0 and [t["id"] for t in top] == [0, 1, 2, 3, 4]
    assert all(t["logit"] == 0.0 and t["probability"] == 1 / 257 for t in top)  # exp(0)/257, exactly


def test_predict_in_float32_computes_in_float32(refgpt_cli):
    model32 = refgpt.load_default(dtype="float32")
    _, out, _ = refgpt_cli.in_process("predict", TEXT, "--dtype", "float32", "--json")
    answer = json.loads(out)
    logits = model32(model32.to_tokens(TEXT, prepend_bos=False)[0], last_only=True)[-1]  # [d_vocab], float32
    assert answer["dtype"] == "float32"
    assert [t["logit"] for t in answer["top_k"]] == [float(logits[t["id"]]) for t in answer["top_k"]]


def test_predict_with_bos_starts_from_endoftext(refgpt_cli, model):
    _, out, _ = refgpt_cli.in_process("predict", "", "--bos", "--json")
    assert [t["id"] for t in json.loads(out)["tokens"]] == [model.tokenizer.eot_token] == [8191]


# ---- inspect --------------------------------------------------------------------------------


def test_inspect_json_is_every_layernorm_statistic_from_the_cache(refgpt_cli, model):
    status, out, _ = refgpt_cli.in_process("inspect", TEXT, "--json")
    answer = json.loads(out)
    tokens = model.to_tokens(TEXT, prepend_bos=False)[0]
    _, cache = model.run_with_cache(tokens)
    n_pos, n_layers = len(tokens), model.cfg.n_layers

    def norm(name, L):  # the 2-norm over d_model at every position: [pos]
        return np.linalg.norm(cache[name, L][0], axis=-1)

    assert status == 0 and len(answer["blocks"]) == n_layers * n_pos and len(answer["ln_final"]) == n_pos
    for row in answer["blocks"]:
        L, pos = row["layer"], row["pos"]
        assert row["resid_pre_norm"] == float(norm("resid_pre", L)[pos])
        assert row["resid_mid_norm"] == float(norm("resid_mid", L)[pos])
        for ln in ("ln1", "ln2"):
            assert row[f"{ln}_mean"] == float(cache[f"blocks.{L}.{ln}.hook_mean"][0, pos, 0])
            assert row[f"{ln}_scale"] == float(cache[f"blocks.{L}.{ln}.hook_scale"][0, pos, 0])
    for row in answer["ln_final"]:
        pos = row["pos"]
        assert row["resid_final_norm"] == float(norm("resid_post", n_layers - 1)[pos])
        assert row["ln_final_mean"] == float(cache["ln_final.hook_mean"][0, pos, 0])
        assert row["ln_final_scale"] == float(cache["ln_final.hook_scale"][0, pos, 0])


def test_inspect_checks_the_cached_scale_decomposition_live(refgpt_cli, model):
    """docs/layernorm.md §2-3 on the default model: exact to 1e-12 relative, the naive way off by far more."""
    _, out, _ = refgpt_cli.in_process("inspect", TEXT, "--json")
    errors = json.loads(out)["decomposition"]
    assert errors["pieces"] == 2 + 2 * model.cfg.n_layers
    assert errors["max_abs_logit"] == float(np.max(np.abs(model(model.to_tokens(TEXT, prepend_bos=False)[0]))))
    tolerance = 1e-12 * max(1.0, errors["max_abs_logit"])  # tests/core/test_mission.py's float64 bound
    assert errors["cached_scale_error"] <= tolerance
    assert errors["naive_error"] > 1e6 * max(errors["cached_scale_error"], tolerance)


@pytest.mark.slow
def test_inspect_table_has_a_row_per_layer_and_position(refgpt_cli, model):
    status, out, _ = refgpt_cli.in_process("inspect", TEXT)
    n_pos = len(model.to_tokens(TEXT, prepend_bos=False)[0])
    blocks, final = table_rows(out, "layer"), table_rows(out, "pos")
    assert status == 0 and len(blocks) == model.cfg.n_layers * n_pos and len(final) == n_pos
    assert [r[1] for r in final] == ["'H'", "'ell'", "'o'", "','", "' world'", "'\\n'"]  # the default's BPE tokens
    assert all(len(r) == 9 for r in blocks) and all(len(r) == 5 for r in final)
    _, as_json, _ = refgpt_cli.in_process("inspect", TEXT, "--json")
    errors = json.loads(as_json)["decomposition"]
    assert f"from the cache (exact):  {errors['cached_scale_error']:.3e}\n" in out
    assert f"on its own (naive): {errors['naive_error']:.3e}\n" in out


def test_inspect_in_float32_reports_float32_statistics(refgpt_cli):
    model32 = refgpt.load_default(dtype="float32")
    _, out, _ = refgpt_cli.in_process("inspect", TEXT, "--dtype", "float32", "--json")
    answer = json.loads(out)
    _, cache = model32.run_with_cache(model32.to_tokens(TEXT, prepend_bos=False)[0])
    assert answer["dtype"] == "float32"
    assert [r["ln_final_scale"] for r in answer["ln_final"]] == [float(s) for s in cache["scale"][0, :, 0]]


# ---- the UNTRAINED marker --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_everything_printed_from_a_marked_model_says_untrained(refgpt_cli, command, plain_checkpoint):
    (plain_checkpoint / UNTRAINED_MARKER).write_text("UNTRAINED: a random initialisation\n")
    _, out, _ = refgpt_cli.in_process(command, "ab", "--model", str(plain_checkpoint))
    assert out.startswith("UNTRAINED MODEL: ")
    _, out, _ = refgpt_cli.in_process(command, "ab", "--model", str(plain_checkpoint), "--json")
    assert json.loads(out)["untrained"] is True


@pytest.mark.slow
@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_the_trained_default_is_not_called_untrained(refgpt_cli, command):
    _, out, _ = refgpt_cli.in_process(command, TEXT)
    assert "UNTRAINED" not in out and out.startswith(f"model: {refgpt.default_model_path()}")
    _, out, _ = refgpt_cli.in_process(command, TEXT, "--json")
    assert json.loads(out)["untrained"] is False


@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_a_model_without_the_marker_is_not_called_untrained(refgpt_cli, command, plain_checkpoint):
    _, out, _ = refgpt_cli.in_process(command, "ab", "--model", str(plain_checkpoint))
    assert "UNTRAINED" not in out and out.startswith(f"model: {plain_checkpoint}")
    _, out, _ = refgpt_cli.in_process(command, "ab", "--model", str(plain_checkpoint), "--json")
    assert json.loads(out)["untrained"] is False


# ---- errors: one line, exit 2 for usage, 1 for everything else ----------------------------------


def broken_safetensors(d):
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])


def broken_config(d):
    (d / "config.json").write_text("{ not json")


def no_tokenizer(d):
    (d / "vocab.json").unlink()
    (d / "merges.txt").unlink()


def broken_vocab(d):
    (d / "vocab.json").write_text('{"a": 0')


@pytest.mark.parametrize("breakage, message", [
    (broken_safetensors, r"model\.safetensors"),
    (broken_config, r"config\.json: not valid JSON"),
    (no_tokenizer, r"no tokenizer"),
    (broken_vocab, r"vocab\.json: not valid JSON \(line 1"),
])
@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_a_broken_checkpoint_is_one_line_and_status_1(refgpt_cli, plain_checkpoint, breakage, message, command):
    breakage(plain_checkpoint)
    status, out, err = refgpt_cli.in_process(command, "ab", "--model", str(plain_checkpoint))
    assert status == 1 and out == ""
    assert re.fullmatch(rf"refgpt: error: [^\n]*{message}[^\n]*\n", err)


@pytest.mark.parametrize("argv, status, message", [
    (["predict", TEXT, "--dtype", "float16"], 2, r"--dtype: invalid choice: 'float16'"),
    (["inspect", TEXT, "--dtype", "int8"], 2, r"--dtype: invalid choice: 'int8'"),
    (["predict", TEXT, "--top-k", "0"], 2, r"--top-k: must be a whole number ≥ 1, found '0'"),
    (["predict"], 2, r"the following arguments are required: TEXT"),
    (["inspect", TEXT, "--unknown"], 2, r"unrecognized arguments: --unknown"),
    (["predict", TEXT, "--model", "/nonexistent/gpt2"], 1, r"/nonexistent/gpt2: model directory not found"),
    (["predict", TEXT, "--model", "x" * 5000], 1, r"x{120}… \(5000 characters\): cannot open \(File name too long\)"),
    # The default vocabulary has no merge of "x" with "x": one token per x.
    (["inspect", "x" * 129], 1, r"TEXT is 129 tokens long, but the model's context holds at most 128"),
    (["predict", "x" * 128, "--bos"], 1, r"TEXT is 129 tokens long"),
    (["predict", ""], 1, r"TEXT is empty"),
])
def test_bad_input_is_one_line_with_the_right_status(refgpt_cli, argv, status, message):
    got, out, err = refgpt_cli.in_process(*argv)
    assert got == status and out == ""
    assert re.fullmatch(rf"refgpt: error: [^\n]*{message}[^\n]*\n", err)


def test_text_as_long_as_the_context_runs(refgpt_cli):
    status, out, _ = refgpt_cli.in_process("predict", "x" * 128, "--json")
    assert status == 0 and len(json.loads(out)["tokens"]) == 128


# ---- as a user runs it: a subprocess ---------------------------------------------------------


@pytest.mark.slow
def test_module_and_console_script_print_the_same_json(refgpt_cli):
    by_module = refgpt_cli("predict", TEXT, "--json")
    assert by_module.returncode == 0 and by_module.stderr == ""
    if shutil.which("refgpt") is None:
        pytest.skip("the refgpt console script is not on PATH (package not pip-installed)")
    by_script = refgpt_cli("predict", TEXT, "--json", console_script=True)
    assert by_script.returncode == 0 and json.loads(by_script.stdout) == json.loads(by_module.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("argv, status, message", [
    (["inspect", TEXT, "--dtype", "float16"], 2, "--dtype: invalid choice"),
    (["predict", TEXT, "--model", "/nonexistent/gpt2"], 1, "model directory not found"),
    (["predict", "x" * 600], 1, "TEXT is 600 tokens long"),
])
def test_errors_in_a_subprocess_are_one_line_without_traceback(refgpt_cli, argv, status, message):
    result = refgpt_cli(*argv)
    assert result.returncode == status and result.stdout == ""
    assert result.stderr.startswith("refgpt: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
def test_inspect_json_in_a_subprocess_parses(refgpt_cli):
    result = refgpt_cli("inspect", TEXT, "--json")
    assert result.returncode == 0
    assert set(json.loads(result.stdout)) >= {"model", "untrained", "dtype", "tokens", "blocks", "ln_final",
                                              "decomposition"}


@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_help_explains_each_subcommand_with_an_example(refgpt_cli, command):
    status, out, _ = refgpt_cli.in_process(command, "--help")
    assert status == 0 and "--model MODEL" in out and "--dtype" in out and "--json" in out
    assert re.search(rf"examples:\n  refgpt {command} \"", out)
