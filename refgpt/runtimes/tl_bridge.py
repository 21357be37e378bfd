"""TransformerLens 4's TransformerBridge run on a golden's tokens, every hook it caches judged.

    refgpt compare golden.safetensors my-gpt2/ --runtime transformer-lens

TransformerLens 4 (what ``pip install transformer-lens`` gives today) has no HookedTransformer: its
TransformerBridge wraps the HF model. refgpt runs it as a TL 4 user does —
``TransformerBridge.boot_transformers(directory)``, ``enable_compatibility_mode(no_processing=True)``
(TransformerLens 3's hook names as aliases; no weight processing, since a golden is of the
checkpoint as saved), ``run_with_cache(tokens)`` — in float32, TL 4's default (``dtype="float64"``
from Python: the bridge runs float64 too).

**Where TransformerLens 4 comes from.** It cannot share an environment with TransformerLens 3.9 (one
``transformer_lens`` package), which the ``peers`` extra and SAELens need. If the environment's
transformer-lens is 4 or later, refgpt imports it; else ``REFGPT_TL4_DIR=DIR`` names a directory
holding it (``pip install --no-deps --target DIR transformer-lens==4.3.0``: its dependencies are
3.9's plus transformers ≥ 5.9), and refgpt runs the bridge in a subprocess with DIR first on
PYTHONPATH (``python -m refgpt.runtimes.tl_bridge``). refgpt's core never imports either.

**Names.** The bridge caches each tensor under several names: its own component hooks
(``blocks.L.attn.hook_out``, ``blocks.L.mlp.in.hook_out``, ``blocks.L.ln1.hook_out`` …) and, in
compatibility mode, TransformerLens 3's (``blocks.L.hook_attn_out``, ``blocks.L.mlp.hook_pre`` …),
which are refgpt's. ``BRIDGE_NAMES`` says which refgpt tensor each of its own names is. Every
cached name is judged (``refgpt.oracle.comparison.compare_groups``): the first group holds one name
per refgpt tensor (TL 3's where the bridge has it), each later group the names left over, so an alias that fires on the wrong
tensor (TransformerLens #1639: ``hook_attn_out`` holding the residual-added state) is named at its
op and layer, and the report's notes name the bridge's hook.

**Unjudged**: LayerNorm's mean (``hook_mean``: the bridge caches the scale and x̂, not the mean),
the loss (``run_with_cache`` on tokens computes none) and gradients (``run_with_cache(incl_bwd=True)``
is not run).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from .extras import require

#: The environment switch naming a directory that holds TransformerLens 4 (pip install --target).
TL4_DIR = "REFGPT_TL4_DIR"
TL4_VERSION = "4.3.0"

NOTES = ["TransformerLens 4's bridge caches no LayerNorm mean: the hook_mean tensors are not judged"]

#: The bridge's own hook names (the part after ``blocks.L.``, or at the top) → refgpt's name for the
#: same tensor; TransformerLens 3's names (compatibility mode's aliases) are refgpt's and map to themselves.
BRIDGE_NAMES = {
    "embed.hook_in": "tokens", "embed.hook_out": "hook_embed", "pos_embed.hook_out": "hook_pos_embed",
    "hook_in": "hook_resid_pre", "hook_out": "hook_resid_post",
    "ln1.hook_in": "hook_resid_pre", "ln1.hook_out": "ln1.out",
    "attn.hook_in": "ln1.out", "attn.q.hook_in": "ln1.out", "attn.k.hook_in": "ln1.out", "attn.v.hook_in": "ln1.out",
    "attn.q.hook_out": "attn.hook_q", "attn.k.hook_out": "attn.hook_k", "attn.v.hook_out": "attn.hook_v",
    "attn.o.hook_in": "attn.hook_z", "attn.o.hook_out": "hook_attn_out", "attn.hook_hidden_states": "hook_attn_out",
    "attn.hook_out": "hook_attn_out",
    "ln2.hook_in": "hook_resid_mid", "ln2.hook_out": "ln2.out",
    "mlp.hook_in": "ln2.out", "mlp.in.hook_in": "ln2.out", "mlp.in.hook_out": "mlp.hook_pre",
    "mlp.out.hook_in": "mlp.hook_post", "mlp.out.hook_out": "hook_mlp_out", "mlp.hook_out": "hook_mlp_out",
    "ln_final.hook_out": "ln_final.out", "unembed.hook_in": "ln_final.out", "hook_unembed": "logits",
    "unembed.hook_out": "logits", "__logits__": "logits",
}
#: The position ids the bridge feeds its position embedding: checked to be 0, 1, …, not judged.
POSITIONS = "pos_embed.hook_in"
_IN_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def refgpt_name(bridge_name: str, n_layers: int) -> str:
    """The refgpt/golden name of the tensor the bridge caches under ``bridge_name``."""
    m = _IN_BLOCK.fullmatch(bridge_name)
    if m:
        layer, rest = m.groups()
        return f"blocks.{layer}.{BRIDGE_NAMES.get(rest, rest)}"
    if bridge_name == "ln_final.hook_in":
        return f"blocks.{n_layers - 1}.hook_resid_post"
    return BRIDGE_NAMES.get(bridge_name, bridge_name)


# ---- running the bridge -------------------------------------------------------------------------


def boot(directory, dtype: str = "float32"):
    """TransformerLens 4's bridge of the HF GPT-2 in ``directory``, as a user boots it, in ``dtype``,
    compatibility mode's aliases on and no weight processing (this process must import TL 4)."""
    torch = require("torch", "transformer-lens", "running TransformerLens 4's bridge")
    bridge_module = require("transformer_lens.model_bridge", "transformer-lens", "running TransformerLens 4's bridge")
    bridge = bridge_module.TransformerBridge.boot_transformers(str(directory), dtype=getattr(torch, dtype),
                                                               device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge


def cache_of(bridge, tokens) -> dict[str, np.ndarray]:
    """``bridge.run_with_cache(tokens)`` [batch, pos]: every cached tensor by its hook name, and the
    returned logits as ``__logits__``."""
    import torch

    with torch.no_grad():
        logits, cache = bridge.run_with_cache(torch.from_numpy(np.asarray(tokens, np.int64)))
    return {"__logits__": logits.detach().cpu().numpy(),
            **{name: value.detach().cpu().numpy() for name, value in cache.items()}}


def _tl4_location() -> Path | None:
    """None when this environment's transformer-lens is 4 or later (run in this process); else the
    directory ``REFGPT_TL4_DIR`` names (run in a subprocess); else a one-line RefGPTError saying how."""
    where = os.environ.get(TL4_DIR)
    if where:
        if not (Path(where) / "transformer_lens" / "__init__.py").is_file():
            raise RefGPTError(f"{TL4_DIR}={where}: no transformer_lens package in it (make it with pip install "
                              f"--no-deps --target {where} transformer-lens=={TL4_VERSION})")
        return Path(where)
    try:
        version = importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 4:
        return None
    raise RefGPTError(f"running TransformerLens 4's bridge needs transformer-lens ≥ 4 (this environment has "
                      f"{version or 'none'}): pip install 'refgpt[transformer-lens]', or beside TransformerLens 3 "
                      f"pip install --no-deps --target DIR transformer-lens=={TL4_VERSION} and set {TL4_DIR}=DIR")


def run(directory, tokens, dtype: str = "float32") -> dict[str, np.ndarray]:
    """The bridge's cache (``cache_of``) of the HF GPT-2 in ``directory`` run on ``tokens``, in this
    process or in a subprocess importing TransformerLens 4 from ``REFGPT_TL4_DIR``."""
    directory = as_path(directory, "HF model directory")
    if not (directory / "config.json").is_file():
        raise RefGPTError(f"{directory}: not an HF model directory (no config.json) for TransformerLens 4 to boot")
    if dtype not in ("float32", "float64"):
        raise RefGPTError(f"the bridge runs float32 or float64, not {dtype!r}")
    where = _tl4_location()
    if where is None:
        return cache_of(boot(directory, dtype), tokens)
    with tempfile.TemporaryDirectory(prefix="refgpt-tl4-") as scratch:
        np.save(Path(scratch) / "tokens.npy", np.asarray(tokens, np.int64))
        out = Path(scratch) / "cache.npz"
        root = str(Path(__file__).resolve().parents[2])  # this refgpt, beside TransformerLens 4
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), root, os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-m", "refgpt.runtimes.tl_bridge", str(directory),
                               str(Path(scratch) / "tokens.npy"), str(out), dtype], env=env, capture_output=True,
                              text=True)
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if x.strip()]
            raise RefGPTError(f"{directory}: TransformerLens 4's bridge failed ({lines[-1][:300] if lines else 'no message'})")
        with np.load(out, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}


def _main(argv) -> None:
    """``python -m refgpt.runtimes.tl_bridge DIRECTORY TOKENS.npy OUT.npz DTYPE``: the subprocess."""
    import warnings

    warnings.filterwarnings("ignore")
    directory, tokens, out, dtype = argv
    np.savez(out, **cache_of(boot(directory, dtype), np.load(tokens, allow_pickle=False)))


# ---- naming and judging --------------------------------------------------------------------------


def groups(cache: dict, tokens, n_layers: int) -> tuple[list[dict[str, tuple[str, np.ndarray]]], list[str]]:
    """The bridge's ``cache`` under refgpt's names: (groups, notes). Each group maps a refgpt name to
    (the bridge's name, its tensor); the first holds one bridge name per refgpt tensor (refgpt's own
    name where the bridge caches it), each later one the names left over."""
    notes = list(NOTES)
    positions = cache.get(POSITIONS)
    if positions is not None and not np.array_equal(np.asarray(positions).reshape(-1, np.shape(tokens)[1])[0],
                                                    np.arange(np.shape(tokens)[1])):
        notes.append(f"the bridge's position ids ({POSITIONS}) are not 0, 1, …, pos − 1")
    by_target: dict[str, list[str]] = {}
    for name in cache:
        if name != POSITIONS:
            by_target.setdefault(refgpt_name(name, n_layers), []).append(name)
    out: list[dict] = []
    for target, names in by_target.items():
        names.sort(key=lambda n: n != target)  # refgpt's own name first: TL 3's alias, the name users read
        for i, name in enumerate(names):
            while len(out) <= i:
                out.append({})
            out[i][target] = (name, cache[name])
    if "tokens" not in out[0]:
        out[0]["tokens"] = ("tokens", np.asarray(tokens, np.int64))  # [batch, pos]: what it ran on
    return out, notes


def capture(directory, tokens, n_layers: int, dtype: str = "float32"):
    """Run the bridge on ``tokens`` [batch, pos]: (groups, notes) as ``groups`` gives them."""
    cache = run(directory, tokens, dtype)
    found = sorted({int(m.group(1)) for m in map(_IN_BLOCK.fullmatch, cache) if m})
    if len(found) != n_layers:
        raise RefGPTError(f"the bridge's model has {len(found)} blocks; the golden's has {n_layers}")
    return groups(cache, tokens, n_layers)


if __name__ == "__main__":
    _main(sys.argv[1:])
