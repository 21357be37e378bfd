"""TransformerLens's module tree for GPT-2, over refgpt's weights:

    model.embed (W_E), model.pos_embed (W_pos), model.blocks[L] (ln1, attn, ln2, mlp and the
    block's hook points), model.ln_final, model.unembed (W_U, b_U)

Every weight is an ``nn.Parameter`` over the NumPy model's own array (refgpt/tl_torch/numpy_model.py),
so ``model.blocks[3].attn.W_Q`` *is* the weight the forward pass multiplies with; parameters are
registered in TransformerLens's order, so ``named_parameters()`` and ``state_dict()`` list the
same names in the same order. Every hook point sits where TransformerLens has it
(``model.blocks[3].attn.hook_z``). Calling a module computes with refgpt's NumPy ops on the
tensors given (``model.ln_final(x)``, ``model.unembed(x)``, ``model.blocks[3](resid)``, …), as
TransformerLens's modules compute with torch.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from ..gpt2.layernorm import layer_norm
from ..gpt2.mlp import mlp
from ..gpt2.padding import position_ids
from ..tl.hooks import HookRun
from .tensors import array, tensor


def parameter(model, name) -> nn.Parameter:
    """The NumPy model's weight ``name`` as a Parameter over the same memory."""
    return nn.Parameter(tensor(model._numpy.params[name]))


class Component(nn.Module):
    """A module of the tree: it knows the torch-facing model (not as a submodule)."""

    def __init__(self, model, prefix: str):
        super().__init__()
        object.__setattr__(self, "_model", model)
        self.prefix = prefix

    def _register(self, *names):
        for name in names:
            self.register_parameter(name, parameter(self._model, self.prefix + name))

    def _run(self):
        """A HookRun of the NumPy model's hooks, as a forward pass makes one."""
        return HookRun(self._model._numpy.hook_dict)


class Embed(Component):
    def __init__(self, model):
        super().__init__(model, "embed.")
        self._register("W_E")

    def forward(self, tokens):
        """W_E[tokens]: [batch, pos, d_model]."""
        return tensor(array(self.W_E)[array(tokens)])


class PosEmbed(Component):
    def __init__(self, model):
        super().__init__(model, "pos_embed.")
        self._register("W_pos")

    def forward(self, tokens, past_kv_pos_offset: int = 0, attention_mask=None):
        """W_pos at each token's position [batch, pos, d_model]; with an ``attention_mask`` [batch,
        offset + pos] positions count real tokens only and a pad's embedding is 0 (TransformerLens's)."""
        tokens = array(tokens)
        W_pos = array(self.W_pos)
        batch, pos = tokens.shape
        if attention_mask is None:
            return tensor(np.repeat(W_pos[past_kv_pos_offset:past_kv_pos_offset + pos][None], batch, axis=0))
        mask = array(attention_mask).astype(np.int64)  # [batch, offset + pos]
        ids = position_ids(mask, past_kv_pos_offset)  # [batch, pos]
        real = mask[:, past_kv_pos_offset:past_kv_pos_offset + pos, None] == 1  # [batch, pos, 1]
        return tensor(np.where(real, W_pos[ids], 0.0))


class LayerNorm(Component):
    """LayerNorm: w ⊙ (x − mean)/scale + b; its hook points ``hook_scale``, ``hook_normalized``
    (and ``hook_mean`` with ``cfg.use_hook_mean``)."""

    def __init__(self, model, prefix):
        super().__init__(model, prefix)
        self._register("w", "b")

    def list_parameters(self, listed: bool):
        """Register w and b, or (after fold_ln, as TransformerLens's LayerNormPre) leave them out:
        they are 1 and 0 then, and stay in the NumPy model."""
        for name in ("w", "b"):
            if listed and name not in self._parameters:
                self.register_parameter(name, parameter(self._model, self.prefix + name))
            elif not listed and name in self._parameters:
                del self._parameters[name]

    def forward(self, x):
        run, p = self._run(), self._model._numpy.params
        return tensor(layer_norm(array(x), p[self.prefix + "w"], p[self.prefix + "b"], self._model.cfg.eps,
                                 run.scope(self.prefix)))


class Attention(Component):
    """One block's attention: W_Q, W_K, W_V [head, d_model, d_head], W_O [head, d_head, d_model],
    their biases, and ``OV``/``QK`` (FactoredMatrix [head, d_model, d_model])."""

    def __init__(self, model, prefix):
        super().__init__(model, prefix)
        self._register("W_Q", "W_O", "b_Q", "b_O", "W_K", "W_V", "b_K", "b_V")  # TransformerLens's order

    @property
    def OV(self):
        from .circuits import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self):
        from .circuits import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))


class MLP(Component):
    def __init__(self, model, prefix):
        super().__init__(model, prefix)
        self._register("W_in", "b_in", "W_out", "b_out")

    def forward(self, x):
        """W_out·act(W_in·x + b_in) + b_out, with this MLP's hooks: [batch, pos, d_model]."""
        numpy_model = self._model._numpy
        layer = int(self.prefix.split(".")[1])
        _, _, w = numpy_model.block_weights(layer)
        return tensor(mlp(array(x), w, numpy_model._act, self._run().scope(self.prefix)))


class TransformerBlock(Component):
    def __init__(self, model, layer: int):
        super().__init__(model, f"blocks.{layer}.")
        self.layer = layer
        self.ln1 = LayerNorm(model, self.prefix + "ln1.")
        self.ln2 = LayerNorm(model, self.prefix + "ln2.")
        self.attn = Attention(model, self.prefix + "attn.")
        self.mlp = MLP(model, self.prefix + "mlp.")

    def forward(self, resid_pre):
        """The block on the stream [batch, pos, d_model], its hooks applied: resid_post."""
        return tensor(self._model._numpy.block(self.layer, array(resid_pre), self._run()))


class Unembed(Component):
    def __init__(self, model):
        super().__init__(model, "unembed.")
        self._register("W_U", "b_U")

    def forward(self, residual):
        """residual·W_U + b_U: [batch, pos, d_vocab] (ln_final's output in, logits out)."""
        run = self._run()
        return tensor(self._model._numpy.unembed(array(residual), run))


def place_hook_points(model, points: dict) -> None:
    """Each HookPoint into the tree where TransformerLens has it: ``blocks.3.attn.hook_z`` becomes
    ``model.blocks[3].attn.hook_z``."""
    for name, point in points.items():
        *path, leaf = name.split(".")
        module = model
        for part in path:
            module = module[int(part)] if part.isdigit() else getattr(module, part)
        module.add_module(leaf, point)


def tree(model):
    """embed, hook_embed, pos_embed, hook_pos_embed, blocks, ln_final, unembed: the modules in
    TransformerLens's order (the hook points are placed afterwards)."""
    model.embed = Embed(model)
    model.pos_embed = PosEmbed(model)
    model.blocks = nn.ModuleList(TransformerBlock(model, L) for L in range(model.cfg.n_layers))
    model.ln_final = LayerNorm(model, "ln_final.")
    model.unembed = Unembed(model)
