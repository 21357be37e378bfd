"""llm.c's binary formats: checkpoints (float32 and bfloat16, padded vocabulary), the tokenizer,
the debug state and a raw activations dump, each written and read back, laid out as llm.c lays
them out, and each header guard giving an error that names the file and what is wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import refgpt
from random_models import hf_tensors, random_params
from refgpt import Config, Model, RefGPTError
from refgpt.dtypes import round_to_bfloat16, widen_bfloat16
from refgpt.oracle import golden, llmc, comparison as oracle

CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=12)


def llmc_model(cfg=CFG, seed=0, dtype="float64"):
    """A random model llm.c can hold: float32-representable weights, W_U tied to W_Eᵀ."""
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(cfg, seed).items()}
    p["unembed.W_U"] = p["embed.W_E"].T
    return Model(cfg, p, dtype=dtype)


def params_equal(a: Model, b: Model) -> bool:
    return set(a.params) == set(b.params) and all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


def test_float32_checkpoint_round_trips_exactly(tmp_path):
    model = llmc_model()
    path = llmc.write_model(tmp_path / "m.bin", model)
    back = llmc.read_model(path)
    assert back.cfg == model.cfg
    assert params_equal(back, model)
    # Same layout too (row-major, W_U a view of W_E), so the same BLAS kernels run: NumPy's matmul
    # sums in another order for a column-major operand, and the logits would differ in the last bits.
    assert all(back.params[k].strides == model.params[k].strides for k in model.params)
    tokens = np.array([[1, 7, 3, 49]])
    assert np.array_equal(back(tokens), model(tokens))
    assert llmc.write_model(tmp_path / "again.bin", back).read_bytes() == path.read_bytes()


def test_header_and_padded_vocabulary_are_laid_out_as_llmc_reads_them(tmp_path):
    model = llmc_model()
    path = llmc.write_model(tmp_path / "m.bin", model)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:8]) == [20240326, 3, 12, 50, 2, 4, 16, 128]  # magic, version, maxT, V, L, NH, C, Vp
    assert not header[8:].any()
    n = sum(int(np.prod(s)) for s in llmc.parameter_shapes(12, 128, 2, 16).values())
    assert path.stat().st_size == 1024 + 4 * n
    wte = np.fromfile(path, dtype="<f4", offset=1024, count=128 * 16).reshape(128, 16)
    assert np.array_equal(wte[:50], model.W_E) and not wte[50:].any()  # padded rows are zeros
    custom = llmc.write_model(tmp_path / "p.bin", model, padded_vocab_size=64)
    assert np.fromfile(custom, dtype="<i4", count=8)[7] == 64
    assert params_equal(llmc.read_model(custom), model)


def test_llmc_weights_are_hf_conv1d_weights_transposed():
    """llm.c's exporter writes nn.Linear [out, in] weights: the transpose of HF's Conv1D [in, out]."""
    model = llmc_model()
    t, hf = llmc.llmc_parameters(model), hf_tensors(model, prefix="")
    for L in range(CFG.n_layers):
        h = f"h.{L}."
        assert np.array_equal(t["qkvw"][L], hf[h + "attn.c_attn.weight"].T)
        assert np.array_equal(t["qkvb"][L], hf[h + "attn.c_attn.bias"])
        assert np.array_equal(t["attprojw"][L], hf[h + "attn.c_proj.weight"].T)
        assert np.array_equal(t["fcw"][L], hf[h + "mlp.c_fc.weight"].T)
        assert np.array_equal(t["fcprojw"][L], hf[h + "mlp.c_proj.weight"].T)
        assert np.array_equal(t["ln2w"][L], hf[h + "ln_2.weight"])
    assert list(t) == list(llmc.PARAMETERS)


def test_bfloat16_checkpoint_rounds_to_nearest_even_and_round_trips(tmp_path):
    model = llmc_model()
    path = llmc.write_model(tmp_path / "m.bin", model, dtype="bfloat16")
    assert np.fromfile(path, dtype="<i4", count=2)[1] == 5
    back = llmc.read_model(path)
    for name, value in model.params.items():
        expected = widen_bfloat16(round_to_bfloat16(value.astype(np.float32)))
        assert np.array_equal(back.params[name], expected), name
    assert llmc.write_model(tmp_path / "again.bin", back, dtype="bfloat16").read_bytes() == path.read_bytes()


def test_bfloat16_rounding_matches_hand_computed_ties():
    one, next_up = np.float32(1.0), np.float32(1.0 + 2.0**-7)  # adjacent bfloat16 values
    half_way = np.float32(1.0 + 2.0**-8)  # a tie: rounds to even (1.0, mantissa ...0)
    above = np.float32(1.0 + 2.0**-8 + 2.0**-20)
    assert widen_bfloat16(round_to_bfloat16([one, half_way, above]))[:].tolist() == [1.0, 1.0, float(next_up)]
    three_halfway = np.float32(1.0 + 3 * 2.0**-8)  # tie between 1+2⁻⁷ (odd) and 1+2⁻⁶ (even)
    assert float(widen_bfloat16(round_to_bfloat16([three_halfway]))[0]) == 1.0 + 2.0**-6


def test_models_llmc_cannot_hold_are_refused(tmp_path):
    untied = Model(CFG, random_params(CFG, 1))
    with pytest.raises(RefGPTError, match="not W_Eᵀ"):
        llmc.write_model(tmp_path / "m.bin", untied)
    cfg = Config(d_model=16, n_layers=1, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=4, act_fn="relu", eps=1e-3)
    with pytest.raises(RefGPTError, match=r"d_mlp=32.*act_fn='relu'.*eps=0.001"):
        llmc.write_model(tmp_path / "m.bin", llmc_model(cfg))
    with pytest.raises(RefGPTError, match="float32 or bfloat16"):
        llmc.write_model(tmp_path / "m.bin", llmc_model(), dtype="float16")


def _patched(path, dest, index, value):
    data = bytearray(path.read_bytes())
    data[4 * index: 4 * index + 4] = np.int32(value).tobytes()
    dest.write_bytes(bytes(data))
    return dest


def test_checkpoint_header_guards_name_the_file_and_the_fault(tmp_path):
    good = llmc.write_model(tmp_path / "m.bin", llmc_model())
    with pytest.raises(RefGPTError, match=r"bad\.bin: bad magic number 20240328, expected 20240326 .*it is an llm.c tokenizer"):
        llmc.read_model(_patched(good, tmp_path / "bad.bin", 0, 20240328))
    with pytest.raises(RefGPTError, match=r"v4\.bin: llm.c checkpoint version 4; refgpt reads version 3 \(float32\) and 5"):
        llmc.read_model(_patched(good, tmp_path / "v4.bin", 1, 4))
    cut = tmp_path / "cut.bin"
    cut.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(RefGPTError, match=r"cut\.bin: truncated: the header describes 2 layers of width 16"):
        llmc.read_model(cut)
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(good.read_bytes()[:100])
    with pytest.raises(RefGPTError, match=r"tiny\.bin: truncated: 100 bytes, shorter than llm.c's 1024-byte header"):
        llmc.read_model(tiny)
    long = tmp_path / "long.bin"
    long.write_bytes(good.read_bytes() + b"\0" * 8)
    with pytest.raises(RefGPTError, match="8 bytes after the last parameter"):
        llmc.read_model(long)
    with pytest.raises(RefGPTError, match="padded_vocab_size = 10 is smaller than vocab_size = 50"):
        llmc.read_model(_patched(good, tmp_path / "vp.bin", 7, 10))
    with pytest.raises(RefGPTError, match="file not found"):
        llmc.read_model(tmp_path / "absent.bin")


def test_tokenizer_round_trips_every_token_and_the_eot_id(tmp_path):
    tok = refgpt.load_default().tokenizer
    path = llmc.write_tokenizer(tmp_path / "tok.bin", tok)
    header = np.fromfile(path, dtype="<i4", count=4)
    assert list(header) == [20240328, 2, tok.vocab_size, tok.eot_token]
    back = llmc.read_tokenizer(path)
    assert back.eot_token == tok.eot_token
    assert back.tokens == [tok.decode_bytes([i]) for i in range(tok.vocab_size)]
    ids = tok.encode("Hello, world")
    assert back.decode_bytes(ids) == b"Hello, world"


def test_tokenizer_header_guards(tmp_path):
    tok = refgpt.load_default().tokenizer
    good = llmc.write_tokenizer(tmp_path / "tok.bin", tok)
    with pytest.raises(RefGPTError, match="tokenizer version 3; refgpt reads versions 1 and 2"):
        llmc.read_tokenizer(_patched(good, tmp_path / "v3.bin", 1, 3))
    with pytest.raises(RefGPTError, match="version-1 tokenizer with 8192 tokens"):  # the default's vocabulary
        llmc.read_tokenizer(_patched(good, tmp_path / "v1.bin", 1, 1))
    cut = tmp_path / "cut.bin"
    cut.write_bytes(good.read_bytes()[:-3])
    with pytest.raises(RefGPTError, match=r"cut\.bin: truncated at token 8191 of 8192"):  # in <|endoftext|>
        llmc.read_tokenizer(cut)
    with pytest.raises(RefGPTError, match="bad magic number 20240326, expected 20240328 .*it is an llm.c model checkpoint"):
        llmc.read_tokenizer(llmc.write_model(tmp_path / "m.bin", llmc_model()))


def test_debug_state_holds_refgpt_logits_and_mean_loss(tmp_path):
    model = llmc_model()
    tokens = np.random.default_rng(0).integers(0, CFG.d_vocab, size=(3, 9))
    path = llmc.write_debug_state(tmp_path / "state.bin", model, tokens, grads=False)  # gradients: test_backward.py
    assert list(np.fromfile(path, dtype="<i4", count=4)) == [20240327, 2, 3, 8]
    state = llmc.read_debug_state(path, CFG.d_vocab)
    assert np.array_equal(state.x, tokens[:, :-1]) and np.array_equal(state.y, tokens[:, 1:])
    assert np.array_equal(state.logits, model(tokens[:, :-1]).astype(np.float32))
    g = golden.compute(model, tokens)  # loss[b, t] = −log p(tokens[b, t + 1]); the state's mean matches
    assert state.loss == np.float32(np.mean(g["loss"]))
    assert state.grads is None
    grads = np.arange(10, dtype="<f4")
    (tmp_path / "with_grads.bin").write_bytes(path.read_bytes() + grads.tobytes())
    for cfg in (None, CFG):  # bytes after the loss that are not this model's gradients: refused, with or without cfg
        with pytest.raises(RefGPTError, match="after the loss"):
            llmc.read_debug_state(tmp_path / "with_grads.bin", CFG.d_vocab, cfg)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(RefGPTError, match=r"truncated: the header describes x, y, logits \[3, 8, 50\]"):
        llmc.read_debug_state(cut, CFG.d_vocab)
    with pytest.raises(RefGPTError, match="debug state version 1"):
        llmc.read_debug_state(_patched(path, tmp_path / "v1.bin", 1, 1), CFG.d_vocab)


@pytest.mark.parametrize("grads", [False, True])
def test_debug_state_refuses_a_vocab_size_that_does_not_fit_the_file(tmp_path, grads):
    """Issue 37 (found by fuzzing): V one short of the file's (8191 of 8192) left B·T floats after the
    "loss", which were read as gradients, and every logit misaligned, without a word."""
    model = llmc_model()
    tokens = np.random.default_rng(1).integers(0, CFG.d_vocab, size=(2, 5))
    path = llmc.write_debug_state(tmp_path / "state.bin", model, tokens, grads=grads)
    V = CFG.d_vocab
    assert llmc.read_debug_state(path, V, CFG if grads else None).logits.shape == (2, 4, V)
    for v, cfg in ((V - 1, None), (V - 2, None), (V - 1, dataclasses.replace(CFG, d_vocab=V - 1))):
        with pytest.raises(RefGPTError, match=r"^\S*state\.bin: .*after the loss") as error:
            llmc.read_debug_state(path, v, cfg)
        assert f"{v}" in str(error.value) and "\n" not in str(error.value)
        if not grads and cfg is None:
            assert f"vocab_size {V} would fit one exactly" in str(error.value)
    with pytest.raises(RefGPTError, match="after the loss" if grads else "truncated"):
        llmc.read_debug_state(path, V + 1)


def test_llmc_activations_dump_compares_clean_and_locates_an_error(tmp_path):
    model = llmc_model(dtype="float64")
    tokens = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    ref = golden.make(model, tokens)
    m32 = llmc_model(dtype="float32")
    acts = llmc.write_activations(tmp_path / "acts.bin", golden.compute(m32, tokens), CFG)
    report = oracle.compare(ref, acts, name_map="llmc")
    assert report.ok, report.table()
    assert report["blocks.1.attn.hook_attn_scores"].ok and report["probs"].ok
    assert "blocks.0.ln1.out" in [t.name for t in report.tensors]

    def bump(a, name):
        a = a.copy()
        a[1, 4, 37] += 0.05
        return a

    bad = golden.compute(m32, tokens, fwd_hooks=[("blocks.1.mlp.hook_post", bump)])
    report = oracle.compare(ref, llmc.write_activations(tmp_path / "bad.bin", bad, CFG), name_map="llmc")
    first = report.first_divergence
    assert first.name == "blocks.1.mlp.hook_post" and first.first_bad.index == (1, 4, 37)


def test_llmc_activations_of_the_wrong_size_are_refused(tmp_path):
    model = llmc_model()
    tokens = np.array([[3, 1, 4, 1]])
    ref = golden.make(model, tokens)
    path = tmp_path / "acts.bin"
    path.write_bytes(b"\0" * 4000)
    with pytest.raises(RefGPTError, match=r"acts\.bin: 4000 bytes is not llm.c's acts_memory for B=1, T=4"):
        oracle.compare(ref, path, name_map="llmc")
