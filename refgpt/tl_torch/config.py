"""The torch-facing model's config: refgpt's Config, with the HookedTransformerConfig fields that
TransformerLens's own helpers read (``utils``, ``patching``, ``ActivationCache``, ``SVDInterpreter``)
set to what they are for GPT-2.

refgpt's Config (refgpt/gpt2/config.py) has TransformerLens's names for everything GPT-2 has;
TransformerLens's code also asks about architectures GPT-2 is not (``cfg.attn_only``,
``cfg.final_rms``, ``cfg.gated_mlp`` …) and about the torch side (``cfg.dtype``, ``cfg.n_devices``).
For GPT-2 those answers are facts, not choices, so the torch-facing model gives them.

One more switch, in TransformerLens's style: ``use_hook_mean`` (off by default) makes each
LayerNorm's ``hook_mean`` a hook point of the torch-facing model, as it always is of refgpt's
NumPy model. Off, the hook points are exactly TransformerLens 3.9's for GPT-2.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import RefGPTError
from ..gpt2.config import TL_SWITCHES, Config

#: Switches of the torch-facing model beyond refgpt's (each a hook point family, off by default).
TORCH_SWITCHES = {"use_hook_mean": "hook each LayerNorm's mean, blocks.L.ln1.hook_mean … (refgpt's addition)"}

#: HookedTransformerConfig fields that describe other architectures: GPT-2's values.
GPT2_FACTS = {
    "attn_only": False, "final_rms": False, "gated_mlp": False, "parallel_attn_mlp": False,
    "use_local_attn": False, "rotary_dim": None, "n_devices": 1, "num_experts": None,
    "experts_per_token": None, "ungroup_grouped_query_attention": False, "load_in_4bit": False,
    "use_normalization_before_and_after": False, "default_padding_side": "right", "post_embedding_ln": False,
    "relative_attention_max_distance": None, "relative_attention_num_buckets": None,
    "decoder_start_token_id": None, "tie_word_embeddings_out": None, "output_logits_soft_cap": -1.0,
    "attn_scores_soft_cap": -1.0, "use_qk_norm": False, "init_weights": False, "model_name": "gpt2",
    "checkpoint_index": None, "checkpoint_label_type": None, "checkpoint_value": None,
    "tokenizer_name": "gpt2", "window_size": None, "attn_types": None, "layers_block_type": None,
}


@dataclasses.dataclass(eq=True)
class TLConfig(Config):
    """refgpt's Config with TransformerLens's remaining GPT-2 facts (``GPT2_FACTS``), ``dtype`` as a
    torch dtype and the ``use_hook_mean`` switch."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "use_hook_mean", False)
        object.__setattr__(self, "_dtype", torch.float64)

    @classmethod
    def of(cls, cfg: Config, dtype: torch.dtype) -> "TLConfig":
        """A TLConfig with the same fields (and switch settings) as ``cfg``."""
        made = cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
        object.__setattr__(made, "_dtype", dtype)
        object.__setattr__(made, "normalization_type", cfg.normalization_type)
        if isinstance(cfg, TLConfig):
            object.__setattr__(made, "use_hook_mean", cfg.use_hook_mean)
        return made

    def mark_ln_folded(self) -> None:
        """As TransformerLens after fold_ln: ``normalization_type`` is "LNPre" (every LayerNorm's w
        is 1 and b is 0, so it only normalises, and the model lists no LayerNorm parameters)."""
        object.__setattr__(self, "normalization_type", "LNPre")

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def __setattr__(self, name, value):
        if name in TORCH_SWITCHES:
            if not isinstance(value, bool):
                raise RefGPTError(f"config: {name} must be True or False, found {value!r}")
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def __getattr__(self, name):
        """TransformerLens's fields for other architectures: GPT-2's value."""
        if name in GPT2_FACTS:
            return GPT2_FACTS[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (refgpt is GPT-2 only: "
                             f"TransformerLens's fields for other architectures that GPT-2 answers are "
                             f"{sorted(GPT2_FACTS)[:6]}…)")


SWITCHES = {**TL_SWITCHES, **TORCH_SWITCHES}
