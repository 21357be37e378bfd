"""SAELens's folder: ``cfg.json`` + ``sae_weights.safetensors`` (+ ``sparsity.safetensors``), read and
written without torch.

Reading follows SAELens 6.x's ``SAE.load_from_disk``: a cfg.json without ``sae_lens_version`` ≥ 6
(at the top level or in ``metadata``) is a pre-6.0 config, renamed as SAELens's
``handle_pre_6_0_config`` does (``hook_point`` → ``hook_name``, ``hook_point_head_index`` →
``hook_head_index``, ``activation_fn_str`` → ``activation_fn``; ``activation_fn: "topk"`` with
``activation_fn_kwargs.k`` → architecture ``topk``; ``normalize_activations: false`` → ``"none"``;
the model's keys moved into ``metadata``). A ``scaling_factor`` of all ones is dropped, as SAELens
drops it.

Refused, each by name, in one line (never a silent number): an unknown architecture,
normalisation, activation function or reshape; what SAELens reads but refgpt does not compute
(``expected_average_only_in`` without its folded factor, ``covariance_whitening``, a fine-tuning
scaling factor); sizes that are not whole numbers ≥ 1; a weight missing, unexpected, of a shape
that disagrees with ``d_in``/``d_sae``/``d_out``, or not finite; ``k`` outside [1, d_sae]; a
sparsity file whose tensor is not [d_sae]. The safetensors files go through refgpt's own reader
(refgpt/files/safetensors_file.py: the reference package's rules).

Writing (``save_sae``) produces what SAELens 6.x's ``save_model`` writes: the 6.x cfg.json (with
``metadata.sae_lens_version`` "6.0.0", the format, and ``metadata.refgpt_version``) and the weights
in the SAE's dtype, the folder replaced as a whole (refgpt/files/atomic_write.py).
"""

from __future__ import annotations

import numpy as np

from .. import strict_json
from ..errors import RefGPTError, as_path
from ..files.atomic_write import write_directory_atomically
from ..files.safetensors_file import SafetensorsFile, SafetensorsWriter
from ..version import __version__
from .sae import ARCHITECTURES, EXTRA_WEIGHTS, NORMALIZATIONS, SAE

CFG, WEIGHTS, SPARSITY = "cfg.json", "sae_weights.safetensors", "sparsity.safetensors"
FORMAT_VERSION = "6.0.0"  # the SAELens cfg.json layout refgpt writes
PRE_6_RENAMES = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
                 "activation_fn_str": "activation_fn"}
#: SAELens's LLM_METADATA_KEYS: in a pre-6.0 cfg.json they sit at the top level.
METADATA_KEYS = ("model_name", "hook_name", "model_class_name", "hook_head_index", "model_from_pretrained_kwargs",
                 "prepend_bos", "exclude_special_tokens", "neuronpedia_id", "context_size", "seqpos_slice",
                 "dataset_path", "sae_lens_version", "sae_lens_training_version", "hook_name_out",
                 "hook_head_index_out", "hf_hook_name", "hf_hook_name_out")
#: 6.x top-level keys (SAEConfig's fields and the architectures' own).
TOP_LEVEL = ("d_in", "d_sae", "d_out", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
             "reshape_activations", "metadata", "architecture", "k", "rescale_acts_by_decoder_norm")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _version_6(cfg: dict) -> bool:
    version = cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")
    if not isinstance(version, str):
        return False
    head = version.split(".")[0]
    return head.isdigit() and int(head) >= 6


def normalised_cfg(raw, where: str) -> dict:
    """SAELens 6.x's cfg dict from a cfg.json's contents (pre-6.0 renamed), checked."""
    if not isinstance(raw, dict):
        raise RefGPTError(f"{where}: expected a JSON object, found {type(raw).__name__}")
    if _version_6(raw):
        unknown = sorted(set(raw) - set(TOP_LEVEL))
        if unknown:
            raise RefGPTError(f"{where}: unknown key {unknown[0]!r} (refgpt reads SAELens 6.x's keys: {', '.join(TOP_LEVEL)})")
        cfg = dict(raw)
        cfg.setdefault("architecture", "standard")
        if not isinstance(cfg.get("metadata", {}), dict):
            raise RefGPTError(f"{where}: 'metadata' must be an object, found {cfg['metadata']!r}")
        cfg["metadata"] = dict(cfg.get("metadata", {}))
    else:
        cfg = _pre_6(raw, where)
    return _checked(cfg, where)


def _pre_6(raw: dict, where: str) -> dict:
    old = {PRE_6_RENAMES.get(k, k): v for k, v in raw.items()}
    activation = old.get("activation_fn", "relu")
    kwargs = old.get("activation_fn_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RefGPTError(f"{where}: 'activation_fn_kwargs' must be an object, found {kwargs!r}")
    architecture = old.get("architecture", "standard")
    if activation == "topk":
        if "k" not in kwargs:
            raise RefGPTError(f"{where}: activation_fn 'topk' needs activation_fn_kwargs.k")
        architecture = "topk"
    elif activation != "relu":
        raise RefGPTError(f"{where}: activation_fn {activation!r} is not one refgpt computes (relu, topk)")
    if old.get("finetuning_scaling_factor"):
        raise RefGPTError(f"{where}: finetuning_scaling_factor is true: refgpt does not apply a fine-tuning scaling factor")
    normalize = old.get("normalize_activations")
    if normalize is None or normalize is False:
        normalize = "none"
    elif normalize is True:
        normalize = "expected_average_only_in"
    cfg = {key: old[key] for key in ("d_in", "d_sae", "d_out", "dtype", "apply_b_dec_to_input",
                                     "rescale_acts_by_decoder_norm") if key in old}
    cfg.setdefault("apply_b_dec_to_input", True)
    cfg["normalize_activations"] = normalize
    hook = old.get("hook_name")
    cfg["reshape_activations"] = old.get("reshape_activations", "hook_z" if isinstance(hook, str) and "hook_z" in hook else "none")
    cfg["architecture"] = architecture
    if architecture == "topk":
        cfg["k"] = kwargs.get("k", old.get("k"))
    metadata = {key: old[key] for key in METADATA_KEYS if key in old}
    metadata.setdefault("prepend_bos", True)
    cfg["metadata"] = metadata
    return cfg


def _whole(cfg, key, where, least=1):
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value < 2**31:
        raise RefGPTError(f"{where}: {key} must be a whole number in [{least}, 2³¹), found {value!r}")
    return value


def _checked(cfg: dict, where: str) -> dict:
    architecture = cfg.get("architecture")
    if architecture not in ARCHITECTURES:
        raise RefGPTError(f"{where}: architecture {architecture!r} is not one refgpt reads ({', '.join(ARCHITECTURES)})")
    _whole(cfg, "d_in", where)
    d_sae = _whole(cfg, "d_sae", where)
    if "transcoder" in architecture:
        _whole(cfg, "d_out", where)
        if cfg.get("apply_b_dec_to_input"):
            raise RefGPTError(f"{where}: apply_b_dec_to_input is true, which a transcoder cannot do (b_dec is d_out wide)")
    elif "d_out" in cfg and cfg["d_out"] != cfg["d_in"]:
        raise RefGPTError(f"{where}: d_out {cfg['d_out']!r} differs from d_in {cfg['d_in']!r} in a {architecture} SAE")
    for key in ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm"):
        if key in cfg and not isinstance(cfg[key], bool):
            raise RefGPTError(f"{where}: {key} must be true or false, found {cfg[key]!r}")
    if cfg.get("rescale_acts_by_decoder_norm") and architecture != "topk":
        raise RefGPTError(f"{where}: rescale_acts_by_decoder_norm is a topk setting, found in a {architecture} SAE")
    if architecture == "topk":
        cfg["k"] = _whole(cfg, "k", where)
        if cfg["k"] > d_sae:
            raise RefGPTError(f"{where}: k = {cfg['k']} is more than d_sae = {d_sae}")
    elif "k" in cfg:
        raise RefGPTError(f"{where}: k is a topk setting, found in a {architecture} SAE")
    normalize = cfg.get("normalize_activations", "none")
    if normalize == "expected_average_only_in":
        raise RefGPTError(f"{where}: normalize_activations 'expected_average_only_in' needs the release's norm scaling "
                          "factor, which the folder does not hold (SAELens folds it in from_pretrained); fold it into "
                          "the weights first")
    if normalize not in NORMALIZATIONS:
        raise RefGPTError(f"{where}: normalize_activations {normalize!r} is not one refgpt computes ({', '.join(NORMALIZATIONS)})")
    if cfg.get("reshape_activations", "none") not in ("none", "hook_z"):
        raise RefGPTError(f"{where}: reshape_activations {cfg['reshape_activations']!r} is not 'none' or 'hook_z'")
    if normalize == "layer_norm" and cfg["d_in"] < 2:
        raise RefGPTError(f"{where}: normalize_activations 'layer_norm' with d_in = 1: the unbiased standard deviation "
                          "of one number is undefined")
    if "transcoder" in architecture and normalize != "none":
        raise RefGPTError(f"{where}: normalize_activations {normalize!r} in a transcoder (SAELens applies it only one way)")
    dtype = cfg.get("dtype", "float32")
    if dtype not in FLOAT_DTYPES and dtype not in ("torch." + d for d in FLOAT_DTYPES):
        raise RefGPTError(f"{where}: dtype {dtype!r} is not a float dtype SAELens names")
    metadata = cfg["metadata"]
    for key in ("hook_name", "hook_name_out", "model_name"):
        if metadata.get(key) is not None and not isinstance(metadata[key], str):
            raise RefGPTError(f"{where}: metadata.{key} must be a string, found {metadata[key]!r}")
    if not isinstance(metadata.get("prepend_bos", True), bool):
        raise RefGPTError(f"{where}: prepend_bos must be true or false, found {metadata['prepend_bos']!r}")
    kwargs = metadata.get("model_from_pretrained_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RefGPTError(f"{where}: model_from_pretrained_kwargs must be an object, found {kwargs!r}")
    return cfg


def weight_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every weight's shape, as the cfg says."""
    d_in, d_sae = cfg["d_in"], cfg["d_sae"]
    d_out = cfg.get("d_out", d_in) if "transcoder" in cfg["architecture"] else d_in
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    for name in EXTRA_WEIGHTS[cfg["architecture"]]:
        shapes[name] = (d_out, d_in) if name == "W_skip" else (d_sae,)
    return shapes


def load_sae(directory, dtype="float64") -> SAE:
    """The SAE in an SAELens folder (cfg.json + sae_weights.safetensors [+ sparsity.safetensors]),
    its weights in ``dtype`` (float64 by default; float32 on request)."""
    directory = as_path(directory, "SAE folder")
    if not directory.is_dir():
        raise RefGPTError(f"{directory}: not a directory (an SAE is a folder holding {CFG} and {WEIGHTS})")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise RefGPTError(f"load_sae: dtype must be float32 or float64, found {dtype}")
    cfg_path = directory / CFG
    if not cfg_path.is_file():
        raise RefGPTError(f"{cfg_path}: not found")
    try:
        text = cfg_path.read_bytes()
    except OSError as error:
        raise RefGPTError(f"{cfg_path}: cannot read it ({error.strerror or error})") from None
    cfg = normalised_cfg(strict_json.loads(text, str(cfg_path)), str(cfg_path))
    weights = SafetensorsFile(directory / WEIGHTS)
    names = set(weights.names)
    if "scaling_factor" in names:
        factor = weights.float_tensor("scaling_factor", dtype)
        if not np.all(factor == 1):
            raise RefGPTError(f"{weights.path}: scaling_factor is not all ones: a fine-tuning scaling factor, "
                              "which refgpt does not apply")
        names.discard("scaling_factor")
    if "log_threshold" in names:
        raise RefGPTError(f"{weights.path}: tensor 'log_threshold' is a JumpReLU training checkpoint's; SAELens's "
                          "inference SAE reads 'threshold'")
    shapes = weight_shapes(cfg)
    for name in sorted(names - set(shapes)):
        raise RefGPTError(f"{weights.path}: unexpected tensor {name!r} for a {cfg['architecture']} SAE "
                          f"(expected {', '.join(shapes)})")
    params = {}
    for name, shape in shapes.items():
        if name not in names:
            raise RefGPTError(f"{weights.path}: tensor {name!r} is missing (a {cfg['architecture']} SAE has {', '.join(shapes)})")
        if tuple(weights.shape(name)) != shape:
            raise RefGPTError(f"{weights.path}: tensor {name!r} has shape {list(weights.shape(name))}, but cfg.json's "
                              f"d_in/d_sae{'/d_out' if 'transcoder' in cfg['architecture'] else ''} say {list(shape)}")
        params[name] = np.array(weights.float_tensor(name, dtype))
    sparsity = None
    if (directory / SPARSITY).exists():
        file = SafetensorsFile(directory / SPARSITY)
        if file.names != ["sparsity"] or tuple(file.shape("sparsity")) != (cfg["d_sae"],):
            raise RefGPTError(f"{file.path}: expected one tensor 'sparsity' of shape [{cfg['d_sae']}], found "
                              + ", ".join(f"{n!r} {list(file.shape(n))}" for n in file.names))
        sparsity = np.array(file.float_tensor("sparsity", np.dtype(np.float64)))
    return SAE(cfg, params, dtype, sparsity=sparsity, source=directory)


def saved_cfg(sae: SAE) -> dict:
    """SAELens 6.x's cfg.json for ``sae``."""
    cfg = {key: value for key, value in sae.cfg.items() if key != "metadata"}
    cfg["dtype"] = str(sae.dtype)
    cfg.setdefault("device", "cpu")
    cfg["metadata"] = {**sae.metadata, "sae_lens_version": FORMAT_VERSION, "refgpt_version": __version__}
    return cfg


def save_sae(sae: SAE, directory) -> "Path":  # noqa: F821
    """Write ``sae`` as an SAELens folder (cfg.json, sae_weights.safetensors, and sparsity.safetensors
    when the SAE has one), replacing the folder as a whole."""
    text = strict_json.dumps(saved_cfg(sae), indent=1)
    shapes = weight_shapes(sae.cfg)

    def fill(staging):
        layout = {name: (sae.dtype, shape) for name, shape in shapes.items()}
        with SafetensorsWriter(staging / WEIGHTS, layout, {"format": "pt"}) as out:
            for name in shapes:
                out.write(name, np.ascontiguousarray(sae.params[name], sae.dtype))
        if sae.sparsity is not None:
            with SafetensorsWriter(staging / SPARSITY, {"sparsity": (sae.dtype, (sae.d_sae,))}, {"format": "pt"}) as out:
                out.write("sparsity", np.ascontiguousarray(sae.sparsity, sae.dtype))
        (staging / CFG).write_text(text, encoding="utf-8")

    return write_directory_atomically(directory, fill, owned=lambda name: name in (CFG, WEIGHTS, SPARSITY),
                                      what="save_sae")
