"""refgpt's GPT-2 as a TransformerLens user holds it: ``HookedTransformer``, an ``nn.Module`` with
torch tensors at every boundary, computing with refgpt's NumPy model underneath.

    from refgpt.tl_torch import HookedTransformer
    model = HookedTransformer.from_pretrained("gpt2")          # the HF cache, or a directory
    logits, cache = model.run_with_cache("Hello")               # torch tensors, float64
    model.blocks[3].attn.hook_z.add_hook(fn)                    # fn(tensor, hook) → tensor | None
    metric(model(tokens)).backward()                            # refgpt's analytic gradients

What TransformerLens code does with a HookedTransformer works: the forward's keywords, text in,
``to_tokens`` (a LongTensor), hooks that clone and edit in place (they share the activation's
memory), ``run_with_cache`` (a torch ActivationCache), the module tree (``model.embed.W_E``,
``model.unembed.W_U``, ``model.blocks[L].attn.W_Q``, every hook point where TL has it, with
``unembed.hook_in``/``hook_out``), ``named_parameters()``, ``state_dict()``, ``eval()``,
``to("cpu")``, ``loss_fn``, ``generate`` (sampling with torch's generator, as TL), the circuits
(``OV``, ``QK`` as TransformerLens's FactoredMatrix), weight processing, and TransformerLens's own
``utils``, ``patching``, ``ActivationCache`` and ``SVDInterpreter`` given this model. Gradients
flow through torch into refgpt's analytic backward (refgpt/tl_torch/autograd.py).

Every number comes from refgpt's NumPy model (``model.refgpt``, refgpt/tl_torch/numpy_model.py);
the parameters are that model's arrays, shared. What remains different from TransformerLens is
listed in docs/transformerlens.md §2 (the torch-facing column).
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import torch
from torch import nn

from .. import errors
from ..errors import RefGPTError
from ..gpt2.loss import IGNORE_INDEX  # noqa: F401  (TransformerLens users import losses from here too)
from ..model import Model, Output
from ..tl import inputs, processing
from ..tl.generation import generate as numpy_generate
from ..tl.hooks import hook_entries
from .autograd import NumpyForward, Pass
from .cache import ActivationCache
from .circuits import FactoredMatrix, TorchLapack
from .config import TLConfig
from .hook_points import HookPoint
from .loading import pretrained
from .modules import place_hook_points, tree
from .numpy_model import TLModel, writable_params
from .tensors import array, arrays, tensor, tensors, torch_dtype
from .tl_errors import tl_errors, tl_semantics

_FLOAT_DTYPES = {torch.float64: "float64", torch.float32: "float32"}


@tl_semantics
class HookedTransformer(nn.Module):
    """TransformerLens's HookedTransformer for GPT-2, over refgpt's NumPy model (``model.refgpt``).

    ``HookedTransformer(model)`` wraps a refgpt ``Model`` (its weights are copied once into
    memory the torch parameters share); ``HookedTransformer.from_pretrained(name_or_dir, …)``
    loads one as TransformerLens does (refgpt/tl_torch/loading.py)."""

    def __init__(self, model: Model, dtype=None):
        super().__init__()
        if not isinstance(model, Model):
            raise errors.RefGPTTypeError(f"HookedTransformer: expected a refgpt Model, found {type(model).__name__}")
        self._recorder = None
        self._install(model, np.dtype(model.dtype if dtype is None else _FLOAT_DTYPES.get(dtype, dtype)))

    def _install(self, model: Model, dtype, hook_dict=None):
        """Make ``model`` (refgpt's) the NumPy model underneath: writable weights shared with torch
        parameters, the module tree and the hook points (kept, hooks and all, when ``hook_dict``
        — the previous NumPy model's — is given)."""
        cfg = TLConfig.of(model.cfg, torch_dtype(dtype))
        numpy_model = TLModel(cfg, writable_params(model, dtype), dtype=dtype, source=model.source)
        numpy_model.tokenizer = model.tokenizer
        if hook_dict is not None:
            numpy_model.hook_dict = hook_dict
        self._numpy = numpy_model
        self.cfg = cfg
        if "embed" not in self._modules:
            tree(self)
            self.hook_dict = {name: HookPoint(point, self) for name, point in numpy_model.hook_dict.items()}
            place_hook_points(self, self.hook_dict)
        else:  # a new NumPy model for the same tree: point the parameters at its arrays
            for name, param in self.named_parameters():
                param.data = tensor(numpy_model.params[name])
        folded = cfg.normalization_type == "LNPre"
        for ln in [self.ln_final, *(m for block in self.blocks for m in (block.ln1, block.ln2))]:
            ln.list_parameters(not folded)

    @property
    def refgpt(self) -> Model:
        """refgpt's NumPy model underneath (its arrays are this model's parameters)."""
        return self._numpy

    @property
    def tokenizer(self):
        return self._numpy.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer):
        self._numpy.tokenizer = tokenizer

    @property
    def mod_dict(self) -> dict:
        return dict(self.named_modules())

    # ---- the forward pass ---------------------------------------------------------------------

    def forward(self, input, return_type="logits", loss_per_token=False, prepend_bos=None, padding_side=None,
                start_at_layer=None, tokens=None, shortformer_pos_embed=None, attention_mask=None,
                stop_at_layer=None, past_kv_cache=None):
        """TransformerLens's forward: ``input`` text, texts, token ids [batch, pos] (or [pos], as
        batch 1) or, with ``start_at_layer``, the residual stream [batch, pos, d_model]. Returns
        torch tensors: logits [batch, pos, d_vocab], the loss, ``Output(logits, loss)``, None, or
        (``stop_at_layer``) the stream entering that block."""
        if shortformer_pos_embed is not None:
            raise RefGPTError("forward: shortformer_pos_embed is for shortformer models; GPT-2 has "
                              "standard position embeddings")
        return self._forward(input, (), return_type, loss_per_token, prepend_bos, padding_side, start_at_layer,
                             tokens, attention_mask, stop_at_layer, past_kv_cache)[0]

    def _forward(self, input, cache_names=(), return_type="logits", loss_per_token=False, prepend_bos=None,
                 padding_side=None, start_at_layer=None, tokens=None, attention_mask=None, stop_at_layer=None,
                 past_kv_cache=None):
        """(output as tensors, refgpt's NumPy ActivationCache of ``cache_names``)."""
        numpy_model = self._numpy
        input = _numpy_input(input, start_at_layer)
        kw = dict(return_type=return_type, loss_per_token=loss_per_token, prepend_bos=prepend_bos,
                  padding_side=padding_side, start_at_layer=start_at_layer, tokens=_token_ids(tokens),
                  attention_mask=None if attention_mask is None else array(attention_mask),
                  stop_at_layer=stop_at_layer, past_kv_cache=past_kv_cache)
        if not self._differentiable(return_type):
            out, cache = numpy_model._run(input, cache_names, **kw)
            return tensors(out), cache
        refusal, token_ids = None, None
        if start_at_layer is not None or stop_at_layer is not None or past_kv_cache is not None:
            refusal = "a pass with start_at_layer, stop_at_layer or a KV cache (refgpt's backward starts from the logits of a whole pass)"
        elif self.cfg.use_attn_in or self.cfg.use_split_qkv_input:
            refusal = "use_attn_in / use_split_qkv_input are on (refgpt's backward has one ln1 per block)"
        else:
            token_ids, _, padding = inputs.tokens_and_padding(numpy_model, input, prepend_bos, padding_side,
                                                              kw["attention_mask"], None)
            input = token_ids
            if padding is not None:
                refusal = "a padded batch (refgpt's backward is written for unpadded ones)"
        run = Pass(self, token_ids, {"input": input, **kw}, refusal)
        has = (return_type in ("logits", "both") or stop_at_layer is not None,
               return_type in ("loss", "both") and stop_at_layer is None)
        names = sorted(set(numpy_model.hook_names) | set(cache_names), key=_order(numpy_model))
        outputs = NumpyForward.apply(run, names, has, *self.parameters())
        cache = run.cache
        if cache_names != names:
            from ..tl.cache import ActivationCache as NumpyCache

            cache = NumpyCache({n: cache.cache_dict[n] for n in cache_names}, numpy_model)
        if has == (True, True):
            return Output(outputs[0], outputs[1]), cache
        return (outputs[0] if any(has) else None), cache

    def _differentiable(self, return_type) -> bool:
        """Will torch want a graph from this pass? (grad mode on and a parameter that asks for one)"""
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in self.parameters()):
            return False
        return return_type is not None or any(hp.fwd_hooks for hp in self._numpy.hook_dict.values())

    __call__ = nn.Module.__call__

    def run_with_hooks(self, *model_args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False,
                       **model_kwargs):
        """The forward with ``fwd_hooks`` = [(name or predicate, fn(tensor, hook)), …] for this pass;
        ``bwd_hooks`` stay for a ``.backward()`` only with ``reset_hooks_end=False``, as in TL."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(self, *model_args, names_filter=None, device=None, remove_batch_dim=False, incl_bwd=False,
                       reset_hooks_end=True, clear_contexts=False, pos_slice=None, return_cache_object=True,
                       fwd_hooks=(), **model_kwargs):
        """(output, ActivationCache) as TransformerLens's: ``names_filter`` None (every hook point),
        a name, names or a predicate; ``remove_batch_dim`` (batch 1); ``pos_slice``; ``incl_bwd``:
        ``output.backward()`` and ``name + "_grad"`` entries (a scalar output, as TL). ``fwd_hooks``
        (refgpt's, as its NumPy model's): hooks for this pass, the cache recording what they made."""
        _check_device(device, "run_with_cache")
        names = self._chosen(names_filter, "run_with_cache names_filter")
        try:
            forward = _FORWARD.bind(self, *model_args, **model_kwargs).arguments
        except TypeError as error:
            raise errors.RefGPTTypeError(f"run_with_cache: {error}") from None
        forward.pop("self")
        if forward.pop("shortformer_pos_embed", None) is not None:
            raise RefGPTError("run_with_cache: shortformer_pos_embed is for shortformer models")
        grads = {}
        bwd = [(name, _grad_saver(grads, name)) for name in names] if incl_bwd else []
        with self.hooks(fwd_hooks, bwd, reset_hooks_end, clear_contexts):
            out, numpy_cache = self._forward(cache_names=names, **forward)
            if incl_bwd:
                out.backward()
        from ..tl.cache import ActivationCache as NumpyCache

        numpy_cache = NumpyCache({**numpy_cache.cache_dict, **{n + "_grad": g for n, g in grads.items()}},
                                 self._numpy)  # the gradients in the order the backward made them, as TL
        if pos_slice is not None:
            numpy_cache = numpy_cache.apply_slice_to_pos_dim(arrays(pos_slice))
        if remove_batch_dim:
            numpy_cache = numpy_cache.remove_batch_dim()
        cache = ActivationCache({k: tensor(v) for k, v in numpy_cache.cache_dict.items()}, self,
                                has_batch_dim=not remove_batch_dim)
        return out, (cache if return_cache_object else cache.cache_dict)

    def loss_fn(self, logits, tokens, attention_mask=None, per_token=False):
        """TransformerLens's ``loss_fn`` (``utils.lm_cross_entropy_loss``), in torch so that a loss
        of logits that require grad differentiates: −log p(next token), mean or [batch, pos − 1]."""
        tokens = torch.as_tensor(tokens)
        log_probs = torch.log_softmax(logits, dim=-1)  # [batch, pos, d_vocab]
        predicted = log_probs[..., :-1, :].gather(dim=-1, index=tokens[..., 1:, None])[..., 0]  # [batch, pos − 1]
        if attention_mask is not None:
            mask = torch.as_tensor(attention_mask)
            counted = torch.logical_and(mask[:, :-1], mask[:, 1:])  # [batch, pos − 1]
            predicted = predicted * counted
            if per_token:
                return -predicted
            return -predicted.sum() / counted.sum()
        return -predicted if per_token else -predicted.mean()

    # ---- hooks: TransformerLens's HookedRootModule over the NumPy model's hook points ----------

    @property
    def hook_names(self) -> list[str]:
        """The hook points the forward reaches now (the cfg switches as they are)."""
        show_mean = self.cfg.use_hook_mean
        return [n for n in self._numpy.hook_names if show_mean or not n.endswith(".hook_mean")]

    def hook_points(self):
        return self.hook_dict.values()

    def _check_hookable(self, name, what):
        if name.endswith(".hook_mean") and not self.cfg.use_hook_mean and name in self.hook_dict:
            raise RefGPTError(f"{what}: {name!r} is a hook point of this model only with model.cfg.use_hook_mean = True "
                              "(or model.set_use_hook_mean(True)); TransformerLens has no LayerNorm mean hook")
        self._numpy._hookable(name, what)

    def _chosen(self, selector, what) -> list[str]:
        """The hook names ``selector`` (None: all, a name, names, a predicate) picks, as TL's."""
        if selector is None:
            return self.hook_names
        if callable(selector) and not isinstance(selector, str):
            return [n for n in self.hook_names if selector(n)]
        names = self._numpy.chosen_names(selector, what)
        for n in names:
            self._check_hookable(n, what)
        return names

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        """Attach ``hook`` (fn(tensor, hook) → tensor | None) to the point ``name`` or every point a predicate picks."""
        for n in ([name] if isinstance(name, str) else self._chosen(name, "add_hook")):
            if n not in self.hook_dict:
                self._numpy.chosen_names(n, "add_hook")  # raises, suggesting the closest names
            self.hook_dict[n].add_hook(hook, dir, is_permanent, level, prepend)

    def add_perma_hook(self, name, hook, dir="fwd"):
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def reset_hooks(self, clear_contexts=True, direction="both", including_permanent=False, level=None):
        self._numpy.reset_hooks(clear_contexts, direction, including_permanent, level)

    def remove_all_hook_fns(self, direction="both", including_permanent=False, level=None):
        self._numpy.remove_all_hook_fns(direction, including_permanent, level)

    def clear_contexts(self):
        self._numpy.clear_contexts()

    @property
    def context_level(self) -> int:
        return self._numpy.context_level

    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False):
        """``with model.hooks(fwd_hooks=[…], bwd_hooks=[…]):`` TransformerLens's context: this
        level's hooks go on the way out (even on an exception) unless ``reset_hooks_end=False``.
        The names are checked here, before the ``with`` is entered."""
        wrapped = []
        for direction, entries in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
            wrapped.append([(n, self.hook_dict[n].wrap(fn, direction))
                            for selector, fn in hook_entries(entries, f"{direction}_hooks")
                            for n in self._chosen(selector, f"{direction}_hooks")])
        return _yielding(self._numpy.hooks(wrapped[0], wrapped[1], reset_hooks_end, clear_contexts), self)

    def set_use_attn_result(self, use_attn_result: bool):
        self.cfg.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool):
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool):
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    def set_use_attn_in(self, use_attn_in: bool):
        self.cfg.use_attn_in = use_attn_in

    def set_use_hook_mean(self, use_hook_mean: bool):
        """refgpt's switch: each LayerNorm's ``hook_mean`` becomes a hook point (refgpt/tl_torch/config.py)."""
        self.cfg.use_hook_mean = use_hook_mean

    # ---- text: TransformerLens's tokenizer methods, tensors out ----------------------------------

    def to_tokens(self, input, prepend_bos=None, padding_side=None, move_to_device=True, truncate=True):
        """Text or texts → token ids, a LongTensor [batch, pos]."""
        return tensor(self._numpy.to_tokens(input, prepend_bos, padding_side, move_to_device, truncate))

    def to_string(self, tokens):
        return self._numpy.to_string(_token_ids(tokens))

    def to_str_tokens(self, input, prepend_bos=None, padding_side=None):
        return self._numpy.to_str_tokens(_token_ids(input) if not isinstance(input, (str, list)) else
                                         ([int(i) for i in input] if input and not isinstance(input[0], str) else input),
                                         prepend_bos, padding_side)

    def to_single_token(self, string):
        return self._numpy.to_single_token(string)

    def to_single_str_token(self, int_token):
        return self._numpy.to_single_str_token(int(int_token) if isinstance(int_token, torch.Tensor) else int_token)

    def get_token_position(self, single_token, input, mode="first", prepend_bos=None, padding_side=None):
        single = int(single_token) if isinstance(single_token, torch.Tensor) else single_token
        return self._numpy.get_token_position(single, input if isinstance(input, str) else _token_ids(input),
                                              mode, prepend_bos, padding_side)

    def generate(self, input="", max_new_tokens=10, stop_at_eos=True, eos_token_id=None, do_sample=True, top_k=None,
                 top_p=None, temperature=1.0, freq_penalty=0.0, use_past_kv_cache=True, prepend_bos=None,
                 padding_side=None, return_type="input", verbose=True, **generation_kwargs):
        """TransformerLens's generate: tokens sampled with TransformerLens's sampler from torch's
        generator (``torch.manual_seed`` gives TL's text), the arg-max without ``do_sample``."""
        unknown = set(generation_kwargs) - {"return_dict_in_generate"}
        if unknown:
            raise RefGPTError(f"generate: unsupported keyword(s) {sorted(unknown)}")
        tokens_in = isinstance(input, (torch.Tensor, np.ndarray))
        out = numpy_generate(self._numpy, _token_ids(input) if tokens_in else input, max_new_tokens,
                             stop_at_eos=stop_at_eos, eos_token_id=eos_token_id, do_sample=do_sample, top_k=top_k,
                             top_p=top_p, temperature=temperature, freq_penalty=freq_penalty,
                             use_past_kv_cache=use_past_kv_cache, prepend_bos=prepend_bos, padding_side=padding_side,
                             return_type=return_type, verbose=verbose, chooser=tl_sampler)
        return tensor(out) if isinstance(out, np.ndarray) else out

    # ---- the weights, stacked and read as circuits -----------------------------------------------

    W_E = property(lambda self: self.embed.W_E, doc="[d_vocab, d_model] (the parameter)")
    W_pos = property(lambda self: self.pos_embed.W_pos, doc="[n_ctx, d_model] (the parameter)")
    W_U = property(lambda self: self.unembed.W_U, doc="[d_model, d_vocab] (the parameter)")
    b_U = property(lambda self: self.unembed.b_U, doc="[d_vocab] (the parameter)")

    def _stack(self, module, name):
        return torch.stack([getattr(getattr(block, module), name) for block in self.blocks])

    W_Q = property(lambda self: self._stack("attn", "W_Q"), doc="[layer, head, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn", "W_K"), doc="[layer, head, d_model, d_head]")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="[layer, head, d_model, d_head]")
    W_O = property(lambda self: self._stack("attn", "W_O"), doc="[layer, head, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="[layer, head, d_head]")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="[layer, head, d_head]")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="[layer, head, d_head]")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="[layer, d_model]")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="[layer, d_model, d_mlp]")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="[layer, d_mlp]")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="[layer, d_mlp, d_model]")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="[layer, d_model]")

    @property
    def W_E_pos(self):
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def QK(self) -> FactoredMatrix:
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer, mlp_input=False, include_mlp_biases=True):
        return tensor(self._numpy.accumulated_bias(layer, mlp_input, include_mlp_biases))

    def tokens_to_residual_directions(self, tokens):
        if isinstance(tokens, torch.Tensor):
            tokens = array(tokens)
        return tensor(self._numpy.tokens_to_residual_directions(tokens))

    def all_head_labels(self):
        return self._numpy.all_head_labels()

    # ---- weight processing, as TransformerLens's in-place methods --------------------------------

    def process_weights_(self, fold_ln=True, center_writing_weights=True, center_unembed=True,
                         fold_value_biases=True, refactor_factored_attn_matrices=False):
        """TransformerLens's ``process_weights_``: the weights rewritten in place (the parameters
        are the same objects, with new values), in the model's dtype (TL rounds float64 to float32)."""
        flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                     fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
        processed = processing.process(self._numpy, [name for name, on in flags.items() if on], factored=TorchLapack)
        processed.cfg = TLConfig.of(processed.cfg, self.cfg.dtype)
        if fold_ln:
            processed.cfg.mark_ln_folded()
        self._install(processed, self._numpy.dtype, self._numpy.hook_dict)
        return self

    def _state_step(self, step, state_dict, **kwargs):
        params = {k: array(v) for k, v in state_dict.items()}
        return tensors(getattr(processing, step)(params, self.cfg, **kwargs))

    def fold_layer_norm(self, state_dict, fold_biases=True, center_weights=True):
        return self._state_step("fold_layer_norm", state_dict, fold_biases=fold_biases, center_weights=center_weights)

    def center_writing_weights(self, state_dict):
        return self._state_step("center_writing_weights", state_dict)

    def center_unembed(self, state_dict):
        return self._state_step("center_unembed", state_dict)

    def fold_value_biases(self, state_dict):
        return self._state_step("fold_value_biases", state_dict)

    def refactor_factored_attn_matrices(self, state_dict):
        return self._state_step("refactor_factored_attn_matrices", state_dict, factored=TorchLapack)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """New weights (TransformerLens names): the parameters keep their identity, take the values."""
        own = {n for n, _ in self.named_parameters()}
        unknown, missing = set(state_dict) - own, own - set(state_dict)
        if unknown or (strict and missing):
            raise RefGPTError(f"load_state_dict: unexpected {sorted(unknown)[:4]}, missing {sorted(missing)[:4]}")
        params = {**{n: array(p) for n, p in self.named_parameters()}, **{k: array(v) for k, v in state_dict.items()}}
        params = {k: np.array(v, dtype=self._numpy.dtype) for k, v in params.items()}
        cfg = self.cfg
        if cfg.tie_word_embeddings and not np.array_equal(params["unembed.W_U"], params["embed.W_E"].T):
            import dataclasses

            cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
        model = TLModel(cfg, params, dtype=self._numpy.dtype, source=self._numpy.source)
        model.tokenizer = self.tokenizer
        self._install(model, self._numpy.dtype, self._numpy.hook_dict)
        return torch.nn.modules.module._IncompatibleKeys([], [])

    # ---- devices and dtypes: the CPU, float64 or float32 ----------------------------------------

    def to(self, *args, **kwargs):
        """``to("cpu")`` is this model; ``to(torch.float32)`` recomputes in float32 (refgpt runs on
        the CPU only, in float64 or float32)."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type != "cpu":
            raise RefGPTError(f"to: refgpt computes on the CPU, not {device}")
        if dtype is not None and dtype != self.cfg.dtype:
            if dtype not in _FLOAT_DTYPES:
                raise RefGPTError(f"to: refgpt computes in float64 or float32, not {dtype}")
            self._install(self._numpy, np.dtype(_FLOAT_DTYPES[dtype]), self._numpy.hook_dict)
        return self

    def cpu(self):
        return self

    def cuda(self, device=None):
        raise RefGPTError("cuda: refgpt computes on the CPU")

    def mps(self):
        raise RefGPTError("mps: refgpt computes on the CPU")

    def float(self):
        return self.to(torch.float32)

    def double(self):
        return self.to(torch.float64)

    def half(self):
        raise RefGPTError("half: refgpt computes in float64 or float32")

    def bfloat16(self):
        raise RefGPTError("bfloat16: refgpt computes in float64 or float32")

    def _apply(self, fn, recurse=True):
        raise RefGPTError("this model's parameters are refgpt's arrays: move or cast it with model.to(\"cpu\"), "
                          "model.to(torch.float32) or model.to(torch.float64)")

    @classmethod
    def from_pretrained(cls, model_name, **kwargs):
        """TransformerLens's ``from_pretrained``: a directory or hub name, TL's processing keywords and
        defaults, float64 unless ``dtype`` says float32 (refgpt/tl_torch/loading.py)."""
        return cls(pretrained(model_name, **kwargs))

    @classmethod
    def from_pretrained_no_processing(cls, model_name, **kwargs):
        kwargs = {"fold_ln": False, "center_writing_weights": False, "center_unembed": False,
                  "fold_value_biases": False, **kwargs}
        return cls(pretrained(model_name, **kwargs))


#: The forward's parameters, by which run_with_cache reads what it is given.
_FORWARD = inspect.signature(HookedTransformer.forward)


@contextlib.contextmanager
def _yielding(context, value):
    """``context``, entered, yielding ``value`` (the torch-facing model, as TL's hooks() yields the model)."""
    with context, tl_errors():
        yield value


def _order(numpy_model):
    position = {n: i for i, n in enumerate(numpy_model.hook_names)}
    return lambda name: position.get(name, len(position))


def _numpy_input(input, start_at_layer):
    """The forward's input for the NumPy model: text as it is, tensors as arrays ([pos] ids as [1, pos])."""
    if isinstance(input, (torch.Tensor, np.ndarray)):
        a = array(input, "input")
        if start_at_layer is None and a.ndim == 1:
            a = a[None]  # TransformerLens: a 1-D tensor of ids is one sequence
        return a
    return input


def _token_ids(tokens):
    if tokens is None or isinstance(tokens, (int, np.integer, str)):
        return tokens
    a = array(tokens, "tokens")
    return a


def _check_device(device, what):
    if device is not None and torch.device(device).type != "cpu":
        raise RefGPTError(f"{what}: refgpt computes on the CPU, not {device}")


def _grad_saver(grads, name):
    def save(grad, hook):
        grads[name] = array(grad).copy()
    return save


def tl_sampler(logits, temperature, top_k, rng, top_p=None, freq_penalty=0.0, previous=None):
    """TransformerLens's ``utils.sample_logits``, for refgpt's generate loop (refgpt/tl/generation.py):
    the arg-max at temperature 0, else logits / temperature − freq_penalty·counts, top k or top p,
    then torch's Categorical in float32 — the same random draws as TransformerLens's."""
    if temperature == 0:
        return logits.argmax(-1)  # [batch]
    final = tensor(logits) / temperature  # [batch, d_vocab]
    if freq_penalty > 0:
        counts = torch.stack([torch.bincount(tensor(row), minlength=final.shape[-1]) for row in previous])
        final = final - freq_penalty * counts
    if top_k is not None:
        top_k = min(top_k, final.shape[-1])
        top_logits, _ = final.topk(top_k, dim=-1)
        final = final.masked_fill(final < top_logits[..., -1].unsqueeze(-1), -float("inf"))
    elif top_p is not None:
        sorted_logits, sorted_indices = torch.sort(final, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        final = final.masked_fill(remove.scatter(-1, sorted_indices, remove), -float("inf"))
    return torch.distributions.categorical.Categorical(logits=final.to(torch.float32)).sample().numpy()
