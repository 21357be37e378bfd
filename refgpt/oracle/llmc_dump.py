"""What an llm.c run holds after ``gpt2_forward`` and ``gpt2_backward``, in one file refgpt compares.

llm.c keeps a model's whole state in four flat float buffers: ``params_memory``, ``acts_memory``
(23 ActivationTensors, refgpt/oracle/llmc.py ``activation_shapes``), ``grads_memory`` (∂loss/∂
each parameter, the 16 ParameterTensors' layout) and ``grads_acts_memory`` (∂loss/∂ each
activation, the ActivationTensors' layout). A **dump** is those buffers behind a header, so that
``refgpt compare golden.safetensors dump.bin --map llmc`` can check the forward and the backward
and first of all the tokens the run used. It is refgpt's format (llm.c has no such file), written
by this C function, which a port adds to test_gpt2.c (docs/oracle.md):

    void dump_state(GPT2 *m, const char *path) {  // refgpt's llm.c dump, magic 20240416
        int B = m->batch_size, T = m->seq_len, h[256] = {0};
        h[0] = 20240416; h[1] = 1; h[2] = B; h[3] = T; h[4] = m->config.padded_vocab_size;
        h[5] = m->targets != NULL; h[6] = m->grads_memory != NULL; h[7] = m->grads_acts_memory != NULL;
        FILE *f = fopen(path, "wb");
        fwrite(h, sizeof(int), 256, f);
        fwrite(m->inputs, sizeof(int), B * T, f);
        if (h[5]) { fwrite(m->targets, sizeof(int), B * T, f); fwrite(&m->mean_loss, sizeof(float), 1, f); }
        fwrite(m->acts_memory, sizeof(float), m->num_activations, f);
        if (h[6]) fwrite(m->grads_memory, sizeof(float), m->num_parameters, f);
        if (h[7]) fwrite(m->grads_acts_memory, sizeof(float), m->num_activations, f);
        fclose(f);
    }

Layout: 256 int32 (magic 20240416, version 1, B, T, Vp, has_targets, has_grads, has_grads_acts),
inputs [B, T] int32, then with targets: targets [B, T] int32 and mean_loss float32; acts_memory;
grads_memory; grads_acts_memory (float32, little-endian).

Names. ``read_dump`` returns llm.c's names: ``tokens``, ``targets``, ``loss_mean``, the 23
activations (``ln1``, ``qkv``, …), ``grads.wte`` … ``grads.lnfb`` and ``grads_acts.ln1`` …;
``to_refgpt_gradients`` turns the ``grads.*`` and ``grads_acts.*`` ones into the golden's
``grad.*`` names (refgpt/oracle/gradients.py). An llm.c debug state read as a candidate
(``read_debug_state_candidate``) gives tokens, targets, logits, loss_mean and ``grads.*``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..gpt2.config import Config
from ..errors import RefGPTError
from ..files.atomic_write import refuse_temporary, write_atomically
from . import llmc
from .name_maps import GRAD

DUMP_MAGIC = 20240416
_HEADER_BYTES = 4 * llmc.HEADER_INTS

#: grads_acts buffers llm.c never fills (its backward skips them): not compared.
UNUSED_GRADS_ACTS = ("ln1_mean", "ln1_rstd", "ln2_mean", "ln2_rstd", "lnf_mean", "lnf_rstd", "probs", "losses")


def file_magic(path) -> int | None:
    """The first int32 of a file (llm.c's magic numbers live there), None if shorter than 4 bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    return int(np.frombuffer(head, "<i4")[0]) if len(head) == 4 else None


def read_dump(path, cfg: Config) -> dict[str, np.ndarray]:
    """A dump (module docstring) of a run of the model ``cfg`` → tensors under llm.c's names."""
    path = Path(path)
    refuse_temporary(path)
    header, body = llmc._read_header(path, DUMP_MAGIC) if file_magic(path) == DUMP_MAGIC else _not_a_dump(path)
    version, B, T, Vp, has_targets, has_grads, has_grads_acts = (int(h) for h in header[1:8])
    if version != 1:
        raise RefGPTError(f"{path}: dump version {version}; refgpt reads version 1")
    if B < 1 or T < 1 or Vp < cfg.d_vocab:
        raise RefGPTError(f"{path}: header B = {B}, T = {T}, Vp = {Vp}: expected B, T ≥ 1 and Vp ≥ the "
                          f"vocabulary ({cfg.d_vocab})")
    act_shapes = llmc.activation_shapes(cfg, B, T, Vp)
    n_acts = sum(int(np.prod(s)) for s in act_shapes.values())
    par_shapes = llmc.parameter_shapes(cfg.n_ctx, Vp, cfg.n_layers, cfg.d_model)
    n_params = sum(int(np.prod(s)) for s in par_shapes.values())
    expected = 4 * (B * T * (2 if has_targets else 1) + (1 if has_targets else 0) + n_acts
                    + (n_params if has_grads else 0) + (n_acts if has_grads_acts else 0))
    if len(body) != expected:
        raise RefGPTError(f"{path}: {len(body)} bytes after the header, but B = {B}, T = {T}, Vp = {Vp} and this "
                          f"model (L = {cfg.n_layers}, C = {cfg.d_model}, NH = {cfg.n_heads}, maxT = {cfg.n_ctx}) "
                          f"make {expected}: a dump of another model, or truncated")
    out, offset = {}, 0

    def take(n, dtype="<f4"):
        nonlocal offset
        a = np.frombuffer(body, dtype=dtype, count=n, offset=offset)
        offset += 4 * n
        return a

    out["tokens"] = take(B * T, "<i4").reshape(B, T)  # [B, T]
    if has_targets:
        out["targets"] = take(B * T, "<i4").reshape(B, T)  # [B, T]
        out["loss_mean"] = take(1).reshape(())  # []
    for name, shape in act_shapes.items():
        out[name] = take(int(np.prod(shape))).reshape(shape)
    if has_grads:
        for name, shape in par_shapes.items():
            out["grads." + name] = take(int(np.prod(shape))).reshape(shape)
    if has_grads_acts:
        for name, shape in act_shapes.items():
            out["grads_acts." + name] = take(int(np.prod(shape))).reshape(shape)
    return out


def _not_a_dump(path):
    raise RefGPTError(f"{path}: not refgpt's llm.c dump (magic {DUMP_MAGIC})")


def write_dump(path, cfg: Config, tensors: dict, Vp: int | None = None) -> Path:
    """Write a dump from tensors under llm.c's names (``read_dump``'s): what the C function of the
    module docstring writes, for tests and for ports that are not C."""
    tokens = np.asarray(tensors["tokens"])  # [B, T]
    B, T = tokens.shape
    Vp = llmc.padded_vocab(cfg.d_vocab) if Vp is None else Vp
    has_targets = "targets" in tensors
    has_grads = any(k.startswith("grads.") for k in tensors)
    has_grads_acts = any(k.startswith("grads_acts.") for k in tensors)
    act_shapes = llmc.activation_shapes(cfg, B, T, Vp)
    par_shapes = llmc.parameter_shapes(cfg.n_ctx, Vp, cfg.n_layers, cfg.d_model)
    header = llmc._header(DUMP_MAGIC, 1, B, T, Vp, int(has_targets), int(has_grads), int(has_grads_acts))
    parts = [tokens.astype("<i4").tobytes()]
    if has_targets:
        parts += [np.asarray(tensors["targets"], "<i4").tobytes(), np.asarray([tensors["loss_mean"]], "<f4").tobytes()]
    parts += [_exact(tensors, name, shape) for name, shape in act_shapes.items()]
    if has_grads:
        parts += [_exact(tensors, "grads." + name, shape) for name, shape in par_shapes.items()]
    if has_grads_acts:
        parts += [_exact(tensors, "grads_acts." + name, shape) for name, shape in act_shapes.items()]
    return write_atomically(path, lambda tmp: llmc.write_header_last(tmp, header, parts))


def _exact(tensors, name, shape) -> bytes:
    a = np.asarray(tensors[name] if name in tensors else np.zeros(shape), "<f4")
    if a.shape != tuple(shape):
        raise RefGPTError(f"dump: {name} has shape {list(a.shape)}, expected {list(shape)}")
    return a.tobytes()


def llmc_tensors_of_golden(tensors: dict, cfg: Config, Vp: int | None = None) -> dict[str, np.ndarray]:
    """A golden's tensors (with gradients) under llm.c's dump names: what a correct llm.c run on the
    golden's tokens and targets holds (tests build planted-bug candidates from it)."""
    B, T = np.asarray(tensors["tokens"]).shape
    Vp = llmc.padded_vocab(cfg.d_vocab) if Vp is None else Vp
    with tempfile.TemporaryDirectory() as d:
        acts = llmc.read_activations(llmc.write_activations(Path(d) / "a.bin", tensors, cfg, Vp), cfg, B, T)
    out = {"tokens": np.asarray(tensors["tokens"]), **{k: np.array(v) for k, v in acts.items()}}
    if "targets" in tensors and np.asarray(tensors["targets"]).shape == (B, T):
        out["targets"] = np.asarray(tensors["targets"])
        out["losses"][:] = np.asarray(tensors["loss"])
    if "loss_mean" in tensors:
        out["loss_mean"] = np.asarray(tensors["loss_mean"])
    if GRAD + "logits" in tensors:
        out.update(_grads_of_golden(tensors, cfg, B, T, Vp))
    return out


def _grads_of_golden(g, cfg, B, T, Vp):
    from types import SimpleNamespace

    params = {k[len(GRAD):]: np.asarray(v) for k, v in g.items() if k.startswith(GRAD)}
    wte = params.get("tied_W_E", params["embed.W_E"])  # [V, C]
    t = llmc.llmc_parameters(SimpleNamespace(cfg=cfg, params={**params, "embed.W_E": wte, "unembed.W_U": wte.T}))
    t["wte"] = np.concatenate([wte, np.zeros((Vp - cfg.d_vocab, cfg.d_model))])  # [Vp, C]
    out = {"grads." + k: v for k, v in t.items()}
    d = lambda name: np.asarray(g[GRAD + name])  # noqa: E731
    L = cfg.n_layers

    def stack(suffix, fn=lambda a: a):
        return np.stack([fn(d(f"blocks.{l}.{suffix}")) for l in range(L)])  # [L, ...]

    causal = np.tril(np.ones((T, T)))  # [query, key]: llm.c's backward never fills the rest
    qkv = lambda l: np.concatenate([d(f"blocks.{l}.attn.hook_{x}").reshape(B, T, -1) for x in "qkv"], -1)  # noqa: E731
    logits = np.concatenate([d("logits"), np.zeros((B, T, Vp - cfg.d_vocab))], -1)  # [B, T, Vp]
    filled = {"encoded": d("blocks.0.hook_resid_pre"), "ln1": stack("ln1.out"),
              "qkv": np.stack([qkv(l) for l in range(L)]), "atty": stack("attn.hook_z", lambda a: a.reshape(B, T, -1)),
              "preatt": stack("attn.hook_attn_scores") * causal, "att": stack("attn.hook_pattern") * causal,
              "attproj": stack("hook_attn_out"), "residual2": stack("hook_resid_mid"), "ln2": stack("ln2.out"),
              "fch": stack("mlp.hook_pre"), "fch_gelu": stack("mlp.hook_post"), "fcproj": stack("hook_mlp_out"),
              "residual3": stack("hook_resid_post"), "lnf": d("ln_final.out"), "logits": logits}
    for name, shape in llmc.activation_shapes(cfg, B, T, Vp).items():
        out["grads_acts." + name] = filled[name] if name in filled else np.zeros(shape)
    return out


def to_refgpt_gradients(tensors: dict, cfg: Config) -> tuple[dict, list[str]]:
    """``grads.*`` and ``grads_acts.*`` (llm.c's names) → the golden's ``grad.*`` names; every other
    tensor is passed through. Returns (tensors, notes)."""
    out, notes = {}, []
    grads = {k[len("grads."):]: v for k, v in tensors.items() if k.startswith("grads.")}
    acts = {k[len("grads_acts."):]: v for k, v in tensors.items() if k.startswith("grads_acts.")}
    out.update({k: v for k, v in tensors.items() if not k.startswith(("grads.", "grads_acts."))})
    if grads:
        out.update(_parameter_gradients(grads, cfg))
    if acts:
        from .name_maps import ModelShape, to_refgpt

        used = {k: v for k, v in acts.items() if k not in UNUSED_GRADS_ACTS}
        mapped, _ = to_refgpt(used, "llmc", ModelShape(cfg.n_layers, cfg.n_heads, cfg.d_vocab))
        for name, a in mapped.items():
            if name.endswith("attn.hook_attn_scores"):
                a = np.where(np.isneginf(a), 0.0, a)  # llm.c's dpreatt: 0 above the diagonal, as refgpt's
            out[GRAD + name] = a
        notes.append(f"llm.c grads_acts: {', '.join(UNUSED_GRADS_ACTS)} are never filled by llm.c's backward: "
                     f"not compared")
    return out, notes


def _parameter_gradients(grads, cfg) -> dict[str, np.ndarray]:
    missing = [n for n in llmc.PARAMETERS if n not in grads]
    if missing:
        raise RefGPTError(f"llm.c grads: {missing[0]!r} is missing (a dump holds all 16 parameter gradients)")
    t = {k: np.asarray(v) for k, v in grads.items()}
    p = llmc._circuits(t, cfg)
    out = {GRAD + "tied_W_E": p.pop("embed.W_E")}  # [V, C]: llm.c's wte is used twice
    p.pop("unembed.W_U")
    out.update({GRAD + k: v for k, v in p.items()})
    return out


def read_steps(directory, ref, ref_golden) -> dict[str, np.ndarray]:
    """llm.c-style per-step dumps of a decode → a decode golden's step tensors (refgpt/oracle/decode.py).

    llm.c's generation loop runs the whole forward pass over a fixed T positions at every step and
    reads the logits of the newest position; one raw ``acts_memory`` dump per step,
    ``DIRECTORY/step{S}.bin`` (``fwrite(model.acts_memory, sizeof(float), model.num_activations, f)``
    after step S's ``gpt2_forward``), holds that pass. Step S's tensors are its rows at the step's new
    positions (the prompt's at step 0), its attention rows against the keys so far, and the keys and
    values of every position so far as the KV cache after the step (``decode.step_rows``). T is
    found from the file's size."""
    from . import decode
    from .name_maps import ModelShape, split_step, to_refgpt

    directory = Path(directory)
    if ref_golden is None or ref_golden.config is None:
        raise RefGPTError("llm.c per-step dumps need a refgpt decode golden as the reference (its config gives "
                          "the model's shape)")
    cfg = ref_golden.config
    news = {}
    for name in ref:
        step, inner = split_step(name)
        if step is not None and inner == "tokens":
            news[step] = np.shape(ref[name])
    B = next(iter(news.values()))[0]
    shape = ModelShape(cfg.n_layers, cfg.n_heads, cfg.d_vocab, cfg)
    out, start = {}, 0
    for step in sorted(news):
        end = start + news[step][1]
        path = directory / f"step{step}.bin"
        if not path.is_file():
            raise RefGPTError(f"{path}: not found; a decode of {len(news)} steps needs step0.bin … step{len(news) - 1}.bin")
        acts, _ = to_refgpt(_read_acts_of_any_T(path, cfg, B, end), "llmc", shape)
        for name in [n for n in ref if split_step(n)[0] == step]:
            inner = split_step(name)[1]
            value = decode.step_rows(acts, inner, start, end)
            if value is not None:
                out[name] = value
        probs = acts.get("probs")
        if probs is not None:
            out[f"step.{step}.probs"] = np.asarray(probs)[:, start:end]
        start = end
    return out


def _read_acts_of_any_T(path, cfg, B, at_least):
    """``llmc.read_activations`` of a dump whose T (≥ ``at_least``) is found from the file's size."""
    import math

    n_floats, rem = divmod(path.stat().st_size, 4)
    fixed = {T: sum(math.prod(s) for s in llmc.activation_shapes(cfg, B, T, 0).values())
             for T in range(at_least, cfg.n_ctx + 1)}
    Vp = llmc.padded_vocab(cfg.d_vocab)  # llm.c's: the vocabulary padded to a multiple of 128
    for T in fixed if not rem else ():
        if n_floats == fixed[T] + 2 * B * T * Vp:
            return llmc.read_activations(path, cfg, B, T)
    for T in fixed if not rem else ():  # another padding of the vocabulary
        other, odd = divmod(n_floats - fixed[T], 2 * B * T)
        if not odd and other >= cfg.d_vocab:
            return llmc.read_activations(path, cfg, B, T)
    raise RefGPTError(f"{path}: {path.stat().st_size} bytes is no llm.c acts_memory of B = {B} and any T from "
                      f"{at_least} to {cfg.n_ctx} for this model")


def read_debug_state_candidate(path, cfg: Config) -> dict[str, np.ndarray]:
    """An llm.c debug state (e.g. written by llm.c's train_gpt2.py from PyTorch) as a candidate:
    tokens x, targets y, logits, loss_mean and, when present, every parameter's gradient."""
    s = llmc.read_debug_state(path, cfg.d_vocab, cfg)
    out = {"tokens": s.x, "targets": s.y, "logits": s.logits, "loss_mean": np.asarray(s.loss, np.float32)}
    if s.grads is not None:
        shapes = llmc.parameter_shapes(cfg.n_ctx, llmc.padded_vocab(cfg.d_vocab), cfg.n_layers, cfg.d_model)
        n = sum(int(np.prod(v)) for v in shapes.values())
        if s.grads.size != n:
            raise RefGPTError(f"{path}: {s.grads.size} gradient floats, but this model's 16 parameter tensors "
                              f"hold {n} (with Vp = {llmc.padded_vocab(cfg.d_vocab)})")
        offset = 0
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            out["grads." + name] = s.grads[offset: offset + size].reshape(shape)
            offset += size
    return out
