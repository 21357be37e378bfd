"""q, k and v as one product (issue 17): W_QKV = W_Q | W_K | W_V is a view of the checkpoint's
c_attn when loaded from HF's layout, one copy otherwise, and ``joined_columns`` only ever returns a
view when the parts really lie side by side in one buffer."""

from __future__ import annotations

import numpy as np

import refgpt
from random_models import random_model, save_checkpoint
from refgpt import Config
from refgpt.gpt2.params import joined_columns

CFG = Config(d_model=12, n_layers=2, n_heads=3, d_mlp=20, d_vocab=17, n_ctx=9)


def test_fused_qkv_is_a_view_of_c_attn(tmp_path):
    model = refgpt.load(save_checkpoint(random_model(CFG, seed=1), tmp_path))
    _, w, _ = model.block_weights(1)
    assert not w["W_QKV"].flags.owndata and not w["W_QKV"].flags.writeable
    assert np.shares_memory(w["W_QKV"], model.params["blocks.1.attn.W_V"])
    assert not w["b_QKV"].flags.owndata and np.shares_memory(w["b_QKV"], model.params["blocks.1.attn.b_V"])  # c_attn.bias
    for i, x in enumerate("QKV"):
        flat = model.params[f"blocks.1.attn.W_{x}"].transpose(1, 0, 2).reshape(CFG.d_model, -1)
        assert np.array_equal(w["W_QKV"][:, i * CFG.d_model:(i + 1) * CFG.d_model], flat)
        assert np.array_equal(w["b_QKV"][i * CFG.d_model:(i + 1) * CFG.d_model], model.params[f"blocks.1.attn.b_{x}"].reshape(-1))


def test_fused_qkv_of_circuits_params_is_one_copy_the_parts_view():
    model = random_model(CFG, seed=2)
    _, w, _ = model.block_weights(0)
    assert w["W_QKV"].flags.owndata and np.shares_memory(w["W_Q"], w["W_QKV"]) and np.shares_memory(w["b_K"], w["b_QKV"])
    expected = np.concatenate([model.params[f"blocks.0.attn.W_{x}"].transpose(1, 0, 2).reshape(CFG.d_model, -1)
                               for x in "QKV"], axis=1)
    assert np.array_equal(w["W_QKV"], expected)


def test_joined_columns_views_only_adjacent_parts():
    W = np.arange(5 * 12.0).reshape(5, 12)
    view = joined_columns([W[:, :4], W[:, 4:8], W[:, 8:]])
    assert not view.flags.owndata and np.array_equal(view, W)
    for parts in ([W[:, :4], W[:, 8:], W[:, 4:8]],  # out of order
                  [W[:, :4], W[:, 4:8]],  # a row of the two is not a row of W
                  [W[:, :4], np.ones((5, 4)), W[:, 8:]],  # not one buffer
                  [W[::2, :4], W[::2, 4:8], W[::2, 8:]]):  # every other row: still adjacent, rows strided
        joined = joined_columns(parts)
        assert np.array_equal(joined, np.concatenate(parts, axis=-1))
    b = np.arange(12.0)
    assert not joined_columns([b[:4], b[4:8], b[8:]]).flags.owndata  # one axis (b_Q | b_K | b_V): a view too
    # Arrays of their own that merely lie next to each other in memory: a view of the first could not
    # keep the others' memory alive, so they are copied (nothing is viewed beyond the first's own array).
    buffer = np.arange(12.0).tobytes()
    apart = [np.frombuffer(buffer, count=4, offset=32 * i) for i in range(3)]
    assert all(p.base is buffer for p in apart)
    joined = joined_columns(apart)
    assert joined.flags.owndata and np.array_equal(joined, np.arange(12.0))


def test_joined_columns_never_views_beyond_the_array_the_first_part_belongs_to():
    """Q and K in one array, V right after them in memory but outside that array: the last part
    decides (its end must lie inside the first part's array), so the three are copied."""
    n, d = 4, 3
    memory = bytearray(np.arange(n * 3 * d, dtype=np.float64).tobytes())  # rows of [Q | K | V]
    big = np.frombuffer(memory, np.float64)  # [n·3d]
    qk = np.frombuffer(memory, np.float64, count=n * 3 * d - d)  # an array of its own, ending where the last V begins
    assert not isinstance(qk.base, np.ndarray)  # a root: joined_columns looks no further
    rows = (3 * d * 8, 8)
    q, k = (np.ndarray((n, d), np.float64, buffer=qk, offset=8 * d * i, strides=rows) for i in range(2))
    v = np.ndarray((n, d), np.float64, buffer=big, offset=8 * 2 * d, strides=rows)
    joined = joined_columns([q, k, v])
    assert joined.flags.owndata and np.array_equal(joined, big.reshape(n, 3 * d))


def test_attention_joins_separate_w_q_w_k_w_v_into_the_same_numbers():
    """attention() also takes a block's weights as W_Q, W_K, W_V and b_Q, b_K, b_V only (what
    a caller outside the model, e.g. the backward's tests, has) and joins them: the same output,
    bit for bit, as from the model's fused W_QKV."""
    from refgpt.gpt2.attention import attention

    class Silent:
        def __call__(self, name, a):
            return a

        def watched(self, name):
            return False

        def hooked(self, name):
            return False

    model = random_model(CFG, seed=3)
    _, w, _ = model.block_weights(1)
    separate = {k: v for k, v in w.items() if k not in ("W_QKV", "b_QKV")}
    x = np.random.default_rng(0).standard_normal((2, CFG.n_ctx, CFG.d_model))  # [batch, pos, d_model]
    fused = attention(x, w, CFG.n_heads, CFG.score_scale(1), Silent())
    assert np.array_equal(attention(x, separate, CFG.n_heads, CFG.score_scale(1), Silent()), fused)
