"""refgpt for TransformerLens users, in torch: the same NumPy GPT-2, with torch tensors at every
boundary (the ``torch`` extra: ``pip install refgpt[torch]``). The NumPy core never imports this.

    from refgpt.tl_torch import HookedTransformer      # instead of transformer_lens's
    model = HookedTransformer.from_pretrained("gpt2")

- ``HookedTransformer`` (model.py): TransformerLens's HookedTransformer for GPT-2 over refgpt's
  NumPy model, module tree and all; ``TransformerBridge`` (bridge.py): TL 4's
  ``boot_transformers`` + ``enable_compatibility_mode``.
- ``ActivationCache`` (cache.py), ``HookPoint`` (hook_points.py), ``FactoredMatrix`` (circuits.py):
  TransformerLens's, over tensors, computing with refgpt's NumPy code.
- Gradients: one autograd node per forward pass, whose backward is refgpt's analytic backward
  (autograd.py).

The name is ``tl_torch`` (not ``torch``) so that ``import torch`` inside it is torch.
"""

try:
    import torch  # noqa: F401  (the torch extra: the one dependency of this room)
except ImportError:
    from ..errors import RefGPTError
    raise RefGPTError("refgpt.tl_torch needs torch, an optional dependency: pip install torch "
                      "(on CPU-only machines the CPU wheel, e.g. pip install torch==2.13.0)") from None

from .cache import ActivationCache
from .circuits import FactoredMatrix
from .config import TLConfig
from .hook_points import HookPoint
from .kv_cache import TransformerLensKeyValueCache
from .bridge import TransformerBridge
from .model import HookedTransformer

__all__ = ["ActivationCache", "FactoredMatrix", "HookPoint", "HookedTransformer", "TLConfig", "TransformerBridge",
           "TransformerLensKeyValueCache"]
