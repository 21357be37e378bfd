"""The batches correct float32 ports are checked on (issue 25), shared by tests/oracle/test_c_port.py and
tests/oracle/test_torch_ports.py, and by benchmarks/oracle_tolerance.py's port calibration.

* "trained, random tokens": the embedded trained model (d_model 144, 4 layers, 8,192 tokens) on
  random tokens, B×T = 4×64: its predictions are flat, so the vocabulary softmax sums 8,192 similar
  terms — the batch on which llm.c's CPU code, unmodified, failed the old error model;
* "trained, text": the same model on text, 2×64;
* "GPT-2 small's shape": d_model 768, 12 heads, the 50,257-token vocabulary, GPT-2's
  initialisation; one layer and 1×16 positions for the default test run (``gpt2_small_shape(L, B, T)``
  makes any other).

Targets are given (one per position, llm.c's y), so every port computes the same loss.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from refgpt import Config, Model, load_default
from refgpt.gpt2.params import param_shapes

CASES = ("trained, random tokens", "trained, text", "GPT-2 small's shape")


def trained_model() -> Model:
    m = load_default()
    return Model(m.cfg, {k: np.asarray(v, np.float32).astype(np.float64) for k, v in m.params.items()})


def gpt2_init(cfg: Config, seed: int) -> dict:
    """GPT-2's initialisation (N(0, 0.02²), the residual projections 0.02/√(2L)), with biases and
    LayerNorms moved off 0 and 1 (which would hide bugs), float32-exact, W_U tied."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".w"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif name.rsplit(".", 1)[-1].startswith("b"):
            a = 0.02 * rng.standard_normal(shape)
        else:
            std = 0.02 / np.sqrt(2 * cfg.n_layers) if name.endswith(("W_O", "W_out")) else 0.02
            a = std * rng.standard_normal(shape)
        p[name] = a.astype(np.float32).astype(np.float64)
    p["unembed.W_U"] = p["embed.W_E"].T
    return p


def gpt2_small_shape(n_layers=1, seed=0) -> Model:
    cfg = Config(d_model=768, n_layers=n_layers, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)
    return Model(cfg, gpt2_init(cfg, seed))


def random_batch(model: Model, B: int, T: int, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """x, y [B, T]: tokens and targets drawn uniformly from the model's vocabulary (``seed``)."""
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, model.cfg.d_vocab, (B, T)) for _ in range(2))


def case(name, seed=0, shape=None):
    """(model, x [B, T], y [B, T]) of a named batch; ``shape`` (L, B, T) for GPT-2 small's."""
    if name == "trained, random tokens":
        model = trained_model()
        x, y = random_batch(model, *(shape or (4, 64)), seed)
    elif name == "trained, text":
        rng = np.random.default_rng(seed)
        model = trained_model()
        B, T = shape or (2, 64)
        text = (Path(__file__).resolve().parent.parent / "docs" / "oracle.md").read_text(encoding="utf-8")
        ids = np.array(load_default().tokenizer.encode(text))
        start = int(rng.integers(0, len(ids) - B * (T + 1)))
        rows = ids[start: start + B * (T + 1)].reshape(B, T + 1)
        x, y = rows[:, :-1], rows[:, 1:]
    elif name == "GPT-2 small's shape":
        L, B, T = shape or (1, 1, 16)
        model = gpt2_small_shape(L, seed)
        x, y = random_batch(model, B, T, seed)
    else:
        raise KeyError(name)
    return model, x, y


@functools.lru_cache(maxsize=3)
def golden_of(name):
    """(the golden with gradients, model, x, y) of a named batch, made once per test session."""
    from refgpt.oracle import golden

    model, x, y = case(name)
    return golden.make(model, x, targets=y, backward=True), model, x, y
