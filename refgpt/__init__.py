"""refgpt: a pure-NumPy reference implementation of GPT-2.

Exact enough to be the oracle other implementations check themselves against (float64 by
default), and written to be read: every activation and every LayerNorm statistic is exposed under
TransformerLens's hook names.

    import refgpt
    model = refgpt.load("path/to/gpt2")              # config.json + model.safetensors
    logits, cache = model.run_with_cache(tokens)     # tokens: int array [pos] or [batch, pos]
    cache["ln_final.hook_scale"]                      # [batch, pos, 1]

The package in layers; imports point down only (tests/core/test_layers.py checks it):

- the core, flat in ``refgpt/``: the forward pass and what it needs (config, dtypes, safetensors
  reader, checkpoint loading, saving, tokenizer, layernorm and its views, attention, mlp,
  activations, hook_points, hooks, model, cache and its decomposition, kv_cache, generation, weight
  processing, loss and the exact backward, errors; and TransformerLens's ways in and out: padding,
  inputs, text, circuits);
- ``refgpt.analysis`` (attribution, interventions, measurements, lens, plots),
  ``refgpt.oracle`` (golden files, comparison, name maps, llm.c formats) and
  ``refgpt.train`` (optimizer, BPE trainer), each built on the core only;
- ``refgpt.cli``, the ``refgpt`` command, on top of all of them.

``import refgpt`` loads the core only, and not even all of it: the three subpackages, ``refgpt.hub``
and ``refgpt.hf_cache`` load on first use (``refgpt.oracle.compare(...)`` and
``refgpt.hub.download("gpt2")`` work after a plain ``import refgpt``).
"""

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

from .cache import ActivationCache, act_name
from .checkpoint import load
from .config import Config
from .default_model import default_model_path, load_default
from .errors import RefGPTError
from .model import Model
from .saving import save
from .tokenizer import Tokenizer
from .version import __version__

#: Subpackages and core modules loaded on first attribute access, and names that live in them. The
#: HF cache and the hub client are core, but only a hub name needs them (and the HTTP client's imports).
_LAZY = {
    "analysis": "refgpt.analysis", "oracle": "refgpt.oracle", "train": "refgpt.train", "cli": "refgpt.cli",
    "hub": "refgpt.hub", "hf_cache": "refgpt.hf_cache",
    "attribute": "refgpt.analysis.attribution", "Attribution": "refgpt.analysis.attribution",
}

#: Modules that moved into a subpackage: ``import refgpt.golden`` and ``refgpt.golden`` still work
#: and give the module at its new place (the README's "Layout" section lists them).
MOVED = {
    "refgpt.attribution": "refgpt.analysis.attribution",
    "refgpt.interventions": "refgpt.analysis.interventions",
    "refgpt.measurements": "refgpt.analysis.measurements",
    "refgpt.lens": "refgpt.analysis.lens",
    "refgpt.plots": "refgpt.analysis.plots",
    "refgpt.golden": "refgpt.oracle.golden",
    "refgpt.name_maps": "refgpt.oracle.name_maps",
    "refgpt.llmc": "refgpt.oracle.llmc",
    "refgpt.optim": "refgpt.train.optim",
    "refgpt.bpe_trainer": "refgpt.train.bpe_trainer",
    "refgpt.commands": "refgpt.cli",
}

__all__ = ["ActivationCache", "Attribution", "Config", "Model", "RefGPTError", "Tokenizer", "__version__",
           "act_name", "analysis", "attribute", "default_model_path", "hub", "load", "load_default", "oracle", "save",
           "train"]


def __getattr__(name):
    target = _LAZY.get(name) or MOVED.get(f"refgpt.{name}")
    if target is None:
        raise AttributeError(f"module 'refgpt' has no attribute {name!r}")
    module = _importlib.import_module(target)
    return module if target.rsplit(".", 1)[-1] == name or name not in vars(module) else getattr(module, name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {m.rsplit(".", 1)[-1] for m in MOVED})


def _new_name(fullname):
    """The module's name now (``refgpt.commands.predict`` → ``refgpt.cli.predict``), or None."""
    for old, new in MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class _MovedModuleFinder(_abc.MetaPathFinder, _abc.Loader):
    """``import refgpt.golden`` → the module ``refgpt.oracle.golden``, under both names (and the
    modules under a moved package: ``refgpt.commands.predict`` is ``refgpt.cli.predict``)."""

    def find_spec(self, fullname, path=None, target=None):
        if _new_name(fullname) is not None:
            return _util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return _importlib.import_module(_new_name(spec.name))

    def exec_module(self, module):
        pass


# First, so that a module under a moved package is never loaded a second time under its old name.
_sys.meta_path.insert(0, _MovedModuleFinder())
