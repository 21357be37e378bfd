"""refgpt: a pure-NumPy reference implementation of GPT-2.

Exact enough to be the oracle other implementations check themselves against (float64 by
default), and written to be read: every activation and every LayerNorm statistic is exposed under
TransformerLens's hook names.

    import refgpt
    model = refgpt.load("path/to/gpt2")              # config.json + model.safetensors
    logits, cache = model.run_with_cache(tokens)     # tokens: int array [pos] or [batch, pos]
    cache["ln_final.hook_scale"]                      # [batch, pos, 1]
"""

__version__ = "0.1.0"

from .cache import ActivationCache, act_name
from .checkpoint import load
from .config import Config
from .default_model import default_model_path, load_default
from .errors import RefGPTError
from .model import Model
from .tokenizer import Tokenizer

__all__ = ["ActivationCache", "Config", "Model", "RefGPTError", "Tokenizer", "act_name",
           "default_model_path", "load", "load_default"]

from .attribution import Attribution, attribute  # noqa: E402
__all__ += ["Attribution", "attribute"]
from . import golden, llmc, name_maps, oracle  # noqa: E402,F401  (refgpt.oracle.compare, refgpt.golden, refgpt.llmc)
