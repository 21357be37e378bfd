"""GPT-2's backward pass: the gradient of the mean next-token loss with respect to every parameter
and every hook point, in the model's dtype.

Backpropagation is the forward pass read backwards. ``model.run_with_cache`` records every
intermediate value; then, starting from ∂loss/∂logits, each op's ``*_backward`` (written beside
its forward, as llm.c's train_gpt2.c keeps each layer's backward beside its forward) turns the
gradient of its output into the gradients of its inputs and parameters:

    ∂logits = softmax(logits) − onehot(targets), / count      loss.py       (fused with the loss)
    ∂final  = ∂logits·W_Uᵀ        ∂W_U = Σ finalᵀ·∂logits, ∂b_U = Σ ∂logits
    ∂resid  = layer_norm_backward(∂final)                       ln_final
    for each block L, last to first:
        ∂resid_mid = ∂resid + layer_norm_backward(mlp_backward(∂resid))          ln2, mlp
        ∂resid_pre = ∂resid_mid + layer_norm_backward(attention_backward(∂resid_mid))
    ∂W_E[t] += ∂resid_pre₀[b, i] for every (b, i) with tokens[b, i] = t;  ∂W_pos[i] = Σ_b ∂resid_pre₀[b, i]

A residual connection x + f(x) copies the gradient: it flows straight through the sum and into f.
Each block's gradient therefore *adds* to the one flowing down the residual stream, as each
block's output added to the stream going up.

Gradients come back under the names the forward uses. ``grads.params["blocks.0.attn.W_Q"]`` has
the parameter's shape ([head, d_model, d_head]); ``grads.activations["blocks.3.hook_resid_pre"]``
is ∂loss/∂ that activation, as if a hook had replaced it with a variable (always with a batch
axis, like the cache); ``grads.ln_out["blocks.3.ln2.out"]`` is ∂loss/∂ a LayerNorm's output
w ⊙ x̂ + b, which is not a hook point (the oracle's gradient goldens compare it).

**Tied embeddings.** GPT-2 uses one matrix twice: W_E to embed and W_U = W_Eᵀ to unembed. Here
each use gets its own gradient: ``params["embed.W_E"]`` is the embedding's and
``params["unembed.W_U"]`` the unembedding's, each as if the other were a separate matrix (what
TransformerLens, which stores both, would see). The gradient of the one shared matrix is their sum,
``grads.tied_W_E = params["embed.W_E"] + params["unembed.W_U"]ᵀ``: what HF's ``wte.weight.grad``
and llm.c's ``grads.wte`` hold (``grads.tied`` says whether this model's W_U is W_Eᵀ).

**From any ∂logits.** ``backward_from`` is the same pass started from a gradient of the logits
given by the caller (∂metric/∂logits for any metric of them, not only the mean next-token loss),
with optional extra gradients arriving at hook points (∂metric/∂ an activation the metric read
directly: each is added to the gradient flowing there, before that point's backward hooks see
it). ``backward`` is ``backward_from`` started from the fused loss gradient. refgpt's torch-facing
model (refgpt/tl_torch/autograd.py) calls ``backward_from`` inside a ``torch.autograd.Function``.

Derivations: docs/backward.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .gpt2.activations import BACKWARDS
from .gpt2.attention import attention_backward
from .errors import RefGPTError
from .tl.hook_points import ATTN_HOOKS, LN_HOOKS
from .tl.hooks import GradientRun
from .tl.inputs import is_text
from .gpt2.layernorm import layer_norm_backward
from .gpt2.ln_views import cached_output
from .gpt2.loss import check_targets, next_token_targets, softmax_cross_entropy
from .gpt2.mlp import mlp_backward


@dataclass(repr=False)
class Gradients:
    """One backward pass: the loss, and ∂loss/∂ every parameter, activation and logit (for
    ``backward_from``, ∂ of whatever the caller's ∂logits came from; ``loss`` and ``targets`` None)."""

    loss: float | None  # mean cross-entropy over the positions with a target (None: backward_from)
    params: dict[str, np.ndarray]  # TL parameter name → gradient, the parameter's shape
    activations: dict[str, np.ndarray]  # hook name → gradient [batch, …], the activation's shape
    logits: np.ndarray  # [batch, pos, d_vocab] the gradient the pass started from
    targets: np.ndarray | None  # [batch, pos] the targets used (−100: ignored); None: backward_from
    tied: bool = field(default=False)  # is the model's W_U a view of W_Eᵀ?
    ln_out: dict[str, np.ndarray] = field(default_factory=dict)  # "blocks.0.ln1.out" → ∂loss/∂ each LayerNorm's output

    @property
    def tied_W_E(self) -> np.ndarray:
        """The gradient of W_E as one matrix used twice (embed and W_U = W_Eᵀ): [d_vocab, d_model]."""
        return self.params["embed.W_E"] + self.params["unembed.W_U"].T

    def __repr__(self) -> str:
        """A few lines (loss, how many gradients of what, shapes, dtype), not every number: the
        arrays themselves are ``.params``, ``.activations``, ``.logits``."""
        loss = "None (backward_from)" if self.loss is None else f"{self.loss:.9g}"
        targets = "None" if self.targets is None else f"{list(self.targets.shape)} ({int((self.targets != -100).sum())} used)"
        def names(d):  # the first two names and the last
            keys = list(d)
            return ", ".join(keys[:2] + (["…"] if len(keys) > 3 else []) + keys[2:][-1:])
        return (f"Gradients(loss={loss}, dtype={self.logits.dtype.name}, tied={self.tied},\n"
                f"  params: {len(self.params)} ({sum(int(g.size) for g in self.params.values()):,} numbers: {names(self.params)}),\n"
                f"  activations: {len(self.activations)} ({names(self.activations)}),\n"
                f"  ln_out: {len(self.ln_out)}, logits: {list(self.logits.shape)}, targets: {targets})")


def loss_and_grads(model, tokens, targets=None) -> Gradients:
    """The mean cross-entropy loss of ``model`` on ``tokens`` [pos] or [batch, pos] and its gradients.

    ``targets``: None for next-token prediction (HF's shift: the target of position i is token
    i + 1; the last position has none), or ids [batch, pos], one per input position, with −100
    where a position has no target. The loss is the mean over the positions that have one.
    """
    if is_text(tokens):
        texts = [tokens] if isinstance(tokens, str) else tokens
        tokens = model.to_tokens(tokens)  # [batch, pos], TransformerLens's tokenization
        # Padded iff the texts' token counts differ (a pad id alone proves nothing: BOS is one too).
        if len({model.to_tokens(text).shape[1] for text in texts}) > 1:
            raise RefGPTError("loss_and_grads: the texts have different lengths; the backward of a padded "
                              "batch is not implemented: pass one text, or equal-length ones")
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    if model.cfg.use_attn_in or model.cfg.use_split_qkv_input:
        raise RefGPTError("loss_and_grads: the analytic backward is written for one ln1 per block; turn "
                          "use_attn_in / use_split_qkv_input off (model.set_use_attn_in(False), …)")
    if any(hp.fwd_hooks for hp in model.hook_dict.values()):
        raise RefGPTError("loss_and_grads: forward hooks are attached; the analytic backward is the gradient of "
                          "the unhooked forward pass, so remove them first (model.reset_hooks())")
    if targets is None:
        if tokens.shape[1] < 2:
            raise RefGPTError("loss_and_grads: next-token targets need at least 2 tokens; pass targets=")
        targets = next_token_targets(tokens)  # [batch, pos]
    targets = check_targets(targets, tokens.shape, model.cfg.d_vocab)  # [batch, pos]
    logits, cache = model.run_with_cache(tokens)  # [batch, pos, d_vocab]
    return backward(model, tokens, cache, logits, targets, GradientRun(model.hook_dict))


def backward(model, tokens, cache, logits, targets, run_hooks=None) -> Gradients:
    """The backward pass of the mean next-token loss from a full forward cache (every hook point, no
    hooks applied). ``run_hooks`` (a GradientRun) calls the backward hooks with each hook point's
    gradient (refgpt/tl/hooks.py)."""
    loss, grad_logits = softmax_cross_entropy(logits, targets)  # [batch, pos, d_vocab]
    grads = backward_from(model, tokens, cache, grad_logits, run_hooks)
    grads.loss, grads.targets = loss, targets
    return grads


def backward_from(model, tokens, cache, grad_logits, run_hooks=None) -> Gradients:
    """The backward pass from ``grad_logits`` [batch, pos, d_vocab] (∂metric/∂logits, for any metric)
    and a full forward cache of ``tokens`` [batch, pos] (every hook point). ``run_hooks`` (a
    GradientRun) calls the backward hooks at each hook point and adds the gradients it was given
    for activations the metric read directly (``GradientRun(…, arriving=…)``). The cache holds
    what flowed downstream, so a forward whose hooks replaced activations is *not* what this
    differentiates: the caller refuses those (refgpt/tl_torch/autograd.py, loss_and_grads)."""
    cfg, p = model.cfg, model.params
    run_hooks = run_hooks if run_hooks is not None else GradientRun({})
    g_params: dict[str, np.ndarray] = {}
    g_acts: dict[str, np.ndarray] = {}

    # logits = final·W_U + b_U, final = ln_final(resid). (unembed.hook_out/hook_in: the torch-facing
    # model's hook points on the logits and on ln_final's output; a plain Model has neither.)
    g_acts["unembed.hook_out"] = grad_logits = run_hooks("unembed.hook_out", grad_logits)  # [batch, pos, d_vocab]
    final = cached_output(cache, "ln_final.")  # [batch, pos, d_model]
    g_params["unembed.W_U"] = rows(final).T @ rows(grad_logits)  # [d_model, d_vocab]
    if "unembed.b_U" in p:
        g_params["unembed.b_U"] = grad_logits.sum(axis=(0, 1))  # [d_vocab]
    g_acts["unembed.hook_in"] = grad = run_hooks("unembed.hook_in", grad_logits @ p["unembed.W_U"].T)  # [batch, pos, d_model]
    grad = layer_norm_step("ln_final.", grad, cache, p, g_params, g_acts, run_hooks)  # [batch, pos, d_model]

    act_backward = BACKWARDS[cfg.act_fn]
    for L in reversed(range(cfg.n_layers)):
        grad = block_backward(model, L, grad, cache, act_backward, g_params, g_acts, run_hooks)  # [batch, pos, d_model]

    # resid_pre₀ = W_E[tokens] + W_pos[positions]
    g_acts["hook_embed"] = g_embed = run_hooks("hook_embed", grad)  # [batch, pos, d_model]
    g_acts["hook_pos_embed"] = g_pos = run_hooks("hook_pos_embed", grad)  # [batch, pos, d_model]
    g_W_E = np.zeros_like(p["embed.W_E"])  # [d_vocab, d_model]
    np.add.at(g_W_E, tokens.reshape(-1), rows(g_embed))  # a token used twice gets both gradients
    g_W_pos = np.zeros_like(p["pos_embed.W_pos"])  # [n_ctx, d_model]
    g_W_pos[: tokens.shape[1]] = g_pos.sum(axis=0)  # [pos, d_model]
    g_params["embed.W_E"], g_params["pos_embed.W_pos"] = g_W_E, g_W_pos

    tied = bool(cfg.tie_word_embeddings and np.shares_memory(p["unembed.W_U"], p["embed.W_E"]))
    ordered_params = {name: g_params[name] for name in p}
    ordered_acts = {name: g_acts[name] for name in model.hook_names if name in g_acts}  # not TL's optional points
    ln_out_grads = {name: g for name, g in g_acts.items() if name.endswith(".out")}
    return Gradients(None, ordered_params, ordered_acts, grad_logits, None, tied, ln_out_grads)


def block_backward(model, L, grad, cache, act_backward, g_params, g_acts, run_hooks):
    """Block L in reverse: ∂resid_post → ∂resid_pre, filling in the block's gradients."""
    cfg, p, b = model.cfg, model.params, f"blocks.{L}."
    _, attn_w, mlp_w = model.block_weights(L)  # the flat layout the forward multiplies with

    # resid_post = resid_mid + mlp(ln2(resid_mid))
    g_acts[b + "hook_resid_post"] = grad = run_hooks(b + "hook_resid_post", grad)  # [batch, pos, d_model]
    g_acts[b + "hook_mlp_out"] = g_mlp = run_hooks(b + "hook_mlp_out", grad)  # [batch, pos, d_model]
    m = mlp_backward(g_mlp, cached_output(cache, b + "ln2."), cache[b + "mlp.hook_pre"],
                     cache[b + "mlp.hook_post"], mlp_w, act_backward, run_hooks.scope(b + "mlp."))
    for key in ("W_in", "b_in", "W_out", "b_out"):
        g_params[b + "mlp." + key] = m[key]
    g_acts[b + "mlp.hook_pre"], g_acts[b + "mlp.hook_post"] = m["hook_pre"], m["hook_post"]
    grad_mlp_in = layer_norm_step(b + "ln2.", m["x"], cache, p, g_params, g_acts, run_hooks)  # [batch, pos, d_model]
    if cfg.use_hook_mlp_in:  # ln2 read a hooked copy of resid_mid
        g_acts[b + "hook_mlp_in"] = grad_mlp_in = run_hooks(b + "hook_mlp_in", grad_mlp_in)  # [batch, pos, d_model]
    grad = grad + grad_mlp_in  # [batch, pos, d_model]

    # resid_mid = resid_pre + attn(ln1(resid_pre))
    g_acts[b + "hook_resid_mid"] = grad = run_hooks(b + "hook_resid_mid", grad)  # [batch, pos, d_model]
    g_acts[b + "hook_attn_out"] = g_attn = run_hooks(b + "hook_attn_out", grad)  # [batch, pos, d_model]
    a = attention_backward(g_attn, cached_output(cache, b + "ln1."), attn_w,
                           cache[b + "attn.hook_q"], cache[b + "attn.hook_k"], cache[b + "attn.hook_v"],
                           cache[b + "attn.hook_pattern"], cache[b + "attn.hook_z"], cfg.score_scale(L),
                           run_hooks.scope(b + "attn."), cfg.use_attn_result)
    h, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    for x in "QKV":  # flat [d_model, head·d_head] → [head, d_model, d_head]
        g_params[b + f"attn.W_{x}"] = a[f"W_{x}"].reshape(d, h, dh).transpose(1, 0, 2)
        g_params[b + f"attn.b_{x}"] = a[f"b_{x}"].reshape(h, dh)
    g_params[b + "attn.W_O"] = a["W_O"].reshape(h, dh, d)  # [head, d_head, d_model]
    g_params[b + "attn.b_O"] = a["b_O"]
    for name in (*ATTN_HOOKS, "hook_result"):
        if name in a:
            g_acts[b + "attn." + name] = a[name]
    grad = grad + layer_norm_step(b + "ln1.", a["x"], cache, p, g_params, g_acts, run_hooks)  # [batch, pos, d_model]
    g_acts[b + "hook_resid_pre"] = grad = run_hooks(b + "hook_resid_pre", grad)  # [batch, pos, d_model]
    return grad


def layer_norm_step(prefix, grad, cache, p, g_params, g_acts, run_hooks):
    """LayerNorm ``prefix`` ("blocks.3.ln1.", "ln_final.") in reverse: its gradients recorded,
    ∂loss/∂input returned."""
    g_acts[prefix + "out"] = grad  # ∂loss/∂(w ⊙ x̂ + b), the LayerNorm's output (not a hook point)
    g = layer_norm_backward(grad, cache[prefix + "hook_normalized"], cache[prefix + "hook_scale"], p[prefix + "w"],
                            run_hooks.scope(prefix))
    g_params[prefix + "w"], g_params[prefix + "b"] = g["w"], g["b"]
    for name in LN_HOOKS:
        g_acts[prefix + name] = g[name]
    return g["x"]


def rows(a):
    """[batch, pos, n] → [batch·pos, n]."""
    return a.reshape(-1, a.shape[-1])
