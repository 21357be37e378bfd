"""SAEs in the model: each at its hook, spliced in or with the exact error term.

``run_with_saes(model, input, saes)`` runs the model with every SAE's output in place of the
activation at its hook (a transcoder reads ``hook_name`` and writes ``hook_name_out``): the
reconstruction spliced in, as SAELens's HookedSAETransformer does. With ``use_error_term=True``
the stream is left as it was and only what a hook on the SAE changes flows on:

    out = x + (x̂_edited − x̂)        (SAELens: x̂_edited + (x − x̂), the same number up to rounding)

so with no edit the pass is the unspliced pass bit for bit, and with an edit of the features the
difference is exactly the edit's effect through the decoder. ``sae_hooks`` = [(name, fn), …] are
hooks on the SAEs' own points, named as SAELens names them in a HookedSAETransformer:
``"{hook_name}.hook_sae_acts_post"`` and so on (refgpt/sae/sae.py, SAE_HOOKS);
``run_with_cache_with_saes`` also caches them, under the same names, beside the model's.
``steer_features({feature: value})`` is such a hook: it adds value to those features' activations.

Weight processing. An SAE sees the activations of the model it was trained on, processed as
SAELens loaded it: ``HookedTransformer.from_pretrained_no_processing(model_name,
**model_from_pretrained_kwargs)`` (SAELens's evals), so a step is on only if the cfg's
``model_from_pretrained_kwargs`` says so (gpt2-small-res-jb: ``center_writing_weights: true``).
``check_processing`` compares that with the model's weights, for the steps that change the
activation at the SAE's hook, and refuses a disagreement by name (SAELens issue #405): the stream
of a model whose writing weights are centred differs from the raw one by a multiple of the ones
vector at every position, which no LayerNorm sees but every SAE on the stream does.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from ..errors import RefGPTError
from ..tl.cache import ActivationCache
from .sae import SAE, SAE_HOOKS

#: The processing steps that change the activation at a hook (by the hook's suffix).
#: center_writing_weights moves every write to the stream (and so the stream) by a multiple of the
#: ones vector; fold_value_biases moves b_V out of v and z; fold_ln leaves LayerNorm's output as x̂.
_AFFECTED_BY = (
    (r"hook_resid_(pre|mid|post)$|hook_(attn|mlp)_out$|hook_embed$|hook_pos_embed$|attn\.hook_result$",
     "center_writing_weights"),
    (r"attn\.hook_(z|v)$", "fold_value_biases"),
    (r"ln\d?(_final)?\.hook_normalized$|ln_final\.hook_normalized$", "fold_ln"),
)
_WRITERS = ("embed.W_E", "pos_embed.W_pos", "attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")


def _claimed(sae: SAE) -> dict[str, bool]:
    kwargs = sae.metadata.get("model_from_pretrained_kwargs") or {}
    return {step: bool(kwargs.get(step, False)) for step in ("center_writing_weights", "fold_value_biases", "fold_ln")}


def processing_state(model) -> dict[str, bool]:
    """What the model's weights show: writing weights centred along d_model (every row mean ≤ 64
    ulps of the weight's largest entry: centring leaves rounding only), value biases folded
    (b_V = 0), LayerNorm folded (w = 1, b = 0)."""
    p, eps = model.params, np.finfo(model.dtype).eps
    writers = [p[name] for name in ("embed.W_E", "pos_embed.W_pos")]
    for L in range(model.cfg.n_layers):
        writers += [p[f"blocks.{L}.{name}"] for name in _WRITERS[2:]]
    centred = all(np.max(np.abs(w.mean(-1))) <= 64 * eps * max(np.max(np.abs(w)), np.finfo(model.dtype).tiny)
                  for w in writers)
    blocks = [f"blocks.{L}." for L in range(model.cfg.n_layers)]
    folded_v = all(not np.any(p[b + "attn.b_V"]) for b in blocks)
    lns = [b + f"ln{i}." for b in blocks for i in (1, 2)] + ["ln_final."]
    folded_ln = all(np.all(p[ln + "w"] == 1) and not np.any(p[ln + "b"]) for ln in lns)
    return {"center_writing_weights": centred, "fold_value_biases": folded_v, "fold_ln": folded_ln}


def processing_mismatches(model, sae: SAE) -> list[str]:
    """Each step that changes the activations at the SAE's hooks and on which the model's weights
    and the SAE's cfg disagree, as a sentence."""
    state, claimed, found = processing_state(model), _claimed(sae), []
    for hook in {sae.hook_name, sae.hook_name_out}:
        for pattern, step in _AFFECTED_BY:
            if hook and re.search(pattern, hook) and state[step] != claimed[step]:
                found.append(f"the SAE at {hook} was trained with {step}={claimed[step]} (its cfg.json's "
                             f"model_from_pretrained_kwargs), but the model's weights are "
                             f"{'' if state[step] else 'not '}{_DONE[step]}")
    return sorted(set(found))


_DONE = {"center_writing_weights": "centred", "fold_value_biases": "value-bias folded", "fold_ln": "LayerNorm folded"}


def check_processing(model, sae: SAE) -> None:
    """A RefGPTError if the model's weight processing differs from the SAE's (see the module
    docstring); the fix is ``refgpt.tl.processing.process(model, [steps])`` or the raw weights."""
    mismatches = processing_mismatches(model, sae)
    if mismatches:
        raise RefGPTError(mismatches[0] + "; process the model to match (refgpt.tl.processing.process, or "
                          "--process on the command line) or pass check=False")


def check_fits(model, sae: SAE) -> None:
    """The SAE's hooks exist in the model, its dtype is the model's, its widths fit the activations."""
    for hook in (sae.hook_name, sae.hook_name_out):
        if hook is None:
            raise RefGPTError(f"{sae!r}: cfg.json names no hook_name: where in the model does it go?")
        if hook not in model.hook_dict:
            raise RefGPTError(f"SAE hook {hook!r} is not a hook point of this model "
                              f"({model.cfg.n_layers} layers)")
    if sae.metadata.get("hook_head_index") is not None:
        raise RefGPTError(f"SAE at {sae.hook_name}: hook_head_index {sae.metadata['hook_head_index']!r} "
                          "(an SAE on one head) is not supported")
    if sae.dtype != model.dtype:
        raise RefGPTError(f"SAE at {sae.hook_name} is {sae.dtype}, the model {model.dtype}: load both in one dtype")


def steer_features(values: dict, add=True):
    """A hook for ``{hook_name}.hook_sae_acts_post``: add ``values[feature]`` to each feature's
    activation (or set it, with ``add=False``), at every position."""
    def hook(acts, name):
        acts = acts.copy()
        for feature, value in values.items():
            acts[..., feature] = acts[..., feature] + value if add else value
        return acts
    return hook


class _Splice:
    """The model hooks that run each SAE at its hook, and what they recorded."""

    def __init__(self, model, saes, use_error_term, sae_hooks, record):
        self.model, self.use_error_term, self.record = model, use_error_term, record
        self.saes = {}
        for sae in saes:
            if sae.hook_name_out in self.saes:
                raise RefGPTError(f"two SAEs write {sae.hook_name_out}: attach one per hook")
            self.saes[sae.hook_name_out] = sae
        self.hooks = {sae.hook_name_out: {} for sae in saes}
        for name, fn in sae_hooks:
            where, _, point = name.rpartition(".")
            if where not in self.hooks or point not in SAE_HOOKS:
                raise RefGPTError(f"SAE hook {name!r}: expected '<an attached SAE's hook_name>.<one of "
                                  f"{', '.join(SAE_HOOKS)}>'; attached: {sorted(self.hooks)}")
            self.hooks[where].setdefault(point, []).append(fn)
        self.inputs, self.recorded = {}, {}

    def model_hooks(self):
        hooks = []
        for out_name, sae in self.saes.items():
            if sae.is_transcoder and sae.hook_name != out_name:
                hooks.append((sae.hook_name, self._keep_input(out_name)))
            hooks.append((out_name, self._splice(out_name)))
        return hooks

    def _keep_input(self, out_name):
        def hook(activation, point):
            self.inputs[out_name] = activation
        return hook

    def _hooks_of(self, out_name, recorded):
        """The SAE's hooks on each of its points, then (when recording) one that keeps the point's
        final value under its full name."""
        user = self.hooks[out_name]
        keep = lambda point: [lambda a, _, point=point: recorded.__setitem__(f"{out_name}.{point}", a)]  # noqa: E731
        return {point: list(user.get(point, ())) + (keep(point) if self.record else []) for point in SAE_HOOKS}

    def _splice(self, out_name):
        sae, user = self.saes[out_name], self.hooks[out_name]

        def hook(activation, point):
            x = self.inputs.pop(out_name, activation)
            recorded = {}
            out = sae.forward(x, self._hooks_of(out_name, recorded))  # [same shape as the activation]
            if not self.use_error_term:
                result = out
            else:
                if user:
                    clean = sae.forward(x)  # no hooks: the reconstruction as it would be
                    result = activation + (out - clean)
                else:
                    clean, result = out, activation
                error = activation - clean
                if self.record:
                    recorded[f"{out_name}.hook_sae_error"] = error
            self.recorded.update(recorded)
            return None if result is activation else np.ascontiguousarray(result, activation.dtype)

        return hook


@contextlib.contextmanager
def saes_attached(model, saes, use_error_term=False, sae_hooks=(), check=True, record=False):
    """``with saes_attached(model, [sae, …]):`` every pass inside runs with the SAEs (see the module
    docstring); yields a dict that collects the SAEs' activations when ``record``."""
    saes = [saes] if isinstance(saes, SAE) else list(saes)
    for sae in saes:
        check_fits(model, sae)
        if check:
            check_processing(model, sae)
    splice = _Splice(model, saes, use_error_term, list(sae_hooks), record)
    with model.hooks(fwd_hooks=splice.model_hooks()):
        yield splice.recorded


def run_with_saes(model, *model_args, saes=(), use_error_term=False, sae_hooks=(), check=True, **model_kwargs):
    """The model's forward pass with ``saes`` attached (SAELens's ``run_with_saes``)."""
    with saes_attached(model, saes, use_error_term, sae_hooks, check):
        return model(*model_args, **model_kwargs)


def run_with_cache_with_saes(model, *model_args, saes=(), use_error_term=False, sae_hooks=(), check=True,
                             names=None, **model_kwargs):
    """(output, cache): ``run_with_cache`` with ``saes`` attached; the cache also holds every SAE
    point, ``"{hook_name}.hook_sae_acts_post"`` … (``hook_sae_error`` with ``use_error_term``)."""
    with saes_attached(model, saes, use_error_term, sae_hooks, check, record=True) as recorded:
        out, cache = model.run_with_cache(*model_args, names=names, **model_kwargs)
    return out, ActivationCache({**cache.cache_dict, **recorded}, model, cache.has_batch_dim)
