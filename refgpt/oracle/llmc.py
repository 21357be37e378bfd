"""llm.c's binary files, both ways: checkpoints, the tokenizer, the debug state, activations.

llm.c (Karpathy's GPT-2 in C and CUDA) reads and writes plain little-endian binaries, each
starting with a header of 256 int32:

``gpt2_124M.bin`` — a checkpoint. header[0] = 20240326, header[1] = version (3: float32,
5: bfloat16), [2] maxT = n_ctx, [3] V = d_vocab, [4] L, [5] NH, [6] C = d_model, [7] Vp, the
vocabulary padded up to a multiple of 128 (50257 → 50304) for faster kernels. Then the
parameters, each stacked over layers, in llm.c's order, with weights in nn.Linear's [out, in]
layout:

    wte [Vp, C]  wpe [maxT, C]  ln1w, ln1b [L, C]  qkvw [L, 3C, C]  qkvb [L, 3C]
    attprojw [L, C, C]  attprojb [L, C]  ln2w, ln2b [L, C]  fcw [L, 4C, C]  fcb [L, 4C]
    fcprojw [L, C, 4C]  fcprojb [L, C]  lnfw, lnfb [C]

In circuits notation: qkvw[L] = [W_Q | W_K | W_V] (heads side by side) transposed, attprojw =
W_Oᵀ, fcw = W_inᵀ, fcprojw = W_outᵀ; the unembedding is tied (W_U = W_Eᵀ). The padded rows of wte
are zeros: dropped on read, restored on write. llm.c's model is GPT-2 exactly: d_mlp = 4C,
tanh-GELU, LayerNorm ε = 1e-5, scores scaled by 1/√d_head; ``write_model`` refuses anything else.

``gpt2_tokenizer.bin`` — header[0] = 20240328, [1] = version (1, or 2 with [3] = the
<|endoftext|> id), [2] = number of tokens; then per token one length byte and its bytes.

``gpt2_124M_debug_state.bin`` — what a port checks itself against. header[0] = 20240327,
[1] = 2, [2] = B, [3] = T; then x [B, T] int32 (the input), y [B, T] int32 (the targets, x shifted
by one), logits [B, T, V] float32 (V, not Vp), the mean loss (one float32), and the gradients of
every parameter in checkpoint order, float32, wte's padded with zero rows to Vp as train_gpt2.py
writes them (refgpt's from refgpt/backward.py; the tied wte's gradient is the sum of its two uses).

Activations. ``read_activations`` reads a raw dump of llm.c's ``acts_memory`` (one
``fwrite(model.acts_memory, sizeof(float), model.num_activations, f)`` after ``gpt2_forward``):
the 23 ActivationTensors back to back, which ``refgpt compare --map llmc`` compares with a golden file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gpt2.activations import log_softmax
from ..gpt2.config import Config
from ..files.atomic_write import write_atomically
from ..dtypes import round_to_bfloat16, widen_bfloat16
from ..errors import RefGPTError, RefGPTTypeError, shown, whole_number, whole_numbers
from ..files.atomic_write import refuse_temporary
from ..model import Model

MODEL_MAGIC, STATE_MAGIC, TOKENIZER_MAGIC, SHARD_MAGIC = 20240326, 20240327, 20240328, 20240520
MODEL_VERSIONS = {3: "float32", 5: "bfloat16"}
HEADER_INTS = 256
_HEADER_BYTES = 4 * HEADER_INTS
_WHAT = {MODEL_MAGIC: "an llm.c model checkpoint", STATE_MAGIC: "an llm.c debug state",
         TOKENIZER_MAGIC: "an llm.c tokenizer", SHARD_MAGIC: "an llm.c token data shard"}

PARAMETERS = ("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
              "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb")


def parameter_shapes(maxT, Vp, L, C) -> dict[str, tuple[int, ...]]:
    """llm.c's ParameterTensors, in file order."""
    return {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
            "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
            "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
            "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,)}


def padded_vocab(V: int, multiple: int = 128) -> int:
    return (V + multiple - 1) // multiple * multiple


def checked_padded_vocab(V: int, C: int, padded_vocab_size=None) -> int:
    """Vp: ``padded_vocab_size`` checked (a whole number, V ≤ Vp < 2³¹ as llm.c's int32 header
    holds it, its zero rows small enough to make), else llm.c's multiple of 128."""
    if padded_vocab_size is None:
        return padded_vocab(V)
    Vp = whole_number(padded_vocab_size, "padded vocabulary size", below=2**31)
    if Vp < V:
        raise RefGPTError(f"padded vocabulary {Vp} is smaller than the vocabulary {V}")
    from ..gpt2.config import available_memory

    room = available_memory()
    if room is not None and 4 * (Vp - V) * C > room:
        raise RefGPTError(f"padded vocabulary {Vp}: its {Vp - V:,} zero rows of {C} floats would take more memory "
                          "than the machine has available")
    return Vp


# ---- the header ---------------------------------------------------------------------------------


def _read_header(path: Path, magic: int) -> tuple[np.ndarray, bytes]:
    """The 256 int32 header and the rest of the file, with the magic number checked."""
    path = Path(path)
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    refuse_temporary(path)
    data = path.read_bytes()
    if len(data) < _HEADER_BYTES:
        raise RefGPTError(f"{path}: truncated: {len(data)} bytes, shorter than llm.c's {_HEADER_BYTES}-byte header")
    header = np.frombuffer(data[:_HEADER_BYTES], dtype="<i4")  # [256]
    if int(header[0]) != magic:
        found = _WHAT.get(int(header[0]))
        hint = f": it is {found}" if found else ""
        raise RefGPTError(f"{path}: bad magic number {int(header[0])}, expected {magic} ({_WHAT[magic]}){hint}")
    return header, data[_HEADER_BYTES:]


def _header(*values) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")  # [256]
    header[: len(values)] = values
    return header.tobytes()


def write_header_last(tmp: Path, header: bytes, body) -> None:
    """``header`` then the byte strings of ``body``, with the header written last: until the body
    is complete the file starts with zeros, so one cut short (a kill, a full disk) never has a magic
    number, and no reader takes it for a file without its gradients."""
    with open(tmp, "wb") as f:
        f.write(b"\0" * len(header))
        for part in body:
            f.write(part)
        f.seek(0)
        f.write(header)


def _check_size(path, body, expected, what):
    if len(body) < expected:
        raise RefGPTError(f"{path}: truncated: the header describes {what} of {expected} bytes after the "
                          f"header, but the file has only {len(body)}")


# ---- checkpoints -------------------------------------------------------------------------------


def _check_llmc_shaped(cfg: Config, params) -> None:
    wrong = []
    if cfg.d_mlp != 4 * cfg.d_model:
        wrong.append(f"d_mlp={cfg.d_mlp} (llm.c: 4·d_model = {4 * cfg.d_model})")
    if cfg.act_fn not in ("gelu_new", "gelu_pytorch_tanh"):
        wrong.append(f"act_fn={cfg.act_fn!r} (llm.c: tanh GELU, gelu_new)")
    if cfg.eps != 1e-5:
        wrong.append(f"eps={cfg.eps} (llm.c: 1e-5)")
    if not cfg.use_attn_scale or cfg.scale_attn_by_inverse_layer_idx:
        wrong.append("attention scaling other than 1/√d_head")
    if "unembed.b_U" in params:
        wrong.append("an unembedding bias b_U")
    if not np.array_equal(params["unembed.W_U"], params["embed.W_E"].T):
        wrong.append("an unembedding W_U that is not W_Eᵀ (llm.c ties them)")
    if wrong:
        raise RefGPTError("llm.c cannot represent this model: " + "; ".join(wrong))


def llmc_parameters(model: Model) -> dict[str, np.ndarray]:
    """The model's weights as llm.c's 16 ParameterTensors (unpadded wte), in file order."""
    cfg, p = model.cfg, model.params
    _check_llmc_shaped(cfg, p)
    C, L = cfg.d_model, cfg.n_layers

    def stack(fn):
        return np.stack([fn(f"blocks.{l}.") for l in range(L)])  # [L, ...]

    def linear(W_heads):  # [head, d_model, d_head] → nn.Linear [out = head·d_head, in = d_model]
        return W_heads.transpose(1, 0, 2).reshape(C, C).T

    return {
        "wte": p["embed.W_E"], "wpe": p["pos_embed.W_pos"],
        "ln1w": stack(lambda b: p[b + "ln1.w"]), "ln1b": stack(lambda b: p[b + "ln1.b"]),
        "qkvw": stack(lambda b: np.concatenate([linear(p[b + f"attn.W_{x}"]) for x in "QKV"])),  # [L, 3C, C]
        "qkvb": stack(lambda b: np.concatenate([p[b + f"attn.b_{x}"].reshape(C) for x in "QKV"])),  # [L, 3C]
        "attprojw": stack(lambda b: p[b + "attn.W_O"].reshape(C, C).T),  # [L, C, C]
        "attprojb": stack(lambda b: p[b + "attn.b_O"]),
        "ln2w": stack(lambda b: p[b + "ln2.w"]), "ln2b": stack(lambda b: p[b + "ln2.b"]),
        "fcw": stack(lambda b: p[b + "mlp.W_in"].T),  # [L, 4C, C]
        "fcb": stack(lambda b: p[b + "mlp.b_in"]),
        "fcprojw": stack(lambda b: p[b + "mlp.W_out"].T),  # [L, C, 4C]
        "fcprojb": stack(lambda b: p[b + "mlp.b_out"]),
        "lnfw": p["ln_final.w"], "lnfb": p["ln_final.b"],
    }


def write_model(path, model: Model, dtype: str = "float32", padded_vocab_size: int | None = None) -> Path:
    """Write ``model`` as an llm.c checkpoint: version 3 (float32) or 5 (bfloat16).

    bfloat16 rounds through float32 (to nearest, ties to even), as llm.c's exporter does from
    PyTorch's float32 parameters. The vocabulary is padded with zero rows to ``padded_vocab_size``
    (default: the next multiple of 128).
    """
    versions = {v: k for k, v in MODEL_VERSIONS.items()}
    if dtype not in versions:
        raise RefGPTError(f"llm.c checkpoints are float32 or bfloat16, not {dtype!r}")
    cfg = model.cfg
    t = llmc_parameters(model)
    V, C = cfg.d_vocab, cfg.d_model
    Vp = checked_padded_vocab(V, C, padded_vocab_size)
    t["wte"] = np.concatenate([t["wte"], np.zeros((Vp - V, C), t["wte"].dtype)])  # [Vp, C]

    def body():
        for name in PARAMETERS:
            a = np.asarray(t[name], dtype=np.float32)
            yield (round_to_bfloat16(a) if dtype == "bfloat16" else a).astype("<u2" if dtype == "bfloat16" else "<f4").tobytes()

    header = _header(MODEL_MAGIC, versions[dtype], cfg.n_ctx, V, cfg.n_layers, cfg.n_heads, C, Vp)
    return write_atomically(path, lambda tmp: write_header_last(tmp, header, body()))


def read_model(path, dtype="float64") -> Model:
    """Read an llm.c checkpoint (version 3 or 5) into a refgpt Model; padded vocab rows dropped."""
    path = Path(path)
    header, body = _read_header(path, MODEL_MAGIC)
    version = int(header[1])
    if version not in MODEL_VERSIONS:
        raise RefGPTError(f"{path}: llm.c checkpoint version {version}; refgpt reads version 3 (float32) and 5 "
                          f"(bfloat16, both with a padded vocabulary), which llm.c's train_gpt2.py writes")
    maxT, V, L, NH, C, Vp = (int(h) for h in header[2:8])
    for name, v in (("max_seq_len", maxT), ("vocab_size", V), ("num_layers", L), ("num_heads", NH), ("channels", C)):
        if v < 1:
            raise RefGPTError(f"{path}: header {name} = {v}, expected a positive integer")
    if Vp < V:
        raise RefGPTError(f"{path}: header padded_vocab_size = {Vp} is smaller than vocab_size = {V}")
    shapes = parameter_shapes(maxT, Vp, L, C)
    itemsize = 4 if version == 3 else 2
    n = sum(math.prod(s) for s in shapes.values())
    _check_size(path, body, n * itemsize, f"{L} layers of width {C} (vocab {Vp}, {n:,} parameters)")
    if len(body) > n * itemsize:
        raise RefGPTError(f"{path}: {len(body) - n * itemsize} bytes after the last parameter: not a "
                          f"version-{version} checkpoint of the shape its header describes")
    flat = np.frombuffer(body, dtype="<f4" if version == 3 else "<u2")  # [n]
    flat = flat if version == 3 else widen_bfloat16(flat)  # [n] float32
    t, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        t[name] = flat[offset: offset + size].reshape(shape)
        offset += size
    if not np.isfinite(flat).all():
        raise RefGPTError(f"{path}: the parameters hold a non-finite value")
    cfg = Config(d_model=C, n_layers=L, n_heads=NH, d_mlp=4 * C, d_vocab=V, n_ctx=maxT)
    return Model(cfg, _circuits(t, cfg), dtype=dtype, source=None)


def _circuits(t, cfg) -> dict[str, np.ndarray]:
    """llm.c's tensors → circuits-notation parameters, each C-contiguous (row-major), as
    ``random_params`` and the HF reader's Conv1D [in, out] weights are. The transposes of llm.c's
    [out, in] weights would otherwise be column-major views, and NumPy's matmul takes a different
    BLAS kernel (another summation order) for those: the same numbers, different last bits."""
    C, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    W_E = t["wte"][: cfg.d_vocab]  # [V, C]: the padded rows dropped
    p = {"embed.W_E": W_E, "pos_embed.W_pos": t["wpe"], "unembed.W_U": W_E.T,
         "ln_final.w": t["lnfw"], "ln_final.b": t["lnfb"]}
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        qkv_w, qkv_b = t["qkvw"][L], t["qkvb"][L]  # [3C, C], [3C]
        for i, x in enumerate("QKV"):
            rows = slice(i * C, (i + 1) * C)
            p[b + f"attn.W_{x}"] = qkv_w[rows].T.reshape(C, H, dh).transpose(1, 0, 2)  # [head, d_model, d_head]
            p[b + f"attn.b_{x}"] = qkv_b[rows].reshape(H, dh)  # [head, d_head]
        p[b + "attn.W_O"] = t["attprojw"][L].T.reshape(H, dh, C)  # [head, d_head, d_model]
        p[b + "attn.b_O"] = t["attprojb"][L]
        p[b + "mlp.W_in"] = t["fcw"][L].T  # [d_model, d_mlp]
        p[b + "mlp.b_in"] = t["fcb"][L]
        p[b + "mlp.W_out"] = t["fcprojw"][L].T  # [d_mlp, d_model]
        p[b + "mlp.b_out"] = t["fcprojb"][L]
        for n in (1, 2):
            p[b + f"ln{n}.w"], p[b + f"ln{n}.b"] = t[f"ln{n}w"][L], t[f"ln{n}b"][L]
    p = {k: np.ascontiguousarray(v) for k, v in p.items()}
    p["unembed.W_U"] = p["embed.W_E"].T  # [C, V]: tied, a view of W_E as in HF's checkpoints
    return p


# ---- the tokenizer ------------------------------------------------------------------------------


@dataclass
class LlmcTokenizer:
    """What gpt2_tokenizer.bin holds: each token's bytes, and the <|endoftext|> id."""

    tokens: list[bytes]
    eot_token: int | None

    def decode_bytes(self, ids) -> bytes:
        """The bytes of ``ids`` (integers in [0, number of tokens)), concatenated."""
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1:
                raise RefGPTError(f"decode_bytes: expected token ids [pos], found an array of shape {list(ids.shape)}")
            ids = whole_numbers(ids, "decode_bytes: ids").tolist()
        try:
            ids = list(ids)
        except TypeError:
            raise RefGPTTypeError(f"decode_bytes: expected a sequence of token ids, found {shown(ids)}") from None
        out = []
        for position, i in enumerate(ids):
            i = whole_number(i, f"decode_bytes: id at position {position}")
            if not 0 <= i < len(self.tokens):
                raise RefGPTError(f"decode_bytes: id {i} at position {position} is outside the tokenizer's "
                                  f"{len(self.tokens)} tokens [0, {len(self.tokens)})")
            out.append(self.tokens[i])
        return b"".join(out)


def write_tokenizer(path, tokenizer) -> Path:
    """Write gpt2_tokenizer.bin (version 2) from a refgpt Tokenizer (or anything with
    ``vocab_size``, ``eot_token`` and ``decode_bytes``)."""
    n, eot = int(tokenizer.vocab_size), tokenizer.eot_token
    if eot is None:
        raise RefGPTError("tokenizer has no <|endoftext|> token, which llm.c's version-2 tokenizer file records")
    out = bytearray(_header(TOKENIZER_MAGIC, 2, n, eot))
    for i in range(n):
        b = tokenizer.decode_bytes([i])
        if not 0 < len(b) < 256:
            raise RefGPTError(f"token {i} is {len(b)} bytes; llm.c stores lengths in one byte (1..255)")
        out += bytes([len(b)]) + b
    return write_atomically(path, lambda tmp: tmp.write_bytes(bytes(out)))


def read_tokenizer(path) -> LlmcTokenizer:
    """Read gpt2_tokenizer.bin, version 1 (<|endoftext|> = 50256 implied) or 2."""
    path = Path(path)
    header, body = _read_header(path, TOKENIZER_MAGIC)
    version, n = int(header[1]), int(header[2])
    if version == 1:
        if n != 50257:
            raise RefGPTError(f"{path}: version-1 tokenizer with {n} tokens; version 1 implies GPT-2's 50257")
        eot = 50256
    elif version == 2:
        eot = int(header[3])
    else:
        raise RefGPTError(f"{path}: tokenizer version {version}; refgpt reads versions 1 and 2")
    tokens, pos = [], 0
    for i in range(n):
        if pos >= len(body) or pos + 1 + body[pos] > len(body):
            raise RefGPTError(f"{path}: truncated at token {i} of {n}")
        length = body[pos]
        if length == 0:
            raise RefGPTError(f"{path}: token {i} has length 0")
        tokens.append(bytes(body[pos + 1: pos + 1 + length]))
        pos += 1 + length
    if pos != len(body):
        raise RefGPTError(f"{path}: {len(body) - pos} bytes after the last of {n} tokens")
    if not 0 <= eot < n:
        raise RefGPTError(f"{path}: <|endoftext|> id {eot} is outside the {n} tokens")
    return LlmcTokenizer(tokens, eot)


# ---- the debug state ----------------------------------------------------------------------------


@dataclass
class DebugState:
    x: np.ndarray  # [B, T] int32, the input
    y: np.ndarray  # [B, T] int32, the targets
    logits: np.ndarray  # [B, T, V] float32
    loss: float  # the mean of the per-position losses
    grads: np.ndarray | None  # every parameter's gradient, flat in checkpoint order; None if absent


def write_debug_state(path, model: Model, tokens, grads: bool = True, targets=None) -> Path:
    """Write llm.c's debug state for ``tokens`` [B, T + 1] (x = tokens[:, :-1], y = tokens[:, 1:]),
    or ``tokens`` [B, T] = x with ``targets`` [B, T] = y (``debug_state_tokens`` checks which, and
    says it): refgpt's logits and mean loss on x, and (unless ``grads=False``) every
    parameter's gradient (``llmc_gradients``), in float32."""
    x, y, _ = debug_state_tokens(tokens, targets)
    x, _ = model.check_tokens(x)  # [B, T]
    y, _ = model.check_tokens(y)  # [B, T]
    logits = model(x)  # [B, T, V]
    logp = log_softmax(logits)  # [B, T, V]
    loss = -np.take_along_axis(logp, y[..., None], axis=-1).mean()  # scalar: mean over [B, T]
    B, T = x.shape

    def body():
        yield x.astype("<i4").tobytes() + y.astype("<i4").tobytes()
        yield np.asarray(logits, "<f4").tobytes() + np.asarray([loss], "<f4").tobytes()
        if grads:  # ---- the gradients (issue 8) ----
            for name, g in llmc_gradients(model, x, y).items():
                yield np.asarray(g, "<f4").tobytes()

    return write_atomically(path, lambda tmp: write_header_last(tmp, _header(STATE_MAGIC, 2, B, T), body()))


def llmc_gradients(model: Model, x, y, padded_vocab_size: int | None = None) -> dict[str, np.ndarray]:
    """∂(mean loss of ``model`` on inputs x, targets y [B, T])/∂ each of llm.c's 16 parameter
    tensors, in file order and llm.c's layouts; wte's is the tied gradient (embedding + unembedding
    use), padded with zero rows to ``padded_vocab_size`` (default: the next multiple of 128)."""
    g = model.loss_and_grads(x, y)
    wte = g.tied_W_E  # [V, C]
    t = llmc_parameters(Model(model.cfg, {**g.params, "embed.W_E": wte, "unembed.W_U": wte.T}, dtype=model.dtype))
    V, C = wte.shape
    Vp = checked_padded_vocab(V, C, padded_vocab_size)
    t["wte"] = np.concatenate([wte, np.zeros((Vp - V, C), wte.dtype)])  # [Vp, C]
    return t


def read_debug_state(path, vocab_size: int, cfg: Config | None = None) -> DebugState:
    """Read a debug state; ``vocab_size`` V (not in its header) sizes the logits. What follows the
    loss must be nothing, or — read only with ``cfg`` (the model's, d_vocab = V) — exactly every
    parameter's gradient (wte's padded to llm.c's Vp): a wrong V shifts every later byte, and would
    otherwise read logits as gradients (V = 8191 of 8192 leaves B·T floats after the "loss")."""
    vocab_size = whole_number(vocab_size, "debug state: vocab_size", least=1)
    if cfg is not None and cfg.d_vocab != vocab_size:
        raise RefGPTError(f"debug state: vocab_size {vocab_size} is not the model's d_vocab {cfg.d_vocab}")
    path = Path(path)
    header, body = _read_header(path, STATE_MAGIC)
    if int(header[1]) != 2:
        raise RefGPTError(f"{path}: debug state version {int(header[1])}; refgpt reads version 2 (padded-vocab llm.c)")
    B, T = int(header[2]), int(header[3])
    if B < 1 or T < 1:
        raise RefGPTError(f"{path}: header B = {B}, T = {T}: expected positive integers")
    n = 4 * (2 * B * T + B * T * vocab_size + 1)
    _check_size(path, body, n, f"x, y, logits [{B}, {T}, {vocab_size}] and the loss")
    ints = np.frombuffer(body, dtype="<i4", count=2 * B * T)  # [2·B·T]: x then y
    logits = np.frombuffer(body, dtype="<f4", count=B * T * vocab_size, offset=8 * B * T)  # [B·T·V]
    loss = float(np.frombuffer(body, dtype="<f4", count=1, offset=8 * B * T + 4 * B * T * vocab_size)[0])
    rest = body[n:]
    if len(rest) % 4:
        raise RefGPTError(f"{path}: {len(rest)} bytes after the loss: not a whole number of float32 gradients")
    if rest and cfg is None:  # nothing to count the gradients against: V cannot be told right from wrong
        fits = len(rest) // 4 // (B * T) if len(rest) % (4 * B * T) == 0 else None  # V short by this much?
        fits = fits if fits is not None and fits < vocab_size else None  # (more: gradients, more likely)
        raise RefGPTError(f"{path}: {len(rest):,} bytes after the loss, where a debug state without gradients "
                          f"ends (x, y, logits [{B}, {T}, {vocab_size}] for vocab_size {vocab_size})"
                          f"{f' (vocab_size {vocab_size + fits} would fit one exactly)' if fits else ''}: is the "
                          f"vocabulary size right? Gradients are read only against the model's config "
                          f"(read_debug_state(path, V, cfg))")
    if rest:
        n_grads = sum(math.prod(s) for s in parameter_shapes(cfg.n_ctx, padded_vocab(vocab_size), cfg.n_layers,
                                                             cfg.d_model).values())
        if len(rest) != 4 * n_grads:
            raise RefGPTError(f"{path}: {len(rest)} bytes after the loss, which are neither nothing nor the "
                              f"{n_grads:,} float32 gradients of this model ({4 * n_grads:,} bytes, Vp = "
                              f"{padded_vocab(vocab_size)}): is the vocabulary size right (V = {vocab_size}, B = {B}, "
                              f"T = {T})?")
    grads = np.frombuffer(rest, dtype="<f4") if rest else None  # [n_parameters]
    return DebugState(ints[: B * T].reshape(B, T), ints[B * T:].reshape(B, T),
                      logits.reshape(B, T, vocab_size), loss, grads)


def debug_state_tokens(tokens, targets=None):
    """(x, y, what was understood) for a debug state, from one of llm.c's two conventions:

    - ``tokens`` [B, T + 1] and no ``targets``: each row holds its inputs and, last, the next token
      of its last input: x = tokens[:, :-1], y = tokens[:, 1:] (train_gpt2.py's B×(T+1) batches);
    - ``tokens`` [B, T] = x and ``targets`` [B, T] = y, as a golden file made from llm.c's files
      holds them.

    A golden file's tokens [B, T] with its next-token targets [B, T − 1] are neither: they give a
    debug state of T − 1 positions, which is said in the returned text, never silently."""
    x = np.asarray(tokens)
    if x.ndim == 1:
        x = x[None]  # [1, pos]
    if targets is not None:
        y = np.asarray(targets)
        y = y[None] if y.ndim == 1 else y
        if y.shape == x.shape:
            return x, y, f"x = tokens [{x.shape[0]}, {x.shape[1]}], y = targets [B, T] (one per input, llm.c's)"
        if y.shape == (x.shape[0], x.shape[1] - 1):
            return (x[:, :-1], y, f"tokens [B, T] = [{x.shape[0]}, {x.shape[1]}] with next-token targets [B, T − 1]: "
                    f"read as B×(T+1) = {x.shape[0]}×({x.shape[1] - 1}+1): x = tokens[:, :-1], y = targets; "
                    f"the debug state has T = {x.shape[1] - 1}, one position fewer than the golden")
        raise RefGPTError(f"debug state: targets {list(y.shape)} fit neither tokens {list(x.shape)} (B×T, llm.c's y) "
                          f"nor next-token targets [B, T − 1]")
    if x.shape[1] < 2:
        raise RefGPTError("debug state: tokens need at least 2 positions (inputs x and next-token targets y)")
    return (x[:, :-1], x[:, 1:], f"tokens [B, T+1] = [{x.shape[0]}, {x.shape[1]}]: B×(T+1) convention, "
            f"x = tokens[:, :-1], y = tokens[:, 1:], T = {x.shape[1] - 1}")


def read_data_shard(path, B: int, T: int, start: int = 0):
    """llm.c's token data shard (dev/data/data_common.py: magic 20240520, version 1, header[2] = the
    number of tokens, then uint16 ids) → llm.c's first batch from ``start``: x [B, T] and y [B, T]
    from B·T + 1 consecutive tokens (x = buf[:-1], y = buf[1:], as llm.c's dataloader reads them)."""
    B = whole_number(B, "data shard: B", least=1)
    T = whole_number(T, "data shard: T", least=1)
    start = whole_number(start, "data shard: start", least=0)
    path = Path(path)
    header, body = _read_header(path, SHARD_MAGIC)
    version, n = int(header[1]), int(header[2])
    if version != 1:
        raise RefGPTError(f"{path}: data shard version {version}; refgpt reads version 1 (GPT-2, uint16 ids)")
    if len(body) != 2 * n:
        raise RefGPTError(f"{path}: header says {n} tokens ({2 * n} bytes), the file holds {len(body)} bytes")
    if B < 1 or T < 1 or start < 0 or start + B * T + 1 > n:
        raise RefGPTError(f"{path}: a batch B×T = {B}×{T} from token {start} needs {start + B * T + 1} tokens, "
                          f"the shard has {n}")
    buf = np.frombuffer(body, dtype="<u2", count=B * T + 1, offset=2 * start).astype(np.int64)  # [B·T + 1]
    return buf[:-1].reshape(B, T), buf[1:].reshape(B, T)


# ---- activations --------------------------------------------------------------------------------


def activation_shapes(cfg: Config, B: int, T: int, Vp: int) -> dict[str, tuple[int, ...]]:
    """llm.c's 23 ActivationTensors (train_gpt2.c), in memory order."""
    L, C, NH = cfg.n_layers, cfg.d_model, cfg.n_heads
    return {"encoded": (B, T, C), "ln1": (L, B, T, C), "ln1_mean": (L, B, T), "ln1_rstd": (L, B, T),
            "qkv": (L, B, T, 3 * C), "atty": (L, B, T, C), "preatt": (L, B, NH, T, T), "att": (L, B, NH, T, T),
            "attproj": (L, B, T, C), "residual2": (L, B, T, C), "ln2": (L, B, T, C), "ln2_mean": (L, B, T),
            "ln2_rstd": (L, B, T), "fch": (L, B, T, 4 * C), "fch_gelu": (L, B, T, 4 * C), "fcproj": (L, B, T, C),
            "residual3": (L, B, T, C), "lnf": (B, T, C), "lnf_mean": (B, T), "lnf_rstd": (B, T),
            "logits": (B, T, Vp), "probs": (B, T, Vp), "losses": (B, T)}


def read_activations(path, cfg: Config, B: int, T: int) -> dict[str, np.ndarray]:
    """A raw float32 dump of llm.c's acts_memory → its 23 tensors by llm.c name. Vp is found from
    the file's size (logits and probs are the only tensors that depend on it)."""
    B = whole_number(B, "llm.c activations: B", least=1)
    T = whole_number(T, "llm.c activations: T", least=1)
    path = Path(path)
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    refuse_temporary(path)
    n_floats, rem = divmod(path.stat().st_size, 4)
    fixed = sum(math.prod(s) for k, s in activation_shapes(cfg, B, T, 0).items())
    Vp, odd = divmod(n_floats - fixed, 2 * B * T)
    if rem or odd or Vp < cfg.d_vocab:
        raise RefGPTError(f"{path}: {path.stat().st_size} bytes is not llm.c's acts_memory for B={B}, T={T} "
                          f"and this model (L={cfg.n_layers}, C={cfg.d_model}, NH={cfg.n_heads}, V={cfg.d_vocab}): "
                          f"it would need {4 * (fixed + 2 * B * T * padded_vocab(cfg.d_vocab))} bytes with Vp = "
                          f"{padded_vocab(cfg.d_vocab)}")
    flat = np.fromfile(path, dtype="<f4")  # [n_floats]
    out, offset = {}, 0
    for name, shape in activation_shapes(cfg, B, T, Vp).items():
        size = math.prod(shape)
        out[name] = flat[offset: offset + size].reshape(shape)
        offset += size
    return out


def write_activations(path, golden_tensors: dict, cfg: Config, Vp: int | None = None) -> Path:
    """Lay out refgpt golden tensors as llm.c's acts_memory (float32), for tests and for C ports
    that want to diff their buffer directly. Needs every tensor llm.c has."""
    g = golden_tensors
    B, T = np.asarray(g["tokens"]).shape
    L, V = cfg.n_layers, cfg.d_vocab
    Vp = padded_vocab(V) if Vp is None else Vp

    def stack(suffix, fn=lambda a: a):
        return np.stack([fn(np.asarray(g[f"blocks.{l}.{suffix}"])) for l in range(L)])

    def pad(a):  # [B, T, V] → [B, T, Vp], zeros in the padding
        return np.concatenate([a, np.zeros((B, T, Vp - V), a.dtype)], axis=-1)

    losses = np.zeros((B, T))  # [B, T]
    loss = np.asarray(g["loss"])  # [B, T − 1], or [B, T] with llm.c's targets
    losses[:, : loss.shape[1]] = loss  # without llm.c's targets the last is past the golden's tokens: left 0
    qkv = lambda l: np.concatenate([np.asarray(g[f"blocks.{l}.attn.hook_{x}"]).reshape(B, T, -1) for x in "qkv"], -1)
    acts = {
        "encoded": g["blocks.0.hook_resid_pre"], "ln1": stack("ln1.out"),
        "ln1_mean": stack("ln1.hook_mean", lambda a: a[..., 0]), "ln1_rstd": stack("ln1.hook_scale", lambda a: 1 / a[..., 0]),
        "qkv": np.stack([qkv(l) for l in range(L)]), "atty": stack("attn.hook_z", lambda a: a.reshape(B, T, -1)),
        "preatt": stack("attn.hook_attn_scores", lambda a: np.where(np.isfinite(a), a, 0.0)),
        "att": stack("attn.hook_pattern"), "attproj": stack("hook_attn_out"), "residual2": stack("hook_resid_mid"),
        "ln2": stack("ln2.out"), "ln2_mean": stack("ln2.hook_mean", lambda a: a[..., 0]),
        "ln2_rstd": stack("ln2.hook_scale", lambda a: 1 / a[..., 0]), "fch": stack("mlp.hook_pre"),
        "fch_gelu": stack("mlp.hook_post"), "fcproj": stack("hook_mlp_out"), "residual3": stack("hook_resid_post"),
        "lnf": g["ln_final.out"], "lnf_mean": np.asarray(g["ln_final.hook_mean"])[..., 0],
        "lnf_rstd": 1 / np.asarray(g["ln_final.hook_scale"])[..., 0],
        "logits": pad(np.asarray(g["logits"])), "probs": pad(np.exp(np.asarray(g["log_probs"]))), "losses": losses,
    }

    def write(tmp):
        with open(tmp, "wb") as f:
            for name, shape in activation_shapes(cfg, B, T, Vp).items():
                f.write(np.asarray(acts[name], "<f4").reshape(shape).tobytes())

    return write_atomically(path, write)
