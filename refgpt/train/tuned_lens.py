"""Training a tuned lens (Belrose et al. 2023) as the ``tuned-lens`` package does, with refgpt's own
analytic gradient, in NumPy.

**The lens.** Translator i maps the stream h entering block i (``blocks.i.hook_resid_pre`` = HF
``hidden_states[i]``; or ``hook_resid_mid`` with ``stream="resid_mid"``) to

    h' = h + h·Wᵢᵀ + bᵢ          q = softmax(LN_final(h')·W_U + b_U)

and starts from Wᵢ = 0, bᵢ = 0: step 0 is the logit lens. Each translator has its own loss, the
package's default (``LossChoice.KL``, token shift 0):

    lossᵢ = mean over tokens of KL(p ‖ qᵢ) = Σ_v p_v·(log p_v − log qᵢ,v)

with p the model's own next-token distribution at the same position. The model is frozen.

**The gradient** (checked against torch autograd in tests/train/test_tuned_lens_training.py, ≤ 1e-10
relative in float64). With z = LN_final(h')·W_U + b_U, u = LN_final(h') and N tokens:

    ∂lossᵢ/∂z  = (q − p)/N                               softmax's Jacobian against Σ p = 1
    ∂lossᵢ/∂u  = ∂/∂z · W_Uᵀ
    ∂lossᵢ/∂h' = LayerNorm's backward (refgpt/gpt2/layernorm.py: layer_norm_backward)
    ∂lossᵢ/∂Wᵢ = (∂/∂h')ᵀ·h          ∂lossᵢ/∂bᵢ = Σ_tokens ∂/∂h'

Translator i's parameters reach only lossᵢ, so the sum of the losses (what the package calls
``backward`` on, one translator after the other) has exactly these gradients.

**The optimizer and schedule are the package's** (``tuned_lens/scripts/ingredients.py``,
``train_loop.py``): SGD with Nesterov momentum 0.9 and weight decay 10⁻³ on W and b
(refgpt/train/optim.py: SGD), lr = lr_scale·(1 − 0.9) = 0.1 (an effective 1.0), decayed linearly
to 0 (``get_linear_schedule_with_warmup`` with 0 warm-up steps: step t of N uses lr·(N − t)/N),
and before each step the gradients of *all* translators together clipped to norm 1.0
(``clip_grad_norm_``: scaled by 1/(‖g‖ + 10⁻⁶) when that is < 1). Two differences, both chosen:
refgpt computes in float64 by default (the package runs the lenses under bf16 autocast, see
benchmarks/bench_tuned_lens.py for what that costs), and it stops with a RefGPTError where the
package goes on silently: a non-finite loss or gradient (tuned-lens #123), a step with no data left
(#113), a budget the data cannot supply (checked before the first step).

**Data** as the package's ``chunk_and_tokenize``: the texts joined with ``<|endoftext|>`` (one
first), cut into windows of ``window`` tokens (the model's n_ctx by default), the last partial
window dropped; the windows are shuffled (seeded) and each step takes
``tokens_per_step / window`` of them. Deterministic: the same model, windows and settings give the
same translators, bit for bit, on one machine and BLAS thread count.

    lens = train_tuned_lens(model, windows, steps=100, tokens_per_step=4096)
    lens.translators            # {i: (W [d, d], b [d])}
    lens.save("my-lens/")       # config.json + params.pt, as the package writes them
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..dtypes import compute_dtype
from ..errors import RefGPTError, real_number
from ..files.lens_directory import STREAMS, lens_config, unembed_hash, write_lens
from ..gpt2.activations import log_softmax
from ..gpt2.layernorm import layer_norm, layer_norm_backward
from .optim import SGD

#: Elements of one [tokens, d_vocab] array in a micro-batch (2²³ float64 = 64 MiB): the step's
#: windows are processed this many logits at a time, in order; the sum does not depend on the machine.
MICRO_BATCH_LOGITS = 2**23


@dataclass(frozen=True)
class LensSettings:
    """The package's training settings (its defaults but for the budget, which must fit a CPU:
    the package's 250 steps × 2¹⁸ tokens are 65 million tokens)."""

    steps: int = 250
    tokens_per_step: int = 2**12
    lr_scale: float = 1.0  # lr = lr_scale·(1 − momentum), as the package sets it
    momentum: float = 0.9
    weight_decay: float = 1e-3
    max_grad_norm: float = 1.0
    seed: int = 42
    stream: str = "resid_pre"
    dtype: str = "float64"

    @property
    def lr(self) -> float:
        return self.lr_scale * (1.0 - self.momentum)

    def check(self):
        for name in ("steps", "tokens_per_step", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "seed" else 1):
                raise RefGPTError(f"train_tuned_lens: {name} must be a whole number ≥ {0 if name == 'seed' else 1}, "
                                  f"found {value!r:.40}")
        real_number(self.lr_scale, "train_tuned_lens: lr_scale", above=0)
        if not 0 <= real_number(self.momentum, "train_tuned_lens: momentum") < 1:
            raise RefGPTError(f"train_tuned_lens: momentum must be in [0, 1), found {self.momentum}")
        real_number(self.weight_decay, "train_tuned_lens: weight_decay", least=0)
        real_number(self.max_grad_norm, "train_tuned_lens: max_grad_norm", above=0)
        if self.stream not in STREAMS:
            raise RefGPTError(f"train_tuned_lens: stream must be one of {', '.join(STREAMS)}, found {self.stream!r}")
        compute_dtype(self.dtype)


@dataclass
class TrainedLens:
    """What ``train_tuned_lens`` returns: the translators, the settings and a per-step record."""

    translators: dict
    settings: LensSettings
    model_source: str
    unembed_hash: str
    record: dict = field(default_factory=dict)

    def save(self, directory, base_model: str | None = None, log: bool = True, dtype=None):
        """config.json + params.pt (the package's format), and training_log.json (``record``).
        ``dtype`` ("float32") stores the translators rounded to it; default: as trained."""
        d = next(iter(self.translators.values()))[0].shape[0]
        config = lens_config(d, len(self.translators), base_model or self.model_source, self.unembed_hash,
                             stream=self.settings.stream)
        stored = self.translators if dtype is None else {
            i: tuple(np.asarray(a, dtype=compute_dtype(dtype)) for a in t) for i, t in self.translators.items()}
        text = json.dumps({"settings": asdict(self.settings), **self.record}, indent=1) + "\n" if log else None
        return write_lens(directory, stored, config, training_log=text)  # one unit: lens and its log


# ---- data ---------------------------------------------------------------------------------------


def text_windows(tokenizer, texts, window: int) -> tuple[np.ndarray, float]:
    """(windows [n, window] int64, nats_to_bpb) as the package's ``chunk_and_tokenize``: the texts
    joined with ``<|endoftext|>`` (one before the first), cut into windows, the last partial window
    dropped. nats_to_bpb = (tokens / bytes of the joined text) / ln 2 turns nats per token into bits
    per byte."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise RefGPTError("text_windows: no texts given")
    sep = tokenizer.eot_token
    ids = []
    for text in texts:
        ids.append(sep)
        ids.extend(tokenizer.encode(text))
    n_bytes = sum(len(t.encode("utf-8")) for t in texts) + len(texts) * len("<|endoftext|>".encode())
    n = len(ids) // window
    windows = np.asarray(ids[:n * window], dtype=np.int64).reshape(n, window)  # [n, window]
    return windows, (len(ids) / n_bytes) / math.log(2)


# ---- the objective and its gradient -------------------------------------------------------------


def stream_names(n_layers: int, stream: str) -> list[str]:
    """The hook points the translators read: ``blocks.i.hook_resid_pre`` (or ``_mid``), i < n_layers."""
    return [f"blocks.{i}.hook_{stream}" for i in range(n_layers)]


def lens_loss_and_grads(model, h, log_p, W, b, scale=1.0, probs=None):
    """For one translator: (Σ over tokens of KL(p ‖ q), ∂/∂W, ∂/∂b), each times ``scale``.

    ``h`` [tokens, d_model] the stream it reads, ``log_p`` [tokens, d_vocab] the model's own log
    probabilities (``probs`` = exp(log_p), if the caller has it), ``W`` [d, d] and ``b`` [d] the
    translator (h ↦ h + h·Wᵀ + b)."""
    p = model.params
    translated = h + h @ W.T + b  # [tokens, d_model]
    saved = {}

    def keep(name, array):
        saved[name] = array
        return array

    u = layer_norm(translated, p["ln_final.w"], p["ln_final.b"], model.cfg.eps, keep)  # [tokens, d_model]
    z = u @ p["unembed.W_U"]  # [tokens, d_vocab]
    if "unembed.b_U" in p:
        z += p["unembed.b_U"]
    log_q = log_softmax(z)  # [tokens, d_vocab]
    probs = np.exp(log_p) if probs is None else probs  # [tokens, d_vocab]
    loss = float(np.sum(probs * (log_p - log_q))) * scale
    grad_z = np.exp(log_q)  # [tokens, d_vocab] q
    grad_z -= probs  # q − p
    grad_z *= scale
    grad_u = grad_z @ p["unembed.W_U"].T  # [tokens, d_model]
    grad_h = layer_norm_backward(grad_u, saved["hook_normalized"], saved["hook_scale"], p["ln_final.w"])["x"]  # [tokens, d_model]
    return loss, grad_h.T @ h, grad_h.sum(axis=0)  # loss, [d, d], [d]


def lens_step_gradients(model, windows, translators, stream="resid_pre"):
    """(losses [n_layers], grads {"i.weight": …, "i.bias": …}) of the mean-KL objective over
    ``windows`` [n, T], micro-batch by micro-batch (MICRO_BATCH_LOGITS)."""
    n, T = windows.shape
    L = model.cfg.n_layers
    names = stream_names(L, stream)
    per_batch = max(1, MICRO_BATCH_LOGITS // (T * model.cfg.d_vocab))
    scale = 1.0 / (n * T)
    losses = np.zeros(L)
    grads = {}
    for start in range(0, n, per_batch):
        logits, cache = model.run_with_cache(windows[start:start + per_batch], names=names)
        log_p = log_softmax(logits.reshape(-1, logits.shape[-1]))  # [tokens, d_vocab]
        probs = np.exp(log_p)  # [tokens, d_vocab]
        for i in range(L):
            W, b = translators[i]
            h = cache[names[i]].reshape(-1, model.cfg.d_model)  # [tokens, d_model]
            loss, gW, gb = lens_loss_and_grads(model, h, log_p, W, b, scale, probs)
            losses[i] += loss
            for key, g in ((f"{i}.weight", gW), (f"{i}.bias", gb)):
                if key in grads:
                    grads[key] += g
                else:
                    grads[key] = g
    return losses, grads


def clip_gradients(grads: dict, max_norm: float) -> float:
    """torch's ``clip_grad_norm_`` over all of ``grads`` at once, in place: the total 2-norm (the
    norm of the per-tensor norms), and grads·max_norm/(norm + 10⁻⁶) when that factor is < 1.
    Returns the norm before clipping (a non-finite one leaves the gradients as they are)."""
    total = float(np.linalg.norm([np.linalg.norm(g) for g in grads.values()]))
    factor = max_norm / (total + 1e-6)
    if factor < 1.0 and math.isfinite(total):  # a non-finite norm is the caller's error to report
        for g in grads.values():
            g *= factor
    return total


def linear_decay(step: int, steps: int) -> float:
    """The package's schedule factor at step t of N (no warm-up): (N − t)/N."""
    return max(0.0, (steps - step) / max(1, steps))


# ---- the loop -----------------------------------------------------------------------------------


def train_tuned_lens(model, windows, settings: LensSettings | None = None, progress=None, **overrides) -> TrainedLens:
    """Train one translator per block of ``model`` on ``windows`` [n, T] token ids (see the module
    docstring); ``settings`` (a LensSettings) or keyword overrides of its fields (``steps=…``).

    ``progress``: a file for one line per step (step, lr, each translator's KL, gradient norm,
    seconds), e.g. sys.stderr; None prints nothing. A data budget the windows cannot supply, a
    tokens_per_step that is not a whole number of windows, or a non-finite loss or gradient is a
    RefGPTError naming what ran out or went wrong."""
    settings = settings or LensSettings()
    settings = LensSettings(**{**asdict(settings), **overrides})
    settings.check()
    dtype = compute_dtype(settings.dtype)
    if model.dtype != dtype:
        raise RefGPTError(f"train_tuned_lens: the model computes in {model.dtype.name} but settings.dtype is "
                          f"{dtype.name}; load the model in {dtype.name}")
    batches, T, per_step, n_windows = _step_batches(model, windows, settings)
    d, L = model.cfg.d_model, model.cfg.n_layers
    params = {}
    for i in range(L):
        params[f"{i}.weight"], params[f"{i}.bias"] = np.zeros((d, d), dtype), np.zeros(d, dtype)
    translators = {i: (params[f"{i}.weight"], params[f"{i}.bias"]) for i in range(L)}
    opt = SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay, nesterov=True)
    record = {"model": str(model.source), "windows": n_windows, "window_tokens": T, "windows_per_step": per_step,
              "steps": [], "lr": [], "kl": [], "grad_norm": [], "clipped": []}
    for step in range(settings.steps):
        started = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            raise RefGPTError(f"train_tuned_lens: the data ran out: no windows left for step {step + 1} of "
                              f"{settings.steps} (the data gave {step} steps' worth)")
        batch = _checked_batch(model, batch, step, T, per_step)
        losses, grads = lens_step_gradients(model, batch, translators, settings.stream)
        bad = [i for i in range(L) if not math.isfinite(losses[i])]
        if bad:
            raise RefGPTError(f"train_tuned_lens: step {step + 1}: translator {bad[0]}'s loss is {losses[bad[0]]} "
                              "(the lens diverged: lower lr_scale)")
        norm = clip_gradients(grads, settings.max_grad_norm)
        if not math.isfinite(norm):
            raise RefGPTError(f"train_tuned_lens: step {step + 1}: the gradient's norm is {norm}")
        lr = settings.lr * linear_decay(step, settings.steps)
        opt.step(grads, lr=lr)
        bad = [key for key, a in params.items() if not np.all(np.isfinite(a))]
        if bad:
            i, part = bad[0].split(".")
            raise RefGPTError(f"train_tuned_lens: step {step + 1}: translator {i}'s {part} is no longer finite "
                              "(the lens diverged: lower lr_scale)")
        record["steps"].append(step + 1)
        record["lr"].append(lr)
        record["kl"].append([float(x) for x in losses])
        record["grad_norm"].append(norm)
        record["clipped"].append(bool(settings.max_grad_norm / (norm + 1e-6) < 1.0))
        if progress is not None:
            kls = " ".join(f"{x:.4f}" for x in losses)
            print(f"lens step {step + 1:>{len(str(settings.steps))}}/{settings.steps}  lr {lr:.4f}  "
                  f"KL per translator (nats) {kls}  mean {losses.mean():.4f}  ‖g‖ {norm:.3g}  "
                  f"{time.perf_counter() - started:.1f} s", file=progress, flush=True)
    return TrainedLens(translators=translators, settings=settings, model_source=str(model.source),
                       unembed_hash=unembed_hash(model.params["unembed.W_U"]), record=record)


def _step_batches(model, windows, settings):
    """(an iterator of each step's windows, T, windows per step, windows given or None).

    An array [n, T] is checked against the budget up front and shuffled (seeded); any other
    iterable is taken to yield each step's windows [windows_per_step, T] in order, as they come."""
    if isinstance(windows, np.ndarray) or isinstance(windows, (list, tuple)):
        windows = np.asarray(windows)
        if windows.ndim != 2 or windows.dtype.kind not in "iu" or windows.size == 0:
            raise RefGPTError(f"train_tuned_lens: windows must be token ids [n, T], found {windows.dtype} "
                              f"{list(windows.shape)}")
        model.check_tokens(windows)
        n_windows, T = windows.shape
        per_step = _windows_per_step(settings, T)
        needed = settings.steps * per_step
        if needed > n_windows:
            raise RefGPTError(f"train_tuned_lens: the data cannot supply the budget: {settings.steps} steps × {per_step} "
                              f"windows of {T} tokens need {needed:,} windows ({needed * T:,} tokens), but the data "
                              f"has {n_windows:,} ({n_windows * T:,} tokens); give more text, or fewer steps or "
                              "tokens per step")
        order = np.random.default_rng(settings.seed).permutation(n_windows)
        return (windows[order[s * per_step:(s + 1) * per_step]] for s in range(settings.steps)), T, per_step, n_windows
    iterator = iter(windows)
    first = next(iterator, None)
    if first is None:
        raise RefGPTError("train_tuned_lens: the data ran out before step 1: the iterable gave no windows")
    first = np.asarray(first)
    if first.ndim != 2:
        raise RefGPTError(f"train_tuned_lens: each step's windows must be [n, T], found {list(first.shape)}")
    T = first.shape[1]
    per_step = _windows_per_step(settings, T)

    def chained():
        yield first
        yield from iterator

    return chained(), T, per_step, None


def _windows_per_step(settings, T: int) -> int:
    per_step, rest = divmod(settings.tokens_per_step, T)
    if rest or per_step == 0:
        raise RefGPTError(f"train_tuned_lens: tokens_per_step {settings.tokens_per_step:,} is not a whole number of "
                          f"{T}-token windows (the package requires it too)")
    return per_step


def _checked_batch(model, batch, step: int, T: int, per_step: int) -> np.ndarray:
    batch = np.asarray(batch)
    if batch.ndim != 2 or batch.shape != (per_step, T) or batch.dtype.kind not in "iu":
        raise RefGPTError(f"train_tuned_lens: step {step + 1}'s windows are {batch.dtype} {list(batch.shape)}, expected "
                          f"token ids [{per_step}, {T}] (tokens_per_step / T windows of T tokens)")
    model.check_tokens(batch)
    return batch
