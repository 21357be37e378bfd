"""llm.c end to end without Python: golden from llm.c's checkpoint and token files, a dump of an llm.c
run (tokens, activations, gradients) compared forward and backward, and the hints for the usual
mistakes (swapped arguments, llm.c names without --map llmc, the B×T vs B×(T+1) convention)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from random_models import random_params
from refgpt import Config, Model, RefGPTError
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden, llmc, llmc_dump

CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=12)
B, T = 2, 8


def refgpt_cli(*args):
    return subprocess.run([sys.executable, "-m", "refgpt", *map(str, args)], capture_output=True, text=True)


def llmc_model(dtype="float64", seed=3):
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(CFG, seed, 0.5).items()}
    p["unembed.W_U"] = p["embed.W_E"].T
    return Model(CFG, p, dtype=dtype)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """llm.c's files for a random model (as train_gpt2.py writes them), and the golden the CLI makes."""
    tmp = tmp_path_factory.mktemp("llmc")
    model = llmc_model()
    tokens = np.random.default_rng(0).integers(0, CFG.d_vocab, size=(B, T + 1))  # B×(T+1): x and y
    llmc.write_model(tmp / "model.bin", model)
    llmc.write_debug_state(tmp / "state.bin", model, tokens)
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp / "state.bin", "--backward",
                   "-o", tmp / "golden.safetensors")
    assert r.returncode == 0, r.stderr
    return tmp, model, tokens, golden.read(tmp / "golden.safetensors"), r.stdout


def run_tensors(g, dtype="float32", fwd_hooks=()):
    """What a correct llm.c run (float32) on the golden's x and y holds, under llm.c's names."""
    m = Model(CFG, dict(llmc_model().params), dtype=dtype)
    t = golden.compute(m, g.tensors["tokens"], targets=g.tensors["targets"], backward=True, fwd_hooks=fwd_hooks)
    return llmc_dump.llmc_tensors_of_golden(t, CFG)


def test_golden_reads_llmc_checkpoint_and_debug_state_tokens_with_their_targets(files):
    tmp, model, tokens, g, stdout = files
    assert np.array_equal(g.tensors["tokens"], tokens[:, :-1]) and np.array_equal(g.tensors["targets"], tokens[:, 1:])
    assert g.tensors["loss"].shape == (B, T) and "grad.tied_W_E" in g.tensors
    state = llmc.read_debug_state(tmp / "state.bin", CFG.d_vocab, CFG)
    assert float(g.tensors["loss_mean"]) == pytest.approx(state.loss, rel=1e-6)
    assert "debug state" in stdout and "backward: mean loss" in stdout


def test_a_dump_of_a_correct_float32_run_passes_forward_and_backward(files):
    tmp, model, tokens, g, _ = files
    path = llmc_dump.write_dump(tmp / "dump.bin", CFG, run_tensors(g))
    report = oracle.compare(g, path, name_map="llmc")
    assert report.ok, report.table()
    names = {t.name for t in report.tensors}
    assert {"tokens", "targets", "blocks.1.hook_resid_pre", "loss_mean", "probs", "grad.logits",
            "grad.blocks.1.mlp.hook_pre", "grad.blocks.0.attn.hook_pattern", "grad.tied_W_E",
            "grad.blocks.0.attn.W_Q", "grad.pos_embed.W_pos", "grad.blocks.0.hook_resid_pre"} <= names
    assert not [m for m in report.missing if m.endswith("hook_resid_pre")]
    r = refgpt_cli("compare", tmp / "golden.safetensors", path, "--map", "llmc")
    assert r.returncode == 0 and "OK: all" in r.stdout, r.stdout + r.stderr


def test_planted_bugs_in_an_llmc_dump_are_named_forward_and_backward(files):
    tmp, model, tokens, g, _ = files
    run = run_tensors(g)
    forward_bug = dict(run, fch_gelu=run["fch_gelu"] * 1.01)
    report = oracle.compare(g, llmc_dump.write_dump(tmp / "f.bin", CFG, forward_bug), name_map="llmc")
    assert report.first_divergence.name == "blocks.0.mlp.hook_post"
    backward_bug = {k: v.copy() for k, v in run.items()}
    backward_bug["grads_acts.fch"][1] *= 1.02  # the GELU backward of block 1
    report = oracle.compare(g, llmc_dump.write_dump(tmp / "b.bin", CFG, backward_bug), name_map="llmc")
    assert report.first_divergence.name == "grad.blocks.1.mlp.hook_pre", report.table(after_first=1)
    assert "the activation (GELU)" in report.table()
    wrong_tokens = dict(run, tokens=np.roll(run["tokens"], 1))
    report = oracle.compare(g, llmc_dump.write_dump(tmp / "t.bin", CFG, wrong_tokens), name_map="llmc")
    assert report.first_divergence.name == "tokens" and "different input" in report.table()


def test_a_softmax_over_the_padded_vocabulary_is_caught_at_probs(files):
    tmp, model, tokens, g, _ = files
    run = run_tensors(g)
    Vp = run["logits"].shape[-1]
    logits = run["logits"].astype(np.float64)  # [B, T, Vp], 0 in the padding
    padded = np.exp(logits - logits.max(-1, keepdims=True))
    run = dict(run, probs=(padded / padded.sum(-1, keepdims=True)).astype(np.float32))
    report = oracle.compare(g, llmc_dump.write_dump(tmp / "p.bin", CFG, run), name_map="llmc")
    probs = report["probs"]  # every row's probabilities are right up to one factor, far from 1
    assert Vp > CFG.d_vocab and probs.status == "out of tolerance" and probs.row.rows_out == B * T, report.table()
    assert report.first_divergence.name == "probs" and "the row at [0, 0] (batch 0, pos 0) sums to" in report.table()


def test_the_debug_state_itself_compares_as_a_candidate(files):
    tmp, model, tokens, g, _ = files
    report = oracle.compare(g, tmp / "state.bin", name_map="llmc")
    assert report.ok, report.table()
    assert {"logits", "loss_mean", "grad.tied_W_E", "grad.blocks.1.mlp.W_out"} <= {t.name for t in report.tensors}


def test_debug_state_writer_says_which_token_convention_it_got(files):
    tmp, model, tokens, g, _ = files
    x, y, said = llmc.debug_state_tokens(tokens)
    assert "B×(T+1)" in said and x.shape == (B, T)
    x, y, said = llmc.debug_state_tokens(tokens[:, :-1], tokens[:, 1:])
    assert "y = targets [B, T]" in said and x.shape == (B, T)
    x, y, said = llmc.debug_state_tokens(tokens[:, :-1], tokens[:, 1:-1])
    assert "one position fewer" in said and x.shape == (B, T - 1)
    with pytest.raises(RefGPTError, match="fit neither"):
        llmc.debug_state_tokens(tokens, tokens[:, :3])
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp / "state.bin", "-o", tmp / "g2.safetensors",
                   "--debug-state", tmp / "state2.bin")
    assert r.returncode == 0 and "y = targets [B, T]" in r.stdout, r.stderr
    assert (tmp / "state2.bin").read_bytes()[: 4 * 4 * B * T] == (tmp / "state.bin").read_bytes()[: 4 * 4 * B * T]


def test_golden_tokens_from_a_data_shard_and_raw_files(tmp_path, files):
    tmp, model, tokens, g, _ = files
    ids = np.random.default_rng(1).integers(0, CFG.d_vocab, size=40)
    header = np.zeros(256, "<i4")
    header[:3] = (llmc.SHARD_MAGIC, 1, ids.size)
    (tmp_path / "shard.bin").write_bytes(header.tobytes() + ids.astype("<u2").tobytes())
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp_path / "shard.bin", "--tokens-shape", "2,5",
                   "-o", tmp_path / "s.safetensors")
    assert r.returncode == 0, r.stderr
    s = golden.read(tmp_path / "s.safetensors")
    assert np.array_equal(s.tensors["tokens"], ids[:10].reshape(2, 5))
    assert np.array_equal(s.tensors["targets"], ids[1:11].reshape(2, 5))
    for dtype, code in (("int32", "<i4"), ("uint16", "<u2")):
        (tmp_path / f"ids.{dtype}").write_bytes(ids[:12].astype(code).tobytes())
        r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp_path / f"ids.{dtype}",
                       "--tokens-dtype", dtype, "--tokens-shape", "2,6", "-o", tmp_path / "r.safetensors")
        assert r.returncode == 0, r.stderr
        assert np.array_equal(golden.read(tmp_path / "r.safetensors").tensors["tokens"], ids[:12].reshape(2, 6))
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp_path / "ids.int32", "-o", tmp_path / "x.st")
    assert r.returncode == 1 and "--tokens-dtype" in r.stderr and r.stderr.count("\n") == 1
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokens", tmp / "model.bin", "-o", tmp_path / "x.st")
    assert r.returncode == 1 and "pass it as --model" in r.stderr
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "Hello", "-o", tmp_path / "x.st")
    assert r.returncode == 1 and "--tokens" in r.stderr and r.stderr.count("\n") == 1


def test_golden_with_llmc_tokenizer_names_the_text(tmp_path, files):
    tmp, model, tokens, g, _ = files

    class Toy:
        vocab_size, eot_token = CFG.d_vocab, CFG.d_vocab - 1

        def decode_bytes(self, ids):
            return b"".join(bytes([97 + int(i) % 26]) for i in ids)

    llmc.write_tokenizer(tmp_path / "tok.bin", Toy())
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokenizer", tmp_path / "tok.bin", "--tokens",
                   tmp / "state.bin", "-o", tmp_path / "g.safetensors")
    assert r.returncode == 0 and "text of the first row (llm.c tokenizer)" in r.stdout, r.stderr
    r = refgpt_cli("golden", "--model", tmp / "model.bin", "--tokenizer", tmp_path / "tok.bin", "Hi", "-o", tmp_path / "g")
    assert r.returncode == 1 and "cannot encode TEXT" in r.stderr


def test_hints_for_swapped_arguments_and_llmc_names_without_the_map(files, tmp_path):
    tmp, model, tokens, g, _ = files
    path = llmc_dump.write_dump(tmp_path / "dump.bin", CFG, run_tensors(g))
    swapped = refgpt_cli("compare", path, tmp / "golden.safetensors", "--map", "llmc")
    assert swapped.returncode == 1 and "arguments swapped" in swapped.stderr and swapped.stderr.count("\n") == 1
    no_map = refgpt_cli("compare", tmp / "golden.safetensors", path)
    assert no_map.returncode == 1 and "pass --map llmc" in no_map.stderr
    run = run_tensors(g)
    np.savez(tmp_path / "named.npz", **{k: v for k, v in run.items() if not k.startswith("grads")})
    named = refgpt_cli("compare", tmp / "golden.safetensors", tmp_path / "named.npz")
    assert named.returncode == 1 and "names its tensors as llm.c does" in named.stderr and "--map llmc" in named.stderr
    assert oracle.compare(g, tmp_path / "named.npz", name_map="llmc").ok


def test_gradients_over_other_targets_are_refused_with_the_fix(files, tmp_path):
    tmp, model, tokens, g, _ = files
    next_token = golden.make(llmc_model(), g.tensors["tokens"], backward=True)  # targets inside the tokens
    path = llmc_dump.write_dump(tmp_path / "dump.bin", CFG, run_tensors(g))
    with pytest.raises(RefGPTError, match="refgpt golden --tokens"):
        oracle.compare(next_token, path, name_map="llmc")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_fuzzed_llmc_dump_without_map_gets_the_hint(files, tmp_path_factory, data):
    tmp, model, tokens, g, _ = files
    raw = bytearray((tmp / "state.bin").read_bytes()[:4096])
    for _ in range(data.draw(st.integers(0, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = tmp_path_factory.mktemp("fuzz") / "acts.bin"
    path.write_bytes(bytes(raw))
    r = refgpt_cli("compare", tmp / "golden.safetensors", path)
    assert r.returncode == 1 and "pass --map llmc" in r.stderr and r.stderr.count("\n") == 1, r.stderr
