"""A sparse autoencoder (or transcoder) as SAELens defines it, in NumPy.

Every architecture reads its input the same way (``process_sae_in``), then encodes it in its own
way, and decodes with one linear map:

    x_in   = norm_in(reshape(x)) − apply_b_dec_to_input·b_dec                   [..., d_in]
    standard   f = ReLU(x_in·W_enc + b_enc)
    topk       h = x_in·W_enc + b_enc  (× ‖W_dec[i]‖ with rescale_acts_by_decoder_norm);
               f = ReLU(h) at the k largest h, 0 elsewhere
    jumprelu   h = x_in·W_enc + b_enc;  f = ReLU(h)·[h > threshold]
    gated      f = [x_in·W_enc + b_gate > 0] · ReLU(x_in·(W_enc ⊙ exp(r_mag)) + b_mag)
    x̂      = norm_out(c·W_dec + b_dec)        c = f (÷ ‖W_dec[i]‖ with rescale_acts_by_decoder_norm)

norm_in/norm_out: "none"; "constant_norm_rescale" x·√d_in/‖x‖ and back; "layer_norm" (x − μ)/(s + 1e-5)
with s the *unbiased* standard deviation (torch's ``x.std``), and back as x·s + μ — SAELens's
formulas, kept (docs/sae.md). A transcoder (architectures ``transcoder``, ``skip_transcoder``,
``jumprelu_transcoder``, ``jumprelu_skip_transcoder``) encodes x at ``hook_name`` with no b_dec
subtracted and decodes into d_out at ``hook_name_out``: f·W_dec + b_dec (+ x·W_skipᵀ), with no
norm_out. The hook points of SAELens (``hook_sae_input``, ``hook_sae_acts_pre``,
``hook_sae_acts_post``, ``hook_sae_recons``, ``hook_sae_error``, ``hook_sae_output``) are called
where SAELens calls them; a hook is ``fn(activation, name)`` returning a replacement or None.
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError

SAE_HOOKS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error",
             "hook_sae_output")
#: The weights of each architecture (besides W_enc [d_in, d_sae], W_dec [d_sae, d_out], b_dec [d_out]).
EXTRA_WEIGHTS = {
    "standard": ("b_enc",), "topk": ("b_enc",), "jumprelu": ("b_enc", "threshold"),
    "gated": ("b_gate", "r_mag", "b_mag"),
    "transcoder": ("b_enc",), "skip_transcoder": ("b_enc", "W_skip"),
    "jumprelu_transcoder": ("b_enc", "threshold"), "jumprelu_skip_transcoder": ("b_enc", "threshold", "W_skip"),
}
ARCHITECTURES = tuple(EXTRA_WEIGHTS)
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
LAYER_NORM_EPS = 1e-5  # SAELens's run_time_activation_ln_in default


class SAE:
    """One SAE: ``cfg`` (SAELens's cfg.json, 6.x keys, metadata under ``cfg["metadata"]``) and
    ``params`` (name → array, in ``dtype``). ``encode(x)`` [..., d_in] → [..., d_sae];
    ``decode(f)`` → [..., d_out]; ``forward(x)`` the two, as SAELens's ``SAE.forward``."""

    def __init__(self, cfg: dict, params: dict, dtype="float64", sparsity=None, source=None):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.params = {name: np.asarray(array, self.dtype) for name, array in params.items()}
        self.sparsity = sparsity
        self.source = source

    # ---- what the cfg says ----------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.cfg["architecture"]

    @property
    def is_transcoder(self) -> bool:
        return "transcoder" in self.architecture

    @property
    def d_in(self) -> int:
        return self.cfg["d_in"]

    @property
    def d_sae(self) -> int:
        return self.cfg["d_sae"]

    @property
    def d_out(self) -> int:
        return self.cfg.get("d_out", self.d_in) if self.is_transcoder else self.d_in

    @property
    def metadata(self) -> dict:
        return self.cfg.get("metadata", {})

    @property
    def hook_name(self):
        return self.metadata.get("hook_name")

    @property
    def hook_name_out(self):
        """Where the output goes: ``hook_name_out`` for a transcoder, else ``hook_name``."""
        return self.metadata.get("hook_name_out") or self.hook_name if self.is_transcoder else self.hook_name

    def __getattr__(self, name):
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(f"SAE has no attribute {name!r}")

    def __repr__(self):
        return (f"SAE({self.architecture}, d_in={self.d_in}, d_sae={self.d_sae}, hook={self.hook_name!r}, "
                f"dtype={self.dtype})")

    # ---- the computation ------------------------------------------------------------------
    def _reshaped(self, x):
        x = np.asarray(x, self.dtype)
        if self.cfg.get("reshape_activations") == "hook_z":
            if x.ndim < 2:
                raise RefGPTError(f"SAE at {self.hook_name}: a hook_z input needs [..., head, d_head], found {list(x.shape)}")
            x = x.reshape(*x.shape[:-2], -1)  # [..., head·d_head]
        if x.shape[-1:] != (self.d_in,):
            raise RefGPTError(f"SAE at {self.hook_name}: input of shape {list(x.shape)}, expected [..., {self.d_in}]")
        return x

    def norm_in(self, x):
        """(normalised x, state for norm_out): SAELens's run-time activation normalisation."""
        kind = self.cfg.get("normalize_activations", "none")
        if kind == "constant_norm_rescale":
            norm = np.linalg.norm(x, axis=-1, keepdims=True)  # [..., 1]
            if not np.all(norm > 0):
                raise RefGPTError(f"SAE at {self.hook_name}: normalize_activations 'constant_norm_rescale' divides by "
                                  "the input's norm, which is 0 at some position")
            coefficient = np.sqrt(self.d_in) / norm  # [..., 1]
            return x * coefficient, (1 / coefficient, 0.0)
        if kind == "layer_norm":
            mu = x.mean(-1, keepdims=True)  # [..., 1]
            centred = x - mu  # [..., d_in]
            s = centred.std(-1, ddof=1, keepdims=True)  # [..., 1]: torch's unbiased std
            return centred / (s + LAYER_NORM_EPS), (s, mu)
        return x, (1.0, 0.0)

    def process_sae_in(self, x, hooks=None):
        x = _hooked(hooks, "hook_sae_input", self._reshaped(x))
        x, state = self.norm_in(x)
        if not self.is_transcoder and self.cfg.get("apply_b_dec_to_input", True):
            x = x - self.params["b_dec"]
        return x, state

    def encode(self, x, hooks=None):
        """Feature activations [..., d_sae] of x [..., d_in] (or [..., head, d_head] for hook_z)."""
        return self._encode(x, hooks)[0]

    def _encode(self, x, hooks=None):
        p, arch = self.params, self.architecture
        x_in, state = self.process_sae_in(x, hooks)
        if arch == "gated":
            active = (x_in @ p["W_enc"] + p["b_gate"]) > 0  # [..., d_sae]
            pre = _hooked(hooks, "hook_sae_acts_pre", x_in @ (p["W_enc"] * np.exp(p["r_mag"])) + p["b_mag"])
            acts = active * np.maximum(pre, 0)
        else:
            pre = _hooked(hooks, "hook_sae_acts_pre", x_in @ p["W_enc"] + p["b_enc"])  # [..., d_sae]
            if arch == "topk":
                if self.cfg.get("rescale_acts_by_decoder_norm"):
                    pre = pre * np.linalg.norm(p["W_dec"], axis=-1)
                acts = topk(pre, self.cfg["k"])
            else:
                acts = np.maximum(pre, 0)
                if "threshold" in p:
                    acts = acts * (pre > p["threshold"])
        return _hooked(hooks, "hook_sae_acts_post", acts), state

    def coefficients(self, f):
        """The numbers that multiply W_dec's rows: f, or f/‖W_dec[i]‖ with rescale_acts_by_decoder_norm."""
        if self.architecture == "topk" and self.cfg.get("rescale_acts_by_decoder_norm"):
            return f * (1 / np.linalg.norm(self.params["W_dec"], axis=-1))
        return f

    def decode(self, f, state=(1.0, 0.0), hooks=None, x=None):
        """x̂ [..., d_out] from features f [..., d_sae]; ``state`` from ``norm_in`` (the input's
        scale and mean, for normalize_activations); ``x`` the input, for a skip transcoder's W_skip."""
        p = self.params
        recons = _hooked(hooks, "hook_sae_recons", self.coefficients(f) @ p["W_dec"] + p["b_dec"])  # [..., d_out]
        if self.is_transcoder:
            if "W_skip" in p:
                recons = recons + self._reshaped(x) @ p["W_skip"].T
            return recons
        scale, mean = state
        return recons * scale + mean

    def forward(self, x, hooks=None):
        """SAELens's ``SAE.forward``: decode(encode(x)), shaped as x (hook_z: [..., head, d_head])."""
        f, state = self._encode(x, hooks)
        out = self.decode(f, state, hooks, x)
        return _hooked(hooks, "hook_sae_output", self.shaped_out(out, x))

    def shaped_out(self, out, x):
        """``out`` [..., d_out] in the shape of the hook it is written to (hook_z: [..., head, d_head])."""
        x = np.asarray(x)
        if self.cfg.get("reshape_activations") == "hook_z" and not self.is_transcoder:
            return out.reshape(x.shape)
        return out


def topk(pre, k):
    """ReLU of the k largest entries along the last axis, 0 elsewhere (SAELens's TopK; ties broken
    by index, lowest first)."""
    order = np.argsort(-pre, axis=-1, kind="stable")[..., :k]  # [..., k]
    out = np.zeros_like(pre)
    np.put_along_axis(out, order, np.maximum(np.take_along_axis(pre, order, -1), 0), -1)
    return out


def _hooked(hooks, name, activation):
    """Run the SAE's hooks on ``name`` (a dict name → list of fn(activation, name)), in order."""
    if not hooks:
        return activation
    for fn in hooks.get(name, ()):
        result = fn(activation, name)
        if result is not None:
            if not isinstance(result, np.ndarray) or result.shape != activation.shape:
                raise RefGPTError(f"hook at {name}: returned {getattr(result, 'shape', type(result).__name__)}, "
                                  f"expected an array of shape {list(activation.shape)}")
            activation = result.astype(activation.dtype, copy=False)
    return activation
