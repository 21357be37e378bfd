"""The model that ships inside refgpt, so every command works on a fresh machine with no download.

It lives in the repository's ``weights/default/`` and installs with the package as
``refgpt.weights`` (setup.cfg maps one to the other), so ``importlib.resources`` finds it after
``pip install .`` and ``pip install -e .`` alike. Python started in the repository imports the
source ``refgpt/`` instead of the installed copy, and that has no ``refgpt.weights``: then the
model is the repository's ``weights/default/``, beside the source package. It is an ordinary HF
GPT-2 directory: ``config.json``, ``model.safetensors``, ``vocab.json``, ``merges.txt``.

It is a small GPT-2 (4 layers, d_model 144, n_ctx 128, an 8,192-token BPE vocabulary) trained
on Shakespeare by ``weights/train_default.py``; ``weights/README.md`` records how, and its files'
sha256. Any model directory holding a file named ``UNTRAINED`` is marked as a random
initialisation, and the ``refgpt`` command warns about it in everything it prints.

    model = refgpt.load_default()              # the same as refgpt.load(refgpt.default_model_path())

Beside it ships a tuned lens trained for it (``weights/default_lens/``: config.json + params.pt in
the tuned-lens package's format, made by ``weights/train_default_lens.py``); ``default_lens_path``
finds it the same way.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .checkpoint import load
from ..errors import RefGPTError

UNTRAINED_MARKER = "UNTRAINED"


def default_model_path() -> Path:
    """The directory of the embedded default model: the installed ``refgpt.weights/default``, else
    (refgpt imported from a source checkout) the repository's ``weights/default``."""
    return find_default_model([installed_weights(), SOURCE_CHECKOUT_WEIGHTS])


#: Where the default model is in a source checkout: ``weights/default`` beside the ``refgpt/`` package.
SOURCE_CHECKOUT_WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "default"


def installed_weights(folder: str = "default"):
    """``refgpt.weights/FOLDER`` as installed (a Path), or None when there is no such package."""
    try:
        return resources.files("refgpt.weights") / folder
    except ModuleNotFoundError:  # refgpt imported from the source tree: its weights/ is not a subpackage
        return None


def default_lens_path() -> Path:
    """The directory of the tuned lens trained for the embedded model (config.json + params.pt)."""
    for place in (installed_weights("default_lens"), SOURCE_CHECKOUT_WEIGHTS.parent / "default_lens"):
        if isinstance(place, Path) and (place / "config.json").is_file():
            return place
    raise RefGPTError("the embedded model's tuned lens is not installed (looked for refgpt.weights/default_lens "
                      f"and {SOURCE_CHECKOUT_WEIGHTS.parent / 'default_lens'}); pass a lens directory instead")


def default_sae_path() -> Path:
    """The folder of the SAE trained for the embedded model (SAELens's layout: cfg.json +
    sae_weights.safetensors), made by weights/train_default_sae.py."""
    for place in (installed_weights("default_sae"), SOURCE_CHECKOUT_WEIGHTS.parent / "default_sae"):
        if isinstance(place, Path) and (place / "cfg.json").is_file():
            return place
    raise RefGPTError("the embedded model's SAE is not installed (looked for refgpt.weights/default_sae "
                      f"and {SOURCE_CHECKOUT_WEIGHTS.parent / 'default_sae'}); pass an SAE folder instead")


def find_default_model(candidates) -> Path:
    """The first candidate that is a model directory (holds config.json); a RefGPTError naming
    every place looked at when none is."""
    for place in candidates:
        if isinstance(place, Path) and (place / "config.json").is_file():
            return place
    looked = ", ".join(str(p) for p in candidates if p is not None) or "nowhere"
    raise RefGPTError(f"the embedded default model is not installed as a directory (looked in {looked}); "
                      "pass a model directory instead")


def load_default(dtype="float64"):
    """The embedded default model, in float64 or float32, with its tokenizer."""
    return load(default_model_path(), dtype=dtype)


def is_default_model(directory) -> bool:
    """Is ``directory`` (a model's ``source``) the embedded default model's?"""
    if directory is None:
        return False
    try:
        return Path(directory).resolve() == default_model_path().resolve()
    except (OSError, RefGPTError):
        return False


def is_untrained(directory) -> bool:
    """Does this model directory carry the ``UNTRAINED`` marker?"""
    return (Path(directory) / UNTRAINED_MARKER).is_file()
