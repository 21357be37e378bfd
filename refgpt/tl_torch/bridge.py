"""TransformerLens 4's way in: ``TransformerBridge.boot_transformers(name)`` (the weights as HF
stores them) and ``enable_compatibility_mode(…)`` (HookedTransformer's processing, in place).

TransformerLens 4 has only the bridge, and its demo notebooks load GPT-2 this way. refgpt's
bridge is the torch-facing HookedTransformer (refgpt/tl_torch/model.py): its hook points and
names are TransformerLens's from the start, so compatibility mode changes only the weights.
"""

from __future__ import annotations

import torch

from ..errors import RefGPTError
from .loading import pretrained
from .model import HookedTransformer
from .tensors import tensor
from .tl_errors import tl_semantics


@tl_semantics
class TransformerBridge(HookedTransformer):
    """TransformerLens 4's entry point for GPT-2: ``boot_transformers(name)`` gives the weights as
    HF stores them (no processing, as the bridge's default); ``enable_compatibility_mode(…)``
    applies HookedTransformer's processing in place. refgpt's hook points and aliases are
    TransformerLens's names from the start, so compatibility mode changes only the weights."""

    @classmethod
    def boot_transformers(cls, model_name, hf_config_overrides=None, device=None, dtype=torch.float64,
                          tokenizer=None, load_weights=True, trust_remote_code=False, model_class=None,
                          hf_model=None, n_ctx=None, revision=None, **kwargs):
        """The bridge over ``model_name`` (a directory or a hub name), weights unprocessed."""
        for name, value in (("hf_config_overrides", hf_config_overrides), ("tokenizer", tokenizer),
                            ("model_class", model_class), ("hf_model", hf_model), ("n_ctx", n_ctx)):
            if value is not None:
                raise RefGPTError(f"boot_transformers: {name}= is not supported by refgpt's GPT-2 bridge")
        if not load_weights:
            raise RefGPTError("boot_transformers: load_weights=False (a random model) is not supported")
        if kwargs:
            raise RefGPTError(f"boot_transformers: unsupported keyword(s) {sorted(kwargs)}")
        return cls(pretrained(model_name, fold_ln=False, center_writing_weights=False, center_unembed=False,
                              fold_value_biases=False, device=device, dtype=dtype, revision=revision))

    def enable_compatibility_mode(self, disable_warnings=False, no_processing=False, fold_ln=True,
                                  center_writing_weights=True, center_unembed=True, fold_value_biases=True,
                                  refactor_factored_attn_matrices=False):
        """HookedTransformer's processing, in place (TransformerLens 4's keywords and defaults)."""
        if not no_processing:
            self.process_weights_(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                  center_unembed=center_unembed, fold_value_biases=fold_value_biases,
                                  refactor_factored_attn_matrices=refactor_factored_attn_matrices)
        return None

    def tl_parameters(self) -> dict:
        """The weights by TransformerLens name, in the bridge's order (``tl_named_parameters``)."""
        return dict(self.tl_named_parameters())

    def tl_named_parameters(self):
        """(TransformerLens name, weight) in TransformerLens 4's order: embed, pos_embed, then per
        block attn (W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O), mlp (W_in, W_out, b_in, b_out), ln1, ln2;
        ln_final, unembed. The LayerNorms' w and b are listed after fold_ln too (1 and 0), as the
        bridge lists them."""
        params = dict(self.named_parameters())
        numpy_params = self._numpy.params

        def weight(name):
            return params[name] if name in params else tensor(numpy_params[name])

        yield from (("embed.W_E", weight("embed.W_E")), ("pos_embed.W_pos", weight("pos_embed.W_pos")))
        for L in range(self.cfg.n_layers):
            b = f"blocks.{L}."
            for name in ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "attn.b_Q", "attn.b_K", "attn.b_V",
                         "attn.b_O", "mlp.W_in", "mlp.W_out", "mlp.b_in", "mlp.b_out", "ln1.w", "ln1.b", "ln2.w",
                         "ln2.b"):
                yield b + name, weight(b + name)
        for name in ("ln_final.w", "ln_final.b", "unembed.W_U", "unembed.b_U"):
            yield name, weight(name)
