"""The model's shape and knobs, under TransformerLens's names.

An HF ``config.json`` says ``n_embd``, ``n_layer``, ``n_head``…; TransformerLens and refgpt say
``d_model``, ``n_layers``, ``n_heads``…. ``Config.from_hf`` translates, fills in HF's defaults
for every field that changes the forward pass, and refuses anything that is not a decoder-only
GPT-2 it can compute exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from .activations import ACTIVATIONS
from .. import strict_json
from ..errors import RefGPTError, as_path, size_shown
from ..reference.gpt2 import score_scale as reference_score_scale

MAX_SIZE = 2**31 - 1  # no dimension of a GPT-2 refgpt computes may exceed a 32-bit index

# GPT2Config's defaults (transformers' configuration_gpt2.py) for the fields that matter here.
HF_DEFAULTS = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
}


#: TransformerLens's switches: settable on a model's cfg (``model.cfg.default_prepend_bos = False``),
#: they change what is tokenized or hooked, never a number of the forward pass.
TL_SWITCHES = {
    "default_prepend_bos": "to_tokens and text input put <|endoftext|> first (TL's default for GPT-2)",
    "tokenizer_prepends_bos": "does the tokenizer add BOS by itself? (GPT-2's: no)",
    "use_attn_result": "hook attn.hook_result [batch, pos, head, d_model], each head's z·W_O",
    "use_split_qkv_input": "hook hook_q_input/hook_k_input/hook_v_input [batch, pos, head, d_model]",
    "use_attn_in": "hook hook_attn_in [batch, pos, head, d_model], the stream each head reads",
    "use_hook_mlp_in": "hook hook_mlp_in [batch, pos, d_model], the stream the MLP reads",
    "use_hook_tokens": "hook hook_tokens [batch, pos], the token ids",
}

@dataclasses.dataclass(eq=True)
class Config:
    """Everything about a GPT-2 that changes its forward pass.

    d_model    width of the residual stream            (HF n_embd)
    n_layers   number of blocks                         (HF n_layer)
    n_heads    attention heads per block                (HF n_head)
    d_head     width of one head = d_model // n_heads
    d_mlp      hidden width of the MLP                  (HF n_inner, default 4·d_model)
    d_vocab    vocabulary size                          (HF vocab_size)
    n_ctx      most positions the model has embeddings for (HF n_positions)
    eps        LayerNorm's epsilon                      (HF layer_norm_epsilon)
    act_fn     the MLP's nonlinearity                   (HF activation_function)
    use_attn_scale                   divide scores by √d_head   (HF scale_attn_weights)
    scale_attn_by_inverse_layer_idx  also divide by layer + 1
    reorder_and_upcast_attn          HF computes QKᵀ in float32 with the scale folded in; in
                                     float32 and float64 that is the same function, so refgpt
                                     records the flag and computes the scores one way.
    tie_word_embeddings              W_U is W_Eᵀ unless a separate lm_head is stored.
    """

    d_model: int
    n_layers: int
    n_heads: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    eps: float = 1e-5
    act_fn: str = "gelu_new"
    use_attn_scale: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    tie_word_embeddings: bool = True
    default_prepend_bos: bool = dataclasses.field(default=True, compare=False)
    tokenizer_prepends_bos: bool = dataclasses.field(default=False, compare=False)
    use_attn_result: bool = dataclasses.field(default=False, compare=False)
    use_split_qkv_input: bool = dataclasses.field(default=False, compare=False)
    use_attn_in: bool = dataclasses.field(default=False, compare=False)
    use_hook_mlp_in: bool = dataclasses.field(default=False, compare=False)
    use_hook_tokens: bool = dataclasses.field(default=False, compare=False)

    # TransformerLens's descriptive fields for a GPT-2, fixed.
    normalization_type = "LN"
    positional_embedding_type = "standard"
    original_architecture = "GPT2LMHeadModel"
    attention_dir = "causal"
    device = "cpu"
    n_key_value_heads = None

    def __setattr__(self, name, value):
        """The architecture is fixed once made (a new Config for a new model); TL_SWITCHES may change."""
        if name in TL_SWITCHES:
            if not isinstance(value, (bool,)):
                raise RefGPTError(f"config: {name} must be True or False, found {value!r}")
        elif name in self.__dict__:
            raise RefGPTError(f"config: {name} is fixed once the Config is made (only {sorted(TL_SWITCHES)} may change)")
        object.__setattr__(self, name, value)

    __hash__ = None  # mutable switches: not a dict key

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RefGPTError(f"config: {name} must be a positive integer, found {_shown(value)}")
            if value > MAX_SIZE:
                raise RefGPTError(f"config: {name}={_shown(value)} is larger than any GPT-2 refgpt "
                                  f"can hold (at most {MAX_SIZE})")
        if self.d_model % self.n_heads:
            raise RefGPTError(
                f"config: n_head={self.n_heads} does not divide n_embd={self.d_model}"
            )
        if not isinstance(self.act_fn, str) or self.act_fn not in ACTIVATIONS:
            raise RefGPTError(
                f"config: unknown activation_function {_shown(self.act_fn)}; "
                f"refgpt knows {sorted(ACTIVATIONS)}"
            )
        if (not isinstance(self.eps, (int, float)) or isinstance(self.eps, bool)
                or not 0 < self.eps < math.inf):
            raise RefGPTError(f"config: layer_norm_epsilon must be a finite number > 0, found {_shown(self.eps)}")
        for name in ("use_attn_scale", "scale_attn_by_inverse_layer_idx",
                     "reorder_and_upcast_attn", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise RefGPTError(f"config: {name} must be true or false, found {_shown(getattr(self, name))}")

    def n_params(self) -> int:
        """How many numbers the weights hold: a tied W_U is W_Eᵀ (a view), counted once, as HF's num_parameters()."""
        d, m, v = self.d_model, self.d_mlp, self.d_vocab
        block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d)
        return v * d + self.n_ctx * d + self.n_layers * block + 2 * d + (0 if self.tie_word_embeddings else d * v)

    def bytes_needed(self, itemsize: int, batch: int = 1, pos: int | None = None) -> int:
        """A lower bound on the memory a forward pass needs, in bytes: the weights, and the largest
        activations alive at once for ``batch`` × ``pos`` tokens (default: one sequence of n_ctx) —
        the residual stream, one block's q/k/v, attention scores and MLP hidden layer, the logits."""
        pos = self.n_ctx if pos is None else pos
        activations = batch * pos * (4 * self.d_model + self.n_heads * pos + self.d_mlp + self.d_vocab)
        return (self.n_params() + activations) * itemsize

    def check_fits_in_memory(self, itemsize: int, source: str = "config", held: int = 0) -> None:
        """Refuse, before allocating anything, a model that cannot fit in this machine's memory.
        ``held``: bytes of weights this process already holds in the compute dtype (a Model built
        from arrays): memory already taken, which MemAvailable no longer counts."""
        needed, available = self.bytes_needed(itemsize) - held, available_memory()
        where = f"the machine has {size_shown(available)} available" if available is not None else None
        headroom = address_space_left()
        if headroom is not None and (available is None or headroom < available):
            available = headroom
            where = (f"this process may map only {size_shown(headroom)} more (its address-space limit, RLIMIT_AS: "
                     f"ulimit -v)")
        if available is not None and needed > available:
            more = f" more (besides {size_shown(held)} of weights already in memory)" if held else ""
            raise RefGPTError(
                f"{source}: this model needs at least {size_shown(needed)}{more} for its weights and one forward "
                f"pass in {8 * itemsize}-bit floats ({self.n_params():,} parameters), but {where}"
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attn_scale(self) -> float:
        """TransformerLens's ``cfg.attn_scale``: what the scores QKᵀ are *divided* by, √d_head (1
        without ``use_attn_scale``), before any per-layer factor. The forward uses ``score_scale``."""
        return self.d_head ** 0.5 if self.use_attn_scale else 1.0

    def score_scale(self, layer: int) -> float:
        """The factor the attention scores QKᵀ of block ``layer`` are multiplied by (its definition:
        refgpt/reference/gpt2.py, ``score_scale``)."""
        return reference_score_scale(self.d_head, layer, self.use_attn_scale, self.scale_attn_by_inverse_layer_idx)

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config") -> "Config":
        """Build a Config from an HF GPT2Config dict (what ``config.json`` holds)."""
        if not isinstance(hf, dict):
            raise RefGPTError(f"{source}: expected a JSON object, found {type(hf).__name__}")
        model_type = hf.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise RefGPTError(f"{source}: model_type is {_shown(model_type)}, refgpt reads only 'gpt2'")
        get = {key: hf.get(key, default) for key, default in HF_DEFAULTS.items()}
        if not isinstance(get["add_cross_attention"], bool):
            raise RefGPTError(f"{source}: add_cross_attention must be true or false, "
                              f"found {_shown(get['add_cross_attention'])}")
        if get["add_cross_attention"]:
            raise RefGPTError(
                f"{source}: add_cross_attention=true is an encoder-decoder model, "
                "not a decoder-only GPT-2"
            )
        n_embd = get["n_embd"]
        d_mlp = get["n_inner"]
        if d_mlp is None:  # HF: n_inner=None means 4·n_embd
            d_mlp = 4 * n_embd if isinstance(n_embd, int) else n_embd
        try:
            return cls(
                d_model=n_embd,
                n_layers=get["n_layer"],
                n_heads=get["n_head"],
                d_mlp=d_mlp,
                d_vocab=get["vocab_size"],
                n_ctx=get["n_positions"],
                eps=get["layer_norm_epsilon"],
                act_fn=get["activation_function"],
                use_attn_scale=get["scale_attn_weights"],
                scale_attn_by_inverse_layer_idx=get["scale_attn_by_inverse_layer_idx"],
                reorder_and_upcast_attn=get["reorder_and_upcast_attn"],
                tie_word_embeddings=get["tie_word_embeddings"],
            )
        except RefGPTError as error:
            raise RefGPTError(str(error).replace("config:", f"{source}:", 1)) from None

    @classmethod
    def from_json(cls, path: str | Path) -> "Config":
        """Read an HF ``config.json``."""
        path = as_path(path, "config path")
        if not path.is_file():
            raise RefGPTError(f"{path}: not found (an HF GPT-2 model directory holds config.json)")
        hf = strict_json.loads(path.read_bytes(), str(path))
        return cls.from_hf(hf, source=str(path))

    def to_hf(self) -> dict:
        """The HF config dict that describes this model (inverse of ``from_hf``)."""
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_embd": self.d_model,
            "n_layer": self.n_layers,
            "n_head": self.n_heads,
            "n_inner": self.d_mlp,
            "vocab_size": self.d_vocab,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,  # GPT-2's own config.json has both; TransformerLens reads n_ctx, HF n_positions
            "layer_norm_epsilon": self.eps,
            "activation_function": self.act_fn,
            "scale_attn_weights": self.use_attn_scale,
            "scale_attn_by_inverse_layer_idx": self.scale_attn_by_inverse_layer_idx,
            "reorder_and_upcast_attn": self.reorder_and_upcast_attn,
            "tie_word_embeddings": self.tie_word_embeddings,
        }


def available_memory() -> int | None:
    """Bytes this machine can still give a process: MemAvailable from /proc/meminfo, else the free
    physical pages (os.sysconf); None where neither exists (then nothing is refused)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (RLIMIT_AS, ``ulimit -v``):
    the soft limit less the address space already mapped (VmSize). None without a limit. Past it,
    every allocation fails — and OpenBLAS ends the process with a message of its own — however
    much memory the machine has free: so the memory check counts it too."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    mapped = 0
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1
    try:
        threads = max(1, int(threads))
    except ValueError:
        threads = os.cpu_count() or 1
    return max(0, limit - mapped - _BLAS_BUFFER * (threads + 1))


#: OpenBLAS maps a work buffer of 32 MiB per thread at its first use (BUFFER_SIZE, measured here as
#: the jump in VmSize at the first matrix product), and gives up with its own message if it cannot.
_BLAS_BUFFER = 32 * 2**20


def _shown(value) -> str:
    """``repr(value)``, cut to 60 characters (a 5,000-digit integer must not fill the screen)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
