"""Gradient goldens and their comparison: ``golden --backward`` writes ∂loss/∂ everything, compare
walks the gradients in backward order, and a bug planted in one op's backward — in a copy of
refgpt's own backward, and in HF/torch as a wrong custom autograd op — is named at that op.
The forward's bias bound names GELU with π = 3.14 at mlp.hook_post and ε outside the square root
at ln1.hook_scale."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

import refgpt.gpt2.activations as activations
import refgpt.gpt2.attention as attention
import refgpt.backward as backward
import refgpt.gpt2.layernorm as layernorm
import refgpt.gpt2.loss as loss
import refgpt.gpt2.mlp as mlp
from doc_pages import load_script
from refgpt import Config, Model
from refgpt.backward import loss_and_grads
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden
from refgpt.oracle.name_maps import backward_key, forward_order

ROOT = Path(__file__).resolve().parents[2]


example = load_script(ROOT / "docs" / "oracle_example.py")

CFG = Config(d_model=32, n_layers=2, n_heads=4, d_mlp=128, d_vocab=50, n_ctx=16)
TOKENS = np.random.default_rng(5).integers(0, CFG.d_vocab, size=(2, 12))  # [batch, pos]
LAST = CFG.n_layers - 1


@pytest.fixture(scope="module")
def ref():
    params = example.realistic_params(CFG, seed=4)
    params["unembed.W_U"] = params["embed.W_E"].T  # tied, as GPT-2: the golden adds grad.tied_W_E
    return params, golden.make(Model(CFG, params), TOKENS, backward=True)


def candidate(params, dtype="float32"):
    return golden.compute(Model(CFG, params, dtype=dtype), TOKENS, backward=True)


# ---- the golden's gradients ------------------------------------------------------------------------


def test_golden_backward_holds_the_loss_and_every_gradient_in_backward_order(ref):
    params, g = ref
    model = Model(CFG, params)
    grads = loss_and_grads(model, TOKENS)
    t = g.tensors
    assert float(t["loss_mean"]) == grads.loss and float(t["loss_mean"]) == pytest.approx(t["loss"].mean(), rel=1e-14)
    for name in model.hook_names:
        assert np.array_equal(t["grad." + name], grads.activations[name])
    for name in model.params:
        assert np.array_equal(t["grad." + name], grads.params[name])
    assert np.array_equal(t["grad.logits"], grads.logits)
    assert np.array_equal(t["grad.blocks.0.ln1.out"] * params["blocks.0.ln1.w"], t["grad.blocks.0.ln1.hook_normalized"])
    names = [n for n in t if n.startswith("grad.")]
    assert names == forward_order(names) and names[0] == "grad.logits" and names[-1] == "grad.tied_W_E"
    assert list(t).index("grad.logits") > list(t).index("loss")  # every forward tensor first
    # backward order: a block's output gradient, its ops last to first, then the block below
    order = [f"blocks.{LAST}.hook_resid_post", f"blocks.{LAST}.mlp.W_out", f"blocks.{LAST}.mlp.hook_pre",
             f"blocks.{LAST}.ln2.out", f"blocks.{LAST}.attn.hook_attn_scores", f"blocks.{LAST}.attn.W_Q",
             f"blocks.{LAST}.hook_resid_pre", "blocks.0.hook_resid_post", "embed.W_E"]
    assert sorted(order, key=backward_key) == order
    assert g.conditioning["grad.logits"] > 0 and g.error_rms["grad.blocks.0.mlp.W_in"] > 0


def test_correct_float32_and_float64_backward_passes_pass(ref):
    params, g = ref
    for dtype in ("float32", "float64"):
        report = oracle.compare(g, candidate(params, dtype))
        assert report.ok, report.table()
        assert sum(t.name.startswith("grad.") for t in report.tensors) > 80


# ---- planted backward bugs, op by op, in a copy of refgpt's own backward ---------------------------


def planted(module, function, old, new):
    """A copy of ``module.function`` with ``old`` replaced by ``new`` in its source."""
    source = textwrap.dedent(inspect.getsource(getattr(module, function)))
    assert old in source, f"{old!r} not in {function}"
    namespace = dict(vars(module))
    exec(compile(source.replace(old, new), f"<planted {function}>", "exec"), namespace)
    return namespace[function]


#: (what, module the bug is planted in, function, its line, the bug, where backward.py looks it up,
#:  the gradient the oracle must name, words its report must use)
BACKWARD_BUGS = [
    ("loss not divided by the count", loss, "softmax_cross_entropy", "grad /= count", "grad /= 1",
     (backward, "softmax_cross_entropy"), "grad.logits", "the loss"),
    ("GELU backward: 0.044715 without the 3 of d(x³)/dx", activations, "_tanh_gelu_backward",
     "3.0 * 0.044715 * x2", "0.044715 * x2", (activations, "_tanh_gelu_backward"),
     f"grad.blocks.{LAST}.mlp.hook_pre", "the activation (GELU)"),
    ("MLP: ∂W_out from the pre-activation", mlp, "mlp_backward", '"W_out": post.reshape(', '"W_out": pre.reshape(',
     (backward, "mlp_backward"), f"grad.blocks.{LAST}.mlp.W_out", "W_out"),
    ("LayerNorm backward without its mean term", layernorm, "layer_norm_backward",
     "grad_x = grad_centered + grad_mean / n", "grad_x = grad_centered", (backward, "layer_norm_backward"),
     f"grad.blocks.{LAST}.hook_resid_post", "ln_final (its ∂input)"),
    ("LayerNorm ∂w without x̂", layernorm, "layer_norm_backward", "grad_w = (grad * normalized)",
     "grad_w = (grad * 1.0)", (backward, "layer_norm_backward"), "grad.ln_final.w", "ln_final's affine part"),
    ("softmax backward without the pattern weight", attention, "attention_backward",
     "(pattern * grad_pattern).sum(-1, keepdims=True)", "grad_pattern.sum(-1, keepdims=True)",
     (backward, "attention_backward"), f"grad.blocks.{LAST}.attn.hook_attn_scores", "the softmax"),
    ("∂v from the pattern, not its transpose", attention, "attention_backward",
     "(pattern.transpose(0, 1, 3, 2) @ gz)", "(pattern @ gz)", (backward, "attention_backward"),
     f"grad.blocks.{LAST}.attn.hook_v", "z = pattern·v"),
    ("∂q without the attention scale", attention, "attention_backward",
     "(grad_scores @ k.transpose(per_head)).transpose(per_head) * score_scale)",
     "(grad_scores @ k.transpose(per_head)).transpose(per_head))", (backward, "attention_backward"),
     f"grad.blocks.{LAST}.attn.hook_q", "the scores"),
    ("∂W_pos from the first sequence only", backward, "backward_from", "g_W_pos[: tokens.shape[1]] = g_pos.sum(axis=0)",
     "g_W_pos[: tokens.shape[1]] = g_pos[0]", (backward, "backward_from"), "grad.pos_embed.W_pos", "position embedding"),
]


@pytest.mark.slow
@pytest.mark.parametrize("bug", BACKWARD_BUGS, ids=[b[0] for b in BACKWARD_BUGS])
def test_a_bug_planted_in_one_ops_backward_is_named_at_that_op(ref, bug, monkeypatch):
    what, module, function, old, new, (target, attr), expected, words = bug
    params, g = ref
    monkeypatch.setattr(target, attr, planted(module, function, old, new))
    report = oracle.compare(g, candidate(params, "float32"))
    first = report.first_divergence
    assert first is not None and first.name == expected, report.table(after_first=2)
    assert all(t.ok for t in report.tensors if not t.name.startswith("grad."))  # the forward is right
    text = report.table()
    assert f"first divergence: {expected}" in text and words in text, text


# ---- HF/torch with a wrong custom autograd op ---------------------------------------------------------


def _torch_peers():
    torch = pytest.importorskip("torch", reason="needs the 'peers' extra (torch)")
    pytest.importorskip("transformers", reason="needs the 'peers' extra (transformers)")
    import peers

    return torch, peers


def _hf_candidate(torch, hf, tokens, act=None):
    """HF's forward and backward of the mean next-token loss: hidden states, logits and every
    parameter's .grad, under HF's names."""
    if act is not None:
        for block in hf.transformer.h:
            block.mlp.act = act
    hf.zero_grad()
    ids = torch.tensor(tokens)
    out = hf(ids, output_hidden_states=True)
    for h in out.hidden_states:
        h.retain_grad()
    out.logits.retain_grad()
    # HF's own loss (labels=) upcasts the logits with .float(): in a float64 model that *rounds* them to
    # float32, and every gradient is then float32-accurate. The mean next-token loss in the model's dtype:
    V = out.logits.shape[-1]
    out.loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    out.loss.backward()
    cand = {f"hidden_states.{i}": h.detach().numpy() for i, h in enumerate(out.hidden_states)}
    cand.update({f"hidden_states.{i}.grad": h.grad.numpy() for i, h in enumerate(out.hidden_states)})
    cand.update({"logits": out.logits.detach().numpy(), "logits.grad": out.logits.grad.numpy(),
                 "loss": out.loss.detach().numpy()})
    cand.update({name + ".grad": p.grad.numpy() for name, p in hf.named_parameters()})
    return cand


@pytest.mark.peer
def test_hf_torch_gradients_pass_and_a_wrong_custom_autograd_gelu_is_named_at_the_mlp(tmp_path):
    torch, peers = _torch_peers()
    import refgpt

    cfg = peers.random_hf_config(21, n_layer=2, n_positions=16, tie_word_embeddings=True,
                                 reorder_and_upcast_attn=False, activation_function="gelu_new")
    hf = peers.random_hf_model(cfg, 21, dtype="float64", f32_exact=True)
    peers.save_hf_layout(hf, tmp_path, dtype="F64")
    tokens = np.random.default_rng(21).integers(0, cfg.vocab_size, size=(2, 9))
    ref = golden.make(refgpt.load(tmp_path), tokens, backward=True)

    good = oracle.compare(ref, _hf_candidate(torch, hf, tokens), name_map="hf")
    assert good.ok, good.table()
    compared = {t.name for t in good.tensors}
    assert {"grad.logits", "grad.tied_W_E", "grad.blocks.1.mlp.W_in", "grad.blocks.0.attn.W_Q",
            "grad.blocks.1.hook_resid_pre", "grad.ln_final.out", "loss_mean"} <= compared

    class WrongGelu(torch.autograd.Function):
        """gelu_new forward, and a backward that forgets the 3 of d(x³)/dx."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            c = (2.0 / np.pi) ** 0.5
            return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x**3)))

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            c = (2.0 / np.pi) ** 0.5
            t = torch.tanh(c * (x + 0.044715 * x**3))
            return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 0.044715 * x * x))

    class WrongGeluModule(torch.nn.Module):
        def forward(self, x):
            return WrongGelu.apply(x)

    bad = oracle.compare(ref, _hf_candidate(torch, hf, tokens, act=WrongGeluModule()), name_map="hf")
    first = bad.first_divergence
    assert first is not None and first.name == "grad.blocks.1.mlp.W_in", bad.table(after_first=2)
    assert "blocks.1: the MLP's input projection (W_in)" in bad.table()


def test_tl_and_hf_gradient_names_map_to_the_golden(ref):
    params, g = ref
    t = g.tensors
    tl = {"blocks.0.hook_resid_pre_grad": t["grad.blocks.0.hook_resid_pre"],
          "blocks.1.attn.W_Q.grad": t["grad.blocks.1.attn.W_Q"], "unembed.hook_in_grad": t["grad.ln_final.out"],
          "embed.W_E.grad": t["grad.embed.W_E"]}
    report = oracle.compare(g, tl, name_map="tl")
    assert report.ok and {x.name for x in report.tensors} == {
        "grad.blocks.0.hook_resid_pre", "grad.blocks.1.attn.W_Q", "grad.ln_final.out", "grad.embed.W_E"}


# ---- systematic forward errors, named at their own op --------------------------------------------------


def test_gelu_with_pi_314_is_named_at_mlp_hook_post(monkeypatch):
    """Every element within tolerance, but the bias of hook_post is far above rounding's."""
    params = example.realistic_params()
    ref = example.reference()

    def gelu_314(x):
        c = np.sqrt(np.asarray(2.0, x.dtype) / np.asarray(3.14, x.dtype))
        return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x**3)))

    monkeypatch.setitem(activations.ACTIVATIONS, "gelu_new", gelu_314)
    cand = golden.compute(Model(example.CFG, params, dtype="float32"), example.TOKENS)
    report = oracle.compare(ref, cand)
    first = report.first_divergence
    assert first.name == "blocks.0.mlp.hook_post" and first.status == "systematic error", report.table(after_first=2)
    assert first.max_over_tol <= 1.0  # no element is out: only the bias test sees it
    assert "a systematic error" in report.table()


@pytest.mark.slow
def test_a_correct_float32_port_of_the_trained_default_model_passes():
    from refgpt import load_default

    model = load_default()
    tokens = np.random.default_rng(0).integers(0, model.cfg.d_vocab, size=(2, 24))
    params = {k: np.asarray(v) for k, v in model.params.items()}
    ref = golden.make(model, tokens, backward=True)
    cand = golden.compute(Model(model.cfg, params, dtype="float32"), tokens, backward=True)
    report = oracle.compare(ref, cand)
    assert report.ok, report.table()
