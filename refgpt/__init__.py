"""refgpt: a pure-NumPy reference implementation of GPT-2.

Exact enough to be the oracle other implementations check themselves against (float64 by
default), and written to be read: start with ``refgpt/reference/gpt2.py``, GPT-2's forward and
backward pass written plainly, the specification every fast path here is tested against.

    import refgpt
    model = refgpt.load("path/to/gpt2")              # config.json + model.safetensors
    logits, cache = model.run_with_cache(tokens)     # tokens: int array [pos] or [batch, pos]
    cache["ln_final.hook_scale"]                      # [batch, pos, 1]

The package is a small top level and rooms named by idea, in layers; imports point down only
(tests/core/test_layers.py checks it):

- ``refgpt.reference``: GPT-2 and the rule that judges a port, NumPy only, importing nothing of
  refgpt: the specification the rest (the engine) is tested against;
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
  ``refgpt.train`` (optimizer, BPE trainer) and ``refgpt.runtimes`` (other engines run as
  candidates: ONNX Runtime, tinygrad, CTranslate2, MLX, each an optional extra), each built on the
  layers below, never on each other;
- ``refgpt.sweep``: one task over a corpus of prompts, serially or on Dask (an optional extra),
  built on analysis and oracle;
- ``refgpt.sae``: SAELens's sparse autoencoders and transcoders without torch: their folders
  (``refgpt.load_sae``), in the model at their hook, exact feature attribution, ``refgpt eval-sae``
  (docs/sae.md); built on analysis;
- ``refgpt.tl_torch`` (optional, the ``torch`` extra): TransformerLens's HookedTransformer in torch
  over this model — tensors at the boundary, the module tree, gradients through torch;
- ``refgpt.cli``, the ``refgpt`` command, on top of all of them.

``import refgpt`` loads nothing yet: each name below is imported on first use (``refgpt.load`` the
core, ``refgpt.oracle.compare(...)`` the oracle, ``refgpt.sweep`` the sweep, ``refgpt.download`` the
hub client), so the ``refgpt`` command can catch Ctrl-C from its first moment, imports included
(refgpt/__main__.py).
"""

import importlib as _importlib

#: Every public name, and the module it comes from (imported on first attribute access). A name
#: whose module is the name itself is a subpackage or module.
_LAZY = {
    "RefGPTError": "refgpt.errors", "load": "refgpt.files.checkpoint",
    "default_model_path": "refgpt.files.default_model", "load_default": "refgpt.files.default_model",
    "save": "refgpt.files.saving", "Config": "refgpt.gpt2.config", "Tokenizer": "refgpt.gpt2.tokenizer",
    "Model": "refgpt.model", "ActivationCache": "refgpt.tl.cache", "act_name": "refgpt.tl.cache",
    "__version__": "refgpt.version",
    "analysis": "refgpt.analysis", "oracle": "refgpt.oracle", "train": "refgpt.train", "cli": "refgpt.cli",
    "sweep": "refgpt.sweep",
    "attribute": "refgpt.analysis.attribution", "Attribution": "refgpt.analysis.attribution",
    "download": "refgpt.files.hub",
    "sae": "refgpt.sae", "load_sae": "refgpt.sae.folder",
}

__all__ = ["ActivationCache", "Attribution", "Config", "Model", "RefGPTError", "Tokenizer", "__version__",
           "act_name", "analysis", "attribute", "default_model_path", "download", "load", "load_default", "load_sae", "oracle", "sae",
           "save", "sweep", "train"]


def __getattr__(name):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'refgpt' has no attribute {name!r}")
    module = _importlib.import_module(target)
    value = module if target.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
