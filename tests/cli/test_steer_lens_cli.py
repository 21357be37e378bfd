"""``refgpt steer`` and ``refgpt lens`` print what the Python API computes, their --json parses,
--plot writes a PNG, and their errors are one line with exit status 2 (usage) or 1."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from refgpt.analysis.interventions import steering_vector
from refgpt.analysis.lens import logit_lens, save_translators
from refgpt.analysis.measurements import kl_divergence

STEER = ["steer", "I hate you because", "--plus", "Love", "--minus", "Hate", "--layer", "2", "--coeff", "5", "--bos"]


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


def test_steer_json_is_the_api_result(refgpt_cli, model):
    out = refgpt_cli(*STEER, "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    tokens = model.to_tokens("I hate you because", prepend_bos=True)[0]
    sv = steering_vector(model, "Love", "Hate", 2, 5.0)
    kl = kl_divergence(model.run_with_hooks(tokens, fwd_hooks=sv), model(tokens))
    assert [p["kl"] for p in answer["positions"]] == kl.tolist()
    assert answer["positions"][0]["kl"] == 0.0  # both prompts start with <|endoftext|>: a zero row
    assert answer["vector_norm"] == np.linalg.norm(sv.vector, axis=-1).tolist()
    assert answer["untrained"] is False and answer["layer"] == 2
    # "Love" is one token of the default vocabulary and "Hate" two (H, ate): plus is padded with a space.
    assert [t["text"] for t in answer["plus"]] == ["<|endoftext|>", "Love", " "]
    assert [t["text"] for t in answer["minus"]] == ["<|endoftext|>", "H", "ate"]


def test_steer_generate_json_is_the_api_result(refgpt_cli, model):
    """--generate N: greedy continuations with and without the vector, as the Python API gives them."""
    out = refgpt_cli(*STEER, "--generate", "6", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)["generate"]
    tokens = model.to_tokens("I hate you because", prepend_bos=True)[0]
    sv = steering_vector(model, "Love", "Hate", 2, 5.0)
    with sv:
        steered = model.generate(tokens, 6, temperature=0, stop_at_eos=False)[len(tokens):]
    unsteered = model.generate(tokens, 6, temperature=0, stop_at_eos=False)[len(tokens):]
    assert [t["id"] for t in answer["steered"]["new_tokens"]] == steered.tolist()
    assert [t["id"] for t in answer["unsteered"]["new_tokens"]] == unsteered.tolist()
    assert answer["steered"]["continuation"] == model.to_string(steered) and answer["n"] == 6


def test_steer_generate_table_and_errors(refgpt_cli):
    out = refgpt_cli(*STEER, "--generate", "4")
    assert out.returncode == 0, out.stderr
    assert "greedy continuation, 4 tokens:" in out.stdout and "unsteered" in out.stdout
    assert "\nunsteered: '" in out.stdout and "\nsteered:   '" in out.stdout
    too_long = refgpt_cli(*STEER, "--generate", "100000")
    assert too_long.returncode == 1 and too_long.stderr.startswith("refgpt: error: generate:")
    bad = refgpt_cli(*STEER, "--generate", "-3")
    assert bad.returncode == 2 and "--generate" in bad.stderr


def test_steer_table_and_plot(refgpt_cli, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional 'plot' extra (matplotlib)")
    out = refgpt_cli(*STEER, "--plot", str(tmp_path / "steer.png"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("model: ")  # the trained default: no UNTRAINED warning
    assert "KL(steered‖clean)" in out.stdout and "‖v‖/‖stream 2‖" in out.stdout
    assert (tmp_path / "steer.png").read_bytes()[:4] == b"\x89PNG"


def test_lens_json_final_column_is_the_model_prediction(refgpt_cli, model):
    out = refgpt_cli("lens", "The cat sat", "--bos", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    tokens = model.to_tokens("The cat sat", prepend_bos=True)[0]
    assert answer["streams"] == ["0_pre", "1_pre", "2_pre", "3_pre", "final_post"]
    _, cache = model.run_with_cache(tokens)
    ids, probs = logit_lens(cache).top(1)
    for j, row in enumerate(answer["cells"]):
        assert [c["top"]["id"] for c in row] == ids[:, 0, j, 0].tolist()
        assert [c["probability"] for c in row] == probs[:, 0, j, 0].tolist()
    assert ids[-1, 0, :, 0].tolist() == np.argmax(model(tokens), -1).tolist()


def test_lens_tuned_with_zero_translators_equals_the_logit_lens_and_plots(refgpt_cli, model, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional 'plot' extra (matplotlib)")
    d = model.cfg.d_model
    path = save_translators(tmp_path / "zero.safetensors", {L: (np.zeros((d, d)), np.zeros(d)) for L in range(model.cfg.n_layers)})
    tuned = refgpt_cli("lens", "Hi there", "--kind", "tuned", "--translators", str(path), "--target", "e", "--json",
                       "--plot", str(tmp_path / "lens.png"))
    plain = refgpt_cli("lens", "Hi there", "--target-id", "101", "--json")
    by_hash = refgpt_cli("lens", "Hi there", "--target", "#101", "--json")  # a TOKEN argument takes #ID too
    assert tuned.returncode == plain.returncode == by_hash.returncode == 0, tuned.stderr + plain.stderr
    assert by_hash.stdout == plain.stdout
    a, b = json.loads(tuned.stdout), json.loads(plain.stdout)
    assert [[c["target_probability"] for c in row] for row in a["cells"]] == \
           [[c["target_probability"] for c in row] for row in b["cells"]]
    assert (tmp_path / "lens.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, status, message", [
    # "a long prompt" is 3 tokens of the default vocabulary (a, ' long', ' prompt'), "Hi" 2 (H, i).
    (["steer", "Hi", "--plus", "a long prompt", "--minus", "x", "--layer", "0"], 1, "needs at least 3 positions"),
    (["steer", "Hi", "--plus", "a", "--minus", "b", "--layer", "9"], 1, "layer 9 is not a block"),
    (["steer", "Hi", "--plus", "a"], 2, "--minus"),
    (["lens", "Hi", "--lens", "x.pt"], 2, "--lens PATH and --ignore-unembed-hash go with --kind tuned"),
    (["lens", "Hi", "--kind", "final-scale", "--stream", "resid_mid"], 2, "reads resid_pre only"),
    (["train-lens", "--text", "x.txt"], 2, "-o/--output"),
    (["eval-lens", "--text", "x.txt", "--no-tuned", "--lens", "y"], 2, "it takes no --lens"),
    (["eval-lens", "--text", "x.txt"], 1, "--text x.txt: not found"),
    (["lens", "train", "--text", "x.txt", "-o", "d"], 2, "refgpt lens train is now refgpt train-lens"),
    (["lens", "eval", "--text=x.txt"], 2, "refgpt lens eval is now refgpt eval-lens"),
    (["lens", "Hi", "--target", "abc"], 1, "'abc' is 2 tokens"),  # ab, c
    (["lens", "Hi", "--target-id", "8192"], 1, "outside the vocabulary"),
    (["lens", "Hi", "--target", "#8192"], 1, "outside the vocabulary"),
    (["lens", "Hi", "--target", "e", "--target-id", "101"], 2, "not both"),
    (["lens", "Hi", "--kind", "tuned", "--translators", "nowhere.safetensors"], 1, "nowhere.safetensors: lens not found"),
    (["lens", "Hi", "--kind", "tuned", "--lens", "nowhere"], 1, "nowhere: lens not found"),
])
def test_errors_are_one_line_with_the_right_exit_status(argv, status, message, refgpt_cli):
    code, _, err = refgpt_cli.in_process(*argv)
    assert code == status
    assert err.startswith("refgpt: error: ") and err.count("\n") == 1 and message in err, err


def test_lens_at_resid_mid_reads_the_streams_between_attention_and_mlp(refgpt_cli, model):
    out = refgpt_cli.in_process("lens", "The cat sat", "--bos", "--stream", "resid_mid", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["streams"] == ["0_mid", "1_mid", "2_mid", "3_mid", "final_post"]
    _, cache = model.run_with_cache(model.to_tokens("The cat sat", prepend_bos=True)[0])
    ids, _ = logit_lens(cache, "resid_mid").top(1)
    assert [[c["top"]["id"] for c in row] for row in answer["cells"]] == ids[:, 0, :, 0].T.tolist()
    tuned = refgpt_cli.in_process("lens", "The cat sat", "--kind", "tuned", "--stream", "resid_mid")
    assert tuned.returncode == 1 and "reads resid_pre, not resid_mid" in tuned.stderr  # the shipped lens's stream
