"""Ported from TransformerLens 3.9's tests/unit/test_weight_processing.py (the GPT-2 cases: LayerNorm,
standard positions, no GQA/MoE/gated MLP/RMSNorm/rotary) and the weight helpers of
HookedTransformer: each step runs on TransformerLens's ``ProcessWeights`` (the state dict of the
TL model) and on ``refgpt.tl.processing`` (the same weights), and every resulting array is compared.

Departures, on purpose (docs/transformerlens.md): refgpt's steps take and return plain dicts of
NumPy arrays and a Config; ``process_weights(model, …)`` returns a new Model (TransformerLens's
``process_weights_`` edits the model in place; refgpt's weights are read-only);
``accumulated_bias`` sums in the model's dtype (TransformerLens sums into float32 zeros).
"""

from __future__ import annotations

import numpy as np
import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import tl_port  # noqa: E402
from tl_port import N, close  # noqa: E402
from refgpt.tl import processing  # noqa: E402
from transformer_lens.weight_processing import ProcessWeights  # noqa: E402


@pytest.fixture
def pair(tl_pair):
    """(refgpt's NumPy model, TransformerLens): these bodies test refgpt.tl.processing's functions; the
    torch-facing model's processing methods are tests/tl_torch/test_torch_model.py's."""
    return tl_pair  # built once per session, reset around each test (tests/conftest.py)


def tl_state(tl):
    return {k: v.detach().clone() for k, v in tl.state_dict().items() if not k.endswith(("IGNORE", "mask"))}


def compare(ref_params, tl_params, tol=P.TL_TOL):
    for name, value in ref_params.items():
        assert name in tl_params, name
        assert close(value, tl_params[name], tol), name


def test_fold_layer_norm_basic_and_its_switches(pair):
    ref, tl = pair
    for kw in ({}, {"fold_biases": False}, {"center_weights": False}, {"fold_biases": False, "center_weights": False}):
        original = tl_state(tl)
        processed_tl = ProcessWeights.fold_layer_norm(original, tl.cfg, **kw)
        for k, v in tl_state(tl).items():  # the original dict is not modified
            assert torch.equal(original[k], v), k
        processed = processing.fold_layer_norm(ref.params, ref.cfg, **kw)
        for L in range(ref.cfg.n_layers):
            for ln in ("ln1", "ln2"):
                assert np.all(processed[f"blocks.{L}.{ln}.w"] == 1)
                if kw.get("fold_biases", True):
                    assert np.all(processed[f"blocks.{L}.{ln}.b"] == 0)
        compare(processed, {k: N(v) for k, v in processed_tl.items()})


def test_center_writing_weights_unembed_and_value_biases(pair):
    ref, tl = pair
    state = tl_state(tl)
    for name, tl_fn, ref_fn in (
        ("center_writing_weights", lambda s: ProcessWeights.center_writing_weights(s, tl.cfg),
         lambda p: processing.center_writing_weights(p, ref.cfg)),
        ("center_unembed", ProcessWeights.center_unembed, processing.center_unembed),  # no cfg, as TL
        ("fold_value_biases", lambda s: ProcessWeights.fold_value_biases(s, tl.cfg),
         lambda p: processing.fold_value_biases(p, ref.cfg)),
    ):
        processed = ref_fn({**ref.params, "unembed.b_U": ref.b_U})
        compare(processed, {k: N(v) for k, v in tl_fn(dict(state)).items()})
        if name == "center_writing_weights":
            for k in ("embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_O", "blocks.1.mlp.b_out"):
                assert np.abs(processed[k].mean(-1)).max() <= 1e-15
        if name == "fold_value_biases":
            assert not processed["blocks.0.attn.b_V"].any()


@pytest.mark.parametrize("selection", [{}, {"center_unembed": False, "fold_value_biases": False},
                                       {"refactor_factored_attn_matrices": True}])
def test_process_weights_full_pipeline(pair, selection):
    ref, tl = pair
    processed_tl = ProcessWeights.process_weights(tl_state(tl), tl.cfg, **selection)
    processed = processing.process_weights(ref, **selection)  # a new Model
    tol = 1e-9 if selection.get("refactor_factored_attn_matrices") else P.TL_TOL  # SVD: factors agree up to the solver
    if not selection.get("refactor_factored_attn_matrices"):
        # DEPARTURE: TL's process_weights rounds float64 weights to float32 on the way (W_E's
        # float32 rounding is 6e-8 relative); refgpt stays in float64. Each step alone agrees to
        # 1e-11 above, so here the bound is float32's.
        compare(processed.params, {k: N(v) for k, v in processed_tl.items()}, 1e-6)
        W_E = N(processed_tl["embed.W_E"])
        assert np.array_equal(W_E.astype(np.float32).astype(np.float64), W_E)  # TL's: float32 values
    tokens = ref.to_tokens("The processed model computes the same thing")
    unprocessed = ref(tokens)
    logp = lambda x: x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)  # noqa: E731
    assert close(logp(processed(tokens)), logp(unprocessed), tol)


def test_weight_helpers_equal_tl(pair):
    ref, tl = pair
    assert close(ref.W_E_pos, tl.W_E_pos)
    assert close(ref.QK.AB, tl.QK.AB) and close(ref.OV.AB, tl.OV.AB)
    assert close(ref.OV[1, 0].AB, tl.OV[1, 0].AB) and close(ref.QK.T.AB, tl.QK.T.AB)
    assert tuple(ref.OV.shape) == tuple(tl.OV.shape)
    for layer in range(ref.cfg.n_layers + 1):
        for mlp_input in ([False, True] if layer < ref.cfg.n_layers else [False]):
            for include in (True, False):
                got = ref.accumulated_bias(layer, mlp_input=mlp_input, include_mlp_biases=include)
                want = tl.accumulated_bias(layer, mlp_input=mlp_input, include_mlp_biases=include)
                assert close(got, want, 1e-6)  # DEPARTURE: TL sums into float32 zeros
    for t in (" be", 318, np.array([[318, 11], [13, 262]])):
        tl_t = torch.tensor(t) if isinstance(t, np.ndarray) else t
        assert close(ref.tokens_to_residual_directions(t), tl.tokens_to_residual_directions(tl_t))
    assert ref.all_head_labels() == tl.all_head_labels()


def test_cfg_fields_are_tl_for_gpt2(pair):
    ref, tl = pair
    for field in ("default_prepend_bos", "normalization_type", "positional_embedding_type", "original_architecture",
                  "d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "d_vocab_out", "n_ctx", "act_fn",
                  "eps", "use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in",
                  "use_hook_tokens", "attention_dir", "n_key_value_heads"):
        assert getattr(ref.cfg, field) == getattr(tl.cfg, field), field
    assert str(ref.cfg.device) == str(tl.cfg.device) == "cpu"
    # DEPARTURE (docs/transformerlens.md 2.22): TL wraps GPT-2's tokenizer to add BOS itself;
    # refgpt's tokenizer never does (to_tokens adds it), and the field says so
    assert tl.cfg.tokenizer_prepends_bos and tl.tokenizer.encode("") == [50256]
    assert not ref.cfg.tokenizer_prepends_bos and ref.tokenizer.encode("") == []
    assert ref.cfg.attn_scale == tl.cfg.attn_scale == ref.cfg.d_head ** 0.5  # a divisor, as TL's


def test_numpy_factored_matrix_is_tl_s(pair):
    """refgpt.tl.circuits.FactoredMatrix (the NumPy model's QK/OV) against TL's on the same factors:
    the product, its SVD (up to each singular vector's sign: NumPy's LAPACK is not torch's), the
    singular values, norm, eigenvalues (as a multiset), make_even, indexing, products, TL's repr."""
    from transformer_lens import FactoredMatrix as TLFactoredMatrix
    from refgpt.tl.circuits import FactoredMatrix

    ref, tl = pair
    rng = np.random.default_rng(0)
    C = rng.standard_normal((ref.cfg.d_model, 5))
    for ours, theirs in ((ref.OV, tl.OV), (ref.QK[2], tl.QK[2]), (ref.OV[1, 1] @ C, tl.OV[1, 1] @ torch.tensor(C)),
                         (C.T @ ref.OV[0], torch.tensor(C.T) @ tl.OV[0]), (ref.OV * 2.5, tl.OV * 2.5)):
        assert tuple(ours.shape) == tuple(theirs.shape) and (ours.ldim, ours.mdim, ours.rdim) == (theirs.ldim, theirs.mdim, theirs.rdim)
        assert close(ours.AB, theirs.AB) and close(ours.S, theirs.S) and close(ours.norm(), theirs.norm())
        U, S, V = ours.svd()
        assert close(U * S[..., None, :] @ np.swapaxes(V, -1, -2), theirs.AB)  # U·diag(S)·Vᵀ is the product
        signs = np.sign((U * N(theirs.U)).sum(-2, keepdims=True))  # ±1 per singular vector
        assert close(U * signs, theirs.U) and close(V * signs, theirs.V)
        assert close(ours.make_even().AB, theirs.AB) and close(ours.get_corner(2), theirs.get_corner(2))
        if ours.ldim == ours.rdim:
            key = lambda e: np.sort_complex(np.round(e, 9))  # noqa: E731
            assert close(key(ours.eigenvalues).real, key(N(theirs.eigenvalues)).real)
            assert close(key(ours.eigenvalues).imag, key(N(theirs.eigenvalues)).imag)
    assert repr(ref.OV).split("), Hidden")[1] == repr(tl.OV).split("), Hidden")[1]  # (NumPy's shape is a tuple)
    assert repr(FactoredMatrix(np.ones((3, 2)), np.ones((2, 3)))) == "FactoredMatrix: Shape((3, 3)), Hidden Dim(2)"
    A, B = rng.standard_normal((4, 2)), rng.standard_normal((2, 4))
    assert close(FactoredMatrix(A, B)[1:3].AB, TLFactoredMatrix(torch.tensor(A), torch.tensor(B))[1:3].AB)
    assert close(FactoredMatrix(A, B) @ A[:, 0], TLFactoredMatrix(torch.tensor(A), torch.tensor(B)) @ torch.tensor(A[:, 0]))
