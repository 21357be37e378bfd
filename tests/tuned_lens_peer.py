"""The tuned-lens package (0.2.0, the "peers" extra) as a judge: its lens, its training loop, and
the rounding bound two computations of a lens's logits must agree within (``lens_forward_bound``).

Import after ``require_tuned_lens()`` (a skip without the package). ``package_train`` runs the
package's own ``Train.execute`` — its TunedLens, optimizer, scheduler, loss, clipping, and its
bf16 autocast — on batches we choose, in our order: only the model loading, the dataset and the
data loader are replaced (they fetch from the hub and shuffle with torchdata), so refgpt can be
trained on exactly the same windows in the same order. Used by tests/train/test_tuned_lens_training.py
and benchmarks/bench_tuned_lens.py.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np

from refgpt.gpt2.layernorm import layer_norm


def require_tuned_lens(training: bool = False):
    """(torch, tuned_lens), or a pytest skip when the peers extra is not installed; ``training``:
    also its training loop (which imports torchdata, datasets and accelerate: seconds)."""
    import pytest

    reason = "needs the tuned-lens package (the 'peers' extra: tuned-lens==0.2.0, torchdata==0.9.0)"
    torch = pytest.importorskip("torch", reason=reason)
    pytest.importorskip("transformers", reason=reason)
    with contextlib.redirect_stderr(io.StringIO()):  # torchdata's deprecation banner
        tuned_lens = pytest.importorskip("tuned_lens", reason=reason)
        if training:
            pytest.importorskip("tuned_lens.scripts.train_loop", reason=reason)
    torch.set_num_threads(1)
    return torch, tuned_lens


def package_train(hf_model, batches, num_steps: int, tokens_per_step: int, output, autocast: bool = True,
                  float32_targets: bool = True, quiet: bool = True):
    """Train a lens with the package's ``Train.execute`` on ``batches`` (arrays [b, T], every one
    the same shape; ``tokens_per_step / (b·T)`` of them per step, in order) and return the
    directory it saved (config.json + params.pt). ``autocast=False`` turns the loop's hard-coded
    ``torch.autocast(…, dtype=bfloat16)`` into a no-op (float64 models are never autocast anyway).
    ``float32_targets=False`` keeps the KL's target distribution in the model's dtype: the loop
    takes ``final_logits.float().log_softmax()``, rounding a float64 model's p to float32, which
    alone moves the translators by ~u₃₂ relative; without it a float64 run measures the algorithm."""
    import torch as th
    from tuned_lens.scripts import ingredients as ing
    from tuned_lens.scripts import train_loop

    per_gpu = int(batches[0].shape[0])

    class Model(ing.Model):
        def load(self, device=None, must_use_cache=False):
            hf_model.eval()
            hf_model.requires_grad_(False)
            return hf_model, "tokenizer (unused)"

    class Data(ing.Data):
        def load(self, tokenizer):
            return [{"input_ids": th.tensor(batches[0][0])}], 1.0

    class Loader:
        def seed(self, seed):
            pass

        def __iter__(self):
            for b in batches:
                yield {"input_ids": th.tensor(np.asarray(b, dtype=np.int64))}

    class Distributed(ing.Distributed):
        def data_loader(self, dataset):
            return Loader()

    train = train_loop.Train(model=Model(name="refgpt-test-model"), data=Data(), opt=ing.Optimizer(),
                             dist=Distributed(per_gpu_batch_size=per_gpu), output=Path(output),
                             num_steps=num_steps, tokens_per_step=tokens_per_step)
    original, original_float = th.autocast, th.Tensor.float
    if not autocast:
        th.autocast = lambda *args, **kwargs: contextlib.nullcontext()
    if not float32_targets:  # train_loop.py's only .float() is the targets' (the hash's is in unembed.py)
        def kept(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename == train_loop.__file__ and self.dtype == th.float64:
                return self
            return original_float(self, *args, **kwargs)

        th.Tensor.float = kept
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext(), \
                contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            train.execute()
    finally:
        th.autocast, th.Tensor.float = original, original_float
    return Path(output)


def gamma(m, u):
    return m * u / (1 - m * u)


def lens_forward_bound(model, W, b, h, u):
    """|z − ẑ| elementwise [..., d_vocab] for lens logits z = LN_f(h + h·Wᵀ + b)·W_U (+ b_U)
    computed in a precision with unit roundoff u, against exact arithmetic, at the inputs h:

    - the translation: each h'_j is a sum of d products and two additions, off by at most
      e_j = γ_{d+2}·(|h_j| + Σ_k |h_k||W_jk| + |b_j|);
    - LayerNorm is Lipschitz: ‖LN(x̃) − LN(x)‖ ≤ 2‖w‖_∞‖x̃ − x‖/σ_ε(x) (docs/steering.md §5), plus
      its own rounding ‖w‖_∞√n·γ·(max|x|/σ + √n) + u‖LN(x)‖ (docs/layernorm.md §6), with
      γ = γ_{2n+3} for torch's one-pass (Welford) moments, twice the two-pass count;
    - the unembedding adds δ_u·‖W_U[:, v]‖ for the LayerNorm error δ_u, and γ_{d+1}·(|u|·|W_U| + |b_U|)."""
    p = model.params
    n = model.cfg.d_model
    x = h + h @ W.T + b  # [..., n]
    e = gamma(n + 2, u) * (np.abs(h) + np.abs(h) @ np.abs(W).T + np.abs(b))  # [..., n]
    sigma = np.sqrt(x.var(-1) + model.cfg.eps)  # [...]
    w_inf = np.max(np.abs(p["ln_final.w"]))
    y = layer_norm(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)  # [..., n]
    g = gamma(2 * n + 3, u)
    ln_error = (2 * w_inf * np.linalg.norm(e, axis=-1) / sigma
                + w_inf * np.sqrt(n) * g * (np.max(np.abs(x), -1) / sigma + np.sqrt(n)) + u * np.linalg.norm(y, axis=-1))
    W_U = p["unembed.W_U"]
    b_U = np.abs(p["unembed.b_U"]) if "unembed.b_U" in p else 0.0
    return (ln_error[..., None] * np.linalg.norm(W_U, axis=0)
            + gamma(n + 1, u) * (np.abs(y) @ np.abs(W_U) + b_U))  # [..., d_vocab]


def hf_lens_forward(lens, h: np.ndarray, layer: int) -> np.ndarray:
    """The package's ``TunedLens.forward(h, layer)`` on a NumPy stream, as NumPy float64."""
    import torch as th

    dtype = lens.unembed.unembedding.weight.dtype
    with th.no_grad():
        return lens.forward(th.tensor(h, dtype=dtype), layer).double().numpy()
