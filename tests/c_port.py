"""Build and run tests/oracle/c_port/gpt2_port.c, a float32 GPT-2 in sequential C loops.

``build(flags, defines)`` compiles it once per (compiler flags, defines) into a cache directory
and returns the executable (None without a C compiler); ``write_inputs(d, model, tokens,
targets)`` writes the model as an llm.c checkpoint and the batch as an llm.c debug state, and
``run_port(exe, inputs, d)`` runs the port on them and returns the path of its dump
(refgpt/oracle/llmc_dump.py), which ``refgpt compare --map llmc`` reads. The builds the tests and benchmarks/oracle_tolerance.py use are ``BUILDS``:
the three accumulation orders of the source at -O3, and -Ofast (reassociated, vectorised sums,
fast exp/tanh, denormals flushed) and -O3 -march=native (fused multiply-adds) in index order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "oracle" / "c_port" / "gpt2_port.c"

#: name → (compiler flags, defines): the accumulation orders a correct float32 port may use.
BUILDS = {
    "O3": (("-O3",), ()),
    "O3-reversed": (("-O3",), ("ORDER=1",)),
    "O3-8-lanes": (("-O3",), ("ORDER=2",)),
    "Ofast": (("-Ofast",), ()),
    "O3-fma": (("-O3", "-march=native"), ()),
}


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(flags=("-O3",), defines=()) -> Path | None:
    """The port compiled with ``flags`` and ``-D`` ``defines`` (cached by their hash and the
    source's); None when there is no C compiler."""
    cc = compiler()
    if cc is None:
        return None
    key = hashlib.sha256(repr((cc, tuple(flags), tuple(defines), SOURCE.read_bytes())).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("REFGPT_C_PORT_CACHE", Path(tempfile.gettempdir()) / "refgpt-c-port"))
    exe = cache / f"gpt2_port-{key}"
    if not exe.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{exe.name}.{os.getpid()}"
        subprocess.run([cc, *flags, *(f"-D{d}" for d in defines), "-o", str(tmp), str(SOURCE), "-lm"], check=True)
        os.replace(tmp, exe)
    return exe


def write_inputs(d, model, tokens, targets, name="port") -> tuple[Path, Path]:
    """The port's inputs in ``d``: the model as an llm.c checkpoint, and x, y as the head of an llm.c
    debug state (all the port reads of it). Returns (checkpoint, state)."""
    from refgpt.oracle import llmc

    d = Path(d)
    weights, state = d / f"{name}-model.bin", d / f"{name}-state.bin"
    llmc.write_model(weights, model)
    x, y = np.asarray(tokens), np.asarray(targets)
    header = np.zeros(256, "<i4")
    header[:4] = (llmc.STATE_MAGIC, 2, *x.shape)
    state.write_bytes(header.tobytes() + x.astype("<i4").tobytes() + y.astype("<i4").tobytes())
    return weights, state


def run_port(exe, inputs, d, name="port") -> Path:
    """Run the port ``exe`` on ``inputs`` (``write_inputs``); returns its dump ``d/NAME.bin``."""
    out = Path(d) / f"{name}.bin"
    subprocess.run([str(exe), *map(str, inputs), str(out)], check=True, capture_output=True)
    return out


def run_generate(exe, inputs, d, steps, name="generate") -> Path:
    """The port's greedy generation of ``steps`` tokens after the state's x (``write_inputs``, targets
    unused): a directory of llm.c-style per-step acts_memory dumps, step0.bin … (llmc_dump.read_steps)."""
    out = Path(d) / name
    out.mkdir(exist_ok=True)
    subprocess.run([str(exe), *map(str, inputs), str(out), "--generate", str(steps)], check=True, capture_output=True)
    return out


def llmc_shaped(cfg, params, seed, scale):
    """(cfg, params) of a random model as llm.c (so this port) can run it: ε = 1e-5, d_mlp = 4·d_model,
    the scores scaled by 1/√d_head, tanh GELU, W_U tied to W_E (W_U := W_Eᵀ). Every parameter whose
    shape llm.c keeps is ``params``'s; a differently shaped MLP is drawn again, as random_params(cfg, seed,
    scale) draws it for the adapted cfg."""
    from dataclasses import replace

    from random_models import random_params
    cfg = replace(cfg, d_mlp=4 * cfg.d_model, eps=1e-5, act_fn="gelu_new", use_attn_scale=True,
                  scale_attn_by_inverse_layer_idx=False)
    redrawn = random_params(cfg, seed=seed, scale=scale)
    params = {k: v if v.shape == redrawn[k].shape else redrawn[k] for k, v in params.items()}
    params["unembed.W_U"] = params["embed.W_E"].T.copy()  # [d_model, d_vocab]
    return cfg, params


def port_acts(which, model, tokens, targets, d, defines=(), gradients=False, losses=True, name="port"):
    """The dump of build ``which`` (a key of ``BUILDS``) with ``-D`` ``defines`` run on ``model`` and
    the batch, under refgpt's names: activations ([batch, pos, …], ``probs`` and llm.c's per-position
    ``loss`` too unless not ``losses``), with ``gradients`` its gradients under a golden's ``grad.``
    names. Skips without a C compiler."""
    import pytest
    from refgpt.oracle import llmc_dump
    from refgpt.oracle.name_maps import ModelShape, to_refgpt
    flags, build_defines = BUILDS[which]
    exe = build(flags, (*build_defines, *defines))
    if exe is None:
        pytest.skip("no C compiler")
    cfg = model.cfg
    raw = llmc_dump.read_dump(run_port(exe, write_inputs(d, model, tokens, targets, name), d, name), cfg)
    if gradients:
        raw, _ = llmc_dump.to_refgpt_gradients(raw, cfg)
    dropped = ("grads", "tokens", "targets", "loss_mean") + (() if losses else ("losses",))
    raw = {k: v for k, v in raw.items() if not k.startswith(dropped)}
    acts, _ = to_refgpt(raw, "llmc", ModelShape(cfg.n_layers, cfg.n_heads, cfg.d_vocab, cfg))
    return acts


def local_dump(which, seed, tmp_path, defines=(), gradients=False):
    """(params, cfg, tokens, the port's dump under refgpt's names) of build ``which`` on a random tied
    model (llm.c ties W_U to W_E), for the local verdicts' tests (``port_acts``, without the loss)."""
    from random_models import random_params
    from refgpt import Config, Model
    cfg = Config(d_model=64, n_layers=3, n_heads=4, d_mlp=256, d_vocab=97, n_ctx=32)
    params = random_params(cfg, seed=seed, scale=0.3)
    params["unembed.W_U"] = params["embed.W_E"].T.copy()
    tokens = np.random.default_rng(seed).integers(0, cfg.d_vocab, (2, 16))
    return params, cfg, tokens, port_acts(which, Model(cfg, params), tokens, tokens, tmp_path, defines, gradients,
                                          losses=False)
