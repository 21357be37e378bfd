"""refgpt: a pure-NumPy reference implementation of GPT-2.

Exact enough to be the oracle other implementations check themselves against (float64 by
default), and written to be read.

    import refgpt
    model = refgpt.load("path/to/gpt2")              # config.json + model.safetensors
    logits, cache = model.run_with_cache(tokens)     # tokens: int array [pos] or [batch, pos]
    cache["ln_final.hook_scale"]                      # [batch, pos, 1]

The package is a small top level and rooms named by idea, in layers; imports point down only
(tests/core/test_layers.py checks it):

- the top level: ``errors``, ``version``, ``dtypes``, ``strict_json``, ``threads``, ``memory`` (what
  everything needs: ``threads`` runs the ops' elementwise work on the BLAS's threads, ``memory``
  holds their big arrays, docs/performance.md) and ``model``, ``backward``, ``non_finite`` (the
  Model: its forward pass, its backward, its guard);
- ``refgpt.gpt2``: GPT-2's math: the fast ops the Model runs
  (layernorm and its two views, attention, mlp, activations, loss, kv_cache, padding), its config
  and its tokenizer;
- ``refgpt.tl``: TransformerLens compatibility: hook points and hooks, the activation cache and
  its decomposition API, circuits, text and input handling, generate, weight processing;
- ``refgpt.files``: files and hub: safetensors, checkpoints in and out, the embedded model, the
  HF cache and the hub client;
- ``refgpt.analysis`` (attribution, interventions, measurements, lens, plots),
  ``refgpt.oracle`` (golden files, comparison, name maps, llm.c formats) and
  ``refgpt.train`` (optimizer, BPE trainer), each built on the layers below, never on each other;
- ``refgpt.cli``, the ``refgpt`` command, on top of all of them.

``import refgpt`` loads the core only: ``analysis``, ``oracle``, ``train``, ``cli`` and the hub client
load on first use (``refgpt.oracle.compare(...)`` works after a plain ``import refgpt``).
"""

import importlib as _importlib

from .errors import RefGPTError
from .files.checkpoint import load
from .files.default_model import default_model_path, load_default
from .files.saving import save
from .gpt2.config import Config
from .gpt2.tokenizer import Tokenizer
from .model import Model
from .tl.cache import ActivationCache, act_name
from .version import __version__

#: Subpackages and names loaded on first attribute access (the analysis, the oracle and the hub
#: client's HTTP imports cost time that a forward pass does not need).
_LAZY = {
    "analysis": "refgpt.analysis", "oracle": "refgpt.oracle", "train": "refgpt.train", "cli": "refgpt.cli",
    "attribute": "refgpt.analysis.attribution", "Attribution": "refgpt.analysis.attribution",
    "download": "refgpt.files.hub",
}

__all__ = ["ActivationCache", "Attribution", "Config", "Model", "RefGPTError", "Tokenizer", "__version__",
           "act_name", "analysis", "attribute", "default_model_path", "download", "load", "load_default", "oracle",
           "save", "train"]


def __getattr__(name):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'refgpt' has no attribute {name!r}")
    module = _importlib.import_module(target)
    return module if target.rsplit(".", 1)[-1] == name else getattr(module, name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
