"""The worked example of docs/oracle.md: two classic GPT-2 porting bugs, and the oracle naming them.

    python docs/oracle_example.py

A seeded random GPT-2 with realistic scales (weights ~ N(0, 1/fan_in), LayerNorm gains near 1)
stands in for a checkpoint. The reference is refgpt's float64 golden file; each candidate is a
"port" with one bug, written to a safetensors file as a port would write it:

1. erf GELU instead of GPT-2's tanh approximation, in float32 (the port's own precision);
2. LayerNorm's ε outside the square root, σ = √var + ε instead of √(var + ε), in float64
   (in float32 this bug is smaller than float32's own error; docs/oracle.md says why).

tests/oracle/test_oracle.py runs these functions and checks what docs/oracle.md claims about them.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

from refgpt import Config, Model
from refgpt.oracle import golden, comparison as oracle
from refgpt.gpt2.params import param_shapes

CFG = Config(d_model=64, n_layers=4, n_heads=4, d_mlp=256, d_vocab=100, n_ctx=32)
TOKENS = np.random.default_rng(1).integers(0, CFG.d_vocab, size=(2, 16))  # [batch, pos]


def realistic_params(cfg=CFG, seed=0) -> dict[str, np.ndarray]:
    """Weights N(0, 1/fan_in), biases N(0, 0.1²), LayerNorm gains 1 + N(0, 0.1²), float32-exact."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".w"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1 or name.split(".")[-1].startswith("b_"):
            value = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = shape[-2] if name.endswith(("W_Q", "W_K", "W_V")) else (shape[0] * shape[1] if name.endswith("W_O") else shape[0])
            value = rng.standard_normal(shape) / np.sqrt(fan_in if name not in ("embed.W_E", "pos_embed.W_pos") else 1.0)
        params[name] = value.astype(np.float32).astype(np.float64)
    return params


def reference() -> golden.Golden:
    return golden.make(Model(CFG, realistic_params()), TOKENS, command=["docs/oracle_example.py"])


def erf_gelu_port() -> dict[str, np.ndarray]:
    """Bug 1: exact (erf) GELU where GPT-2 uses the tanh approximation; float32."""
    port = Model(dataclasses.replace(CFG, act_fn="gelu"), realistic_params(), dtype="float32")
    return golden.compute(port, TOKENS)


def eps_outside_sqrt_port() -> dict[str, np.ndarray]:
    """Bug 2: σ = √var + ε instead of √(var + ε) in every LayerNorm; float64."""
    eps = CFG.eps

    def sqrt_then_eps(scale, name):  # scale = √(var + ε) → √var + ε
        return np.sqrt(scale * scale - eps) + eps

    port = Model(CFG, realistic_params())
    return golden.compute(port, TOKENS, fwd_hooks=[(lambda n: n.endswith("hook_scale"), sqrt_then_eps)])


def run(directory: Path) -> dict[str, oracle.Report]:
    """Write the reference and the two candidates to ``directory``, compare, return the reports."""
    from safetensors.numpy import save_file

    ref = golden.write(directory / "golden.safetensors", reference())
    reports = {}
    for name, candidate in (("erf_gelu", erf_gelu_port()), ("eps_outside_sqrt", eps_outside_sqrt_port())):
        path = directory / f"{name}.safetensors"
        save_file({k: np.ascontiguousarray(v) for k, v in candidate.items()}, str(path))
        reports[name] = oracle.compare(ref, path)  # profile from the candidate's dtype
    return reports


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for name, report in run(Path(tmp)).items():
            print(f"$ refgpt compare golden.safetensors {name}.safetensors")
            print(report.table(after_first=2))
            print()
    sys.exit(0)
