"""A golden that states its own error: the float64 golden measured against extended precision.

A golden file is float64, so it is not the exact real-number answer either: each of its numbers
carries the rounding of a float64 forward (and backward) pass, about 2⁻⁵³ relative per op,
amplified as any port's error is (refgpt/oracle/golden.py, conditioning). ``refgpt golden
--certify`` recomputes every tensor of the file with the same code in ``np.longdouble`` — on
x86-64 Linux the x87 80-bit format, a 64-bit significand, unit roundoff 2⁻⁶⁴, 2¹¹ = 2048 times
finer than float64's — and stores per tensor X, in the header's metadata:

    golden_error[X]     = max|X_golden − X_extended| / S_X      (relative to X's scale, below)
    golden_error_abs[X] = max|X_golden − X_extended|

with S_X the scale the oracle's tolerances use (refgpt/oracle/comparison.py, ``tensor_scale``):
max(1, max|X|) for an activation, max|X| for a gradient. The extended result is itself off by
about 2⁻¹¹ of the golden's error (first-order error analysis: errors scale with the unit
roundoff), so the measured distance is the golden's error to within a few parts in 10⁴.
``refgpt compare`` prints it beside the candidate's error: "golden error ≤ 3e-16; yours 2e-7".

What "exact" means here: the same function, with the same constants — the float64 numbers
√(2/π) and 0.044715 of GELU, the config's ε — evaluated in extended precision. A port with
other roundings of those constants differs from it by about one float64 rounding.

Where ``np.longdouble`` is no wider than float64 (Windows, macOS on ARM, some aarch64 builds),
``--certify`` refuses and says so: no silent fallback to a certificate that certifies nothing.
Cost: NumPy has no BLAS for longdouble, so the matrix products run ~100× slower than float64;
docs/oracle.md gives the time for GPT-2 small at T = 64.
"""

from __future__ import annotations

import json

import numpy as np

from ..dtypes import EXTENDED_DTYPE
from ..errors import RefGPTError
from ..model import Model
from .golden import Golden, compute
from .name_maps import is_gradient


def extended_precision() -> str:
    """A name for the extended format, or RefGPTError where none is wider than float64."""
    if EXTENDED_DTYPE is None:
        raise RefGPTError(f"--certify needs np.longdouble wider than float64; on this machine it has a "
                          f"{np.finfo(np.longdouble).nmant + 1}-bit significand, as float64")
    return f"np.longdouble ({np.finfo(EXTENDED_DTYPE).nmant + 1}-bit significand, u = 2^-{np.finfo(EXTENDED_DTYPE).nmant + 1})"


def measure(golden_tensors: dict, model: Model, tokens, targets=None, progress=None) -> tuple[dict, dict]:
    """(relative, absolute) distance of every float tensor of ``golden_tensors`` from the same
    computation in extended precision (module docstring)."""
    from .comparison import tensor_scale

    precision = extended_precision()  # noqa: F841 (raises where there is no extended format)
    extended = Model(model.cfg, dict(model.params), dtype=EXTENDED_DTYPE)
    backward = any(is_gradient(n) for n in golden_tensors)
    forward = [n for n in golden_tensors if not is_gradient(n) and n != "loss_mean"]
    total = model.cfg.n_layers * (2 if backward else 1)
    done = [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(min(done[0], total), total)

    exact = compute(extended, tokens, forward, targets=targets, backward=backward, progress=tick)
    relative, absolute = {}, {}
    for name, a in golden_tensors.items():
        a = np.asarray(a)
        if a.dtype.kind != "f" or name not in exact:
            continue
        x = np.asarray(exact[name])  # [...] longdouble
        finite = np.isfinite(x)  # attention scores: the causal part
        err = np.abs(a[finite].astype(EXTENDED_DTYPE) - x[finite])  # [n_compared]
        absolute[name] = float(err.max(initial=0.0))
        relative[name] = absolute[name] / tensor_scale(name, x[finite].astype(np.float64), golden_tensors)
    return relative, absolute


#: A tensor whose golden error is this large relative to its own scale is 0 in exact arithmetic
#: (e.g. ∂loss/∂b_K: softmax ignores a constant added to every score), holding only rounding.
ZERO_IN_EXACT_ARITHMETIC = 2.0**-20


def summary(g: Golden) -> str:
    """One line: the golden's largest measured error, and the tensors that are 0 in exact arithmetic."""
    relative = json.loads(g.metadata.get("golden_error", "{}"))
    absolute = json.loads(g.metadata.get("golden_error_abs", "{}"))
    zero = sorted(n for n, e in relative.items() if e > ZERO_IN_EXACT_ARITHMETIC)
    rest = [e for n, e in relative.items() if n not in zero]
    text = (f"certified against {g.metadata.get('golden_error_precision')}: every tensor's error ≤ "
            f"{max(rest, default=0.0):.1e} relative to its scale")
    if zero:
        text += (f"; {len(zero)} tensor{'s are' if len(zero) > 1 else ' is'} 0 in exact arithmetic and hold only "
                 f"rounding, ≤ {max(absolute[n] for n in zero):.1e} absolute (e.g. {zero[0]})")
    return text


def add_certificate(g: Golden, model: Model, tokens, targets=None, progress=None) -> Golden:
    """Measure ``g`` (made from ``model`` on ``tokens``) and store the result in its metadata.
    ``progress(done, total)``: called once per block of the extended-precision passes."""
    relative, absolute = measure(g.tensors, model, tokens, targets, progress)
    g.metadata["golden_error"] = json.dumps(relative)
    g.metadata["golden_error_abs"] = json.dumps(absolute)
    g.metadata["golden_error_precision"] = extended_precision()
    return g


__all__ = ["ZERO_IN_EXACT_ARITHMETIC", "add_certificate", "extended_precision", "measure", "summary"]
