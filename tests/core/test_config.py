"""Config: every validation rule at its boundary, HF's defaults and n_inner rule, the attention
scale, and the errors naming the file. (The defaults against transformers.GPT2Config() itself:
test_peers_boundaries.py.)"""

from __future__ import annotations

import json
import math

import pytest

from refgpt import Config, RefGPTError
from refgpt.gpt2.config import TL_SWITCHES
from refgpt.files.checkpoint import expected_shapes

BASE = dict(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)


def cfg(**changes):
    return Config(**{**BASE, **changes})


@pytest.mark.parametrize("name", ["d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx"])
def test_sizes_must_be_positive_integers(name):
    smallest = {**BASE, name: 1, "d_model": 8 if name != "n_heads" else 8}
    if name == "d_model":
        smallest["n_heads"] = 1
    Config(**smallest)  # 1 is allowed
    for bad in (0, -1, True, 8.0, "8", None):
        with pytest.raises(RefGPTError, match=f"config: {name} must be a positive integer, found {bad!r}"):
            cfg(**{name: bad})


@pytest.mark.parametrize("name", ["d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx"])
def test_sizes_are_at_most_the_largest_32_bit_index(name):
    """MAX_SIZE at its boundary: 2³¹ − 1 (the largest signed 32-bit index) is allowed, 2³¹ refused.
    (A Config is numbers only: nothing is allocated.)"""
    heads = {"n_heads": 2**31 - 1, "d_model": 2**31 - 1} if name in ("d_model", "n_heads") else {}  # 2³¹ − 1 is prime
    assert getattr(cfg(**{name: 2**31 - 1, **heads}), name) == 2**31 - 1
    with pytest.raises(RefGPTError, match=rf"config: {name}=2147483648 is larger than any GPT-2 refgpt can hold \(at most 2147483647\)"):
        cfg(**{**heads, name: 2**31})


def test_heads_must_divide_the_width():
    with pytest.raises(RefGPTError, match="config: n_head=3 does not divide n_embd=8"):
        cfg(n_heads=3)
    assert cfg(n_heads=8).d_head == 1 and cfg(n_heads=1).d_head == 8 and cfg(n_heads=4).d_head == 2


def test_activation_must_be_known():
    with pytest.raises(RefGPTError, match="unknown activation_function 'gelu_old'; refgpt knows \\['gelu'"):
        cfg(act_fn="gelu_old")


def test_eps_must_be_a_finite_number_above_zero():
    """ε = 0 makes a constant vector's LayerNorm 0/0; ε = ∞ makes every LayerNorm output its bias."""
    assert cfg(eps=1e-300).eps == 1e-300 and cfg(eps=1).eps == 1
    for bad in (0, 0.0, -1e-5, math.nan, math.inf, True, "1e-5", None):
        with pytest.raises(RefGPTError, match="config: layer_norm_epsilon must be a finite number > 0"):
            cfg(eps=bad)


@pytest.mark.parametrize("name", ["use_attn_scale", "scale_attn_by_inverse_layer_idx",
                                  "reorder_and_upcast_attn", "tie_word_embeddings"])
def test_flags_must_be_booleans(name):
    assert getattr(cfg(**{name: False}), name) is False and getattr(cfg(**{name: True}), name) is True
    for bad in (1, 0, "true", None):
        with pytest.raises(RefGPTError, match=f"config: {name} must be true or false, found {bad!r}"):
            cfg(**{name: bad})


def test_n_params_counts_every_stored_weight_once():
    """GPT-2 small holds 124,439,808 numbers (HF's num_parameters(); a tied W_U is W_Eᵀ, counted once).
    A small config, d_mlp ≠ 4·d_model: the sizes of every tensor of its HF checkpoint, lm_head when untied."""
    small = Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)
    assert small.n_params() == 124_439_808
    for c in (cfg(), cfg(tie_word_embeddings=False)):
        assert c.n_params() == sum(math.prod(shape) for shape in expected_shapes(c).values())


def test_bytes_needed_is_the_weights_and_one_pass_largest_activations():
    """Per token: the residual stream and q, k, v (4·d_model), a row of attention scores per head
    (n_heads·pos), the MLP's hidden layer (d_mlp), the logits (d_vocab); for batch × pos tokens."""
    c = cfg()  # d_model 8, n_heads 2, d_mlp 12, d_vocab 11, n_ctx 6
    assert c.bytes_needed(8, batch=3, pos=5) == 8 * (c.n_params() + 3 * 5 * (4 * 8 + 2 * 5 + 12 + 11))
    assert c.bytes_needed(4) == 4 * (c.n_params() + 1 * 6 * (4 * 8 + 2 * 6 + 12 + 11))  # one sequence of n_ctx


def test_available_memory_is_memavailable_else_the_free_pages(monkeypatch):
    """/proc/meminfo's MemAvailable (kB) in bytes; without it (no such line, or no /proc) the free
    physical pages × the page size; None where neither exists."""
    import io
    import os

    import refgpt.gpt2.config

    pages = {"SC_AVPHYS_PAGES": 5, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    meminfo = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    1234567 kB\n"
    monkeypatch.setattr(refgpt.gpt2.config, "open", lambda *a, **k: io.StringIO(meminfo), raising=False)
    assert refgpt.gpt2.config.available_memory() == 1234567 * 1024
    meminfo = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"  # Linux < 3.14
    assert refgpt.gpt2.config.available_memory() == 5 * 4096

    def no_proc(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "/proc/meminfo")

    def no_sysconf(name):
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(refgpt.gpt2.config, "open", no_proc, raising=False)
    assert refgpt.gpt2.config.available_memory() == 5 * 4096
    monkeypatch.setattr(os, "sysconf", no_sysconf)
    assert refgpt.gpt2.config.available_memory() is None
    big = Config(d_model=2**12, n_layers=4, n_heads=1, d_mlp=2**12, d_vocab=2**10, n_ctx=2**10)
    big.check_fits_in_memory(8)  # nothing is known: nothing is refused
    monkeypatch.setattr(refgpt.gpt2.config, "available_memory", lambda: 3 * 2**29)
    with pytest.raises(RefGPTError, match=r"^config: this model needs at least 3\.2 GiB for its weights and one forward "
                                          r"pass in 64-bit floats \(411,213,824 parameters\), but the machine has 1\.5 GiB available$"):
        big.check_fits_in_memory(8)  # 3,474,259,968 bytes = 3.24 GiB


def test_a_bad_value_is_shown_cut_to_60_characters():
    """Errors show repr(value) whole up to 60 characters, else its first 57 and "..."; an integer of
    more than 200 bits by its size (refgpt.gpt2.config._shown)."""
    for n, shown in ((58, "'" + "x" * 58 + "'"), (59, "'" + "x" * 56 + "...")):  # reprs of 60 and 61 characters
        with pytest.raises(RefGPTError, match=rf"^config: unknown activation_function {shown}; refgpt knows"):
            cfg(act_fn="x" * n)
    for value, shown in ((2**199, str(2**199)), (2**200, "an integer of 201 bits")):  # 200 bits: 60 digits
        with pytest.raises(RefGPTError, match=f"^config: d_vocab={shown} is larger than any GPT-2"):
            cfg(d_vocab=value)


@pytest.mark.parametrize("name", sorted(TL_SWITCHES))
def test_tl_switches_default_as_transformer_lens_for_gpt2_and_are_not_compared(name):
    """TransformerLens's GPT-2 defaults: prepend BOS, a tokenizer that does not add one, every
    optional hook off. A switch changes no number of the forward pass: Configs that differ only in
    switches are equal (a loaded model's cfg equals its checkpoint's after a switch is flipped)."""
    c, other = cfg(), cfg()
    assert getattr(c, name) is (name == "default_prepend_bos")
    setattr(other, name, not getattr(other, name))
    assert other == c


def test_attention_scale():
    c = cfg(d_model=8, n_heads=2)  # d_head 4
    assert [c.score_scale(L) for L in (0, 1)] == [0.5, 0.5]
    assert cfg(use_attn_scale=False).score_scale(3) == 1.0
    inv = cfg(scale_attn_by_inverse_layer_idx=True)
    assert [inv.score_scale(L) for L in (0, 1, 3)] == [0.5, 0.25, 0.125]
    assert cfg(use_attn_scale=False, scale_attn_by_inverse_layer_idx=True).score_scale(2) == 1 / 3
    assert cfg(d_model=9, n_heads=1).score_scale(0) == 9 ** -0.5
    assert cfg(d_model=9, n_heads=1).attn_scale == 3.0  # TransformerLens's: the divisor √d_head
    assert cfg(d_model=9, n_heads=1, use_attn_scale=False).attn_scale == 1.0


def test_from_hf_translates_and_fills_defaults():
    hf = {"n_embd": 16, "n_layer": 3, "n_head": 4, "vocab_size": 7, "n_positions": 5, "layer_norm_epsilon": 1e-3,
          "activation_function": "relu", "scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True,
          "reorder_and_upcast_attn": True, "tie_word_embeddings": False}
    c = Config.from_hf(hf)
    assert c == Config(d_model=16, n_layers=3, n_heads=4, d_mlp=64, d_vocab=7, n_ctx=5, eps=1e-3, act_fn="relu",
                       use_attn_scale=False, scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True,
                       tie_word_embeddings=False)
    assert Config.from_hf({**hf, "n_inner": 10}).d_mlp == 10
    assert Config.from_hf({**hf, "n_inner": None}).d_mlp == 64
    assert Config.from_hf(c.to_hf()) == c
    assert Config.from_hf({**hf, "model_type": "gpt2", "add_cross_attention": False}) == c
    d = Config.from_hf({})
    assert (d.d_model, d.n_layers, d.n_heads, d.d_mlp, d.d_vocab, d.n_ctx, d.eps, d.act_fn) == \
        (768, 12, 12, 3072, 50257, 1024, 1e-5, "gelu_new")
    assert d.use_attn_scale and d.tie_word_embeddings
    assert not (d.scale_attn_by_inverse_layer_idx or d.reorder_and_upcast_attn)


def test_from_hf_refusals_name_the_source():
    with pytest.raises(RefGPTError, match="^x.json: expected a JSON object, found list$"):
        Config.from_hf([], source="x.json")
    with pytest.raises(RefGPTError, match="^x.json: model_type is 'llama', refgpt reads only 'gpt2'$"):
        Config.from_hf({"model_type": "llama"}, source="x.json")
    with pytest.raises(RefGPTError, match="^x.json: add_cross_attention=true is an encoder-decoder model"):
        Config.from_hf({"add_cross_attention": True}, source="x.json")
    with pytest.raises(RefGPTError, match="^x.json: d_model must be a positive integer, found '8'$"):
        Config.from_hf({"n_embd": "8"}, source="x.json")  # n_inner None: 4·'8' must not become '8888'
    with pytest.raises(RefGPTError, match="^x.json: n_head=5 does not divide n_embd=768"):
        Config.from_hf({"n_head": 5}, source="x.json")
    # Only the message's own "config:" prefix becomes the source; a value is shown as it was given.
    with pytest.raises(RefGPTError, match="^x.json: unknown activation_function 'config: gelu'; refgpt knows"):
        Config.from_hf({"activation_function": "config: gelu"}, source="x.json")


def test_from_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_embd": 8, "n_layer": 1, "n_head": 2}))
    assert Config.from_json(path).d_model == 8
    with pytest.raises(RefGPTError, match="absent.json: not found"):
        Config.from_json(tmp_path / "absent.json")
    path.write_text("{oops")
    with pytest.raises(RefGPTError, match="config.json: not valid JSON"):
        Config.from_json(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(RefGPTError, match="config.json: not valid JSON"):
        Config.from_json(path)


def test_config_is_frozen_and_from_json_takes_a_string(tmp_path):
    c = cfg()
    with pytest.raises(RefGPTError, match="d_model is fixed once the Config is made"):
        c.d_model = 16
    c.default_prepend_bos = False  # a TransformerLens switch may change, to True or False only
    assert c.default_prepend_bos is False
    for bad in (1, 0, None, "False"):
        with pytest.raises(RefGPTError, match=f"config: default_prepend_bos must be True or False, found {bad!r}"):
            c.default_prepend_bos = bad
    assert c.default_prepend_bos is False
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_embd": 8, "n_layer": 1, "n_head": 2}))
    assert Config.from_json(str(path)).d_model == 8
