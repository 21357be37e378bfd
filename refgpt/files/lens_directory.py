"""The tuned-lens package's lens files, read and written without torch.

A tuned lens (Belrose et al. 2023) is one affine *translator* per block, (W [d, d], b [d]), mapping
the stream h entering that block to h + h·Wᵀ + b before the model's own ln_final and unembedding.
The ``tuned-lens`` package (0.2.0) stores a lens as a **directory** (``TunedLens.save``; the hub's
``lens/gpt2/`` is one):

    config.json    {"base_model_name_or_path": str, "d_model": int, "num_hidden_layers": int,
                    "bias": bool, "base_model_revision": str | null, "unembed_hash": str | null,
                    "lens_type": "linear_tuned_lens"}
    params.pt      torch.save of {"{i}.weight": [d, d], "{i}.bias": [d]}, i = 0 … L−1, no prefix
                   (refgpt/files/torch_zip.py reads and writes it without torch)

``read_lens`` also takes ``params.safetensors`` in that directory, or a bare ``.safetensors`` /
``.pt`` file, and both key spellings: the package's ``{i}.weight`` and ``layer_translators.{i}.weight``
(what ``TunedLens.state_dict()`` and refgpt 0.x's translator files use). A file holding both
spellings, a key that is neither (other than an ``unembed.*`` copy of the unembedding, which is
noted and ignored), a missing or misshaped translator, or a non-finite value is refused by name.

**unembed_hash** is the package's fingerprint of the unembedding the lens was trained against:
``sha256(np.array_str(W, precision=1))`` of ``lm_head.weight`` = W_Uᵀ [d_vocab, d_model] in
float32 (``tuned_lens.utils.tensor_hash``). NumPy summarises an array that large to its corners,
so the hash sees the first and last three rows and columns to one decimal: it tells GPT-2 from
another model, not a fine-tuned copy from its original. refgpt computes it with NumPy's default
print options whatever the caller has set. The hosted lenses' config.json spell the key
``unemebd_hash``; the package drops a key it does not know, so it never checks them. refgpt reads
the misspelling as the hash (and says so in ``notes``).

**refgpt's one addition**: ``"stream": "resid_mid"`` marks a lens whose translator i reads
``blocks.i.hook_resid_mid`` (between attention and MLP, tuned-lens issue #104) instead of
``hook_resid_pre`` = HF ``hidden_states[i]``. The package ignores the key (with a warning) and
would apply such a lens to the wrong stream; refgpt writes it only for resid_mid lenses, so a
resid_pre lens's config.json holds exactly the package's seven fields.

Writing (``write_lens``) puts params.pt first and config.json second, each atomically, so a
killed writer leaves the old pair or an old config.json beside new translators of the same shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import strict_json
from ..errors import RefGPTError, as_path
from .atomic_write import refuse_temporary, write_directory_atomically
from .torch_zip import read_state_dict, state_dict_bytes
from .whole_file import read_bytes

#: config.json's fields, in the order TunedLensConfig declares them (and the package writes them).
CONFIG_FIELDS = ("base_model_name_or_path", "d_model", "num_hidden_layers", "bias", "base_model_revision",
                 "unembed_hash", "lens_type")
MISSPELLED_HASH = "unemebd_hash"
LENS_TYPE = "linear_tuned_lens"
STREAMS = ("resid_pre", "resid_mid")
PARAMS_FILES = ("params.pt", "params.safetensors")


@dataclass
class LensFiles:
    """What a lens directory or file holds: ``translators`` {i: (W [d, d], b [d])} as stored
    (h ↦ h + h·Wᵀ + b), the ``stream`` they read, ``config`` (config.json's fields, or {} for a
    bare file), where they came from, and ``notes`` (what refgpt noticed and accepted)."""

    translators: dict
    stream: str = "resid_pre"
    config: dict = field(default_factory=dict)
    source: Path | None = None
    notes: list = field(default_factory=list)

    @property
    def unembed_hash(self):
        """The hash config.json records (under either spelling), or None."""
        return self.config.get("unembed_hash")


def unembed_hash(W_U) -> str:
    """The tuned-lens package's ``unembed_hash`` of an unembedding W_U [d_model, d_vocab]."""
    weight = np.asarray(W_U).T.astype(np.float32)  # [d_vocab, d_model]: HF's lm_head.weight, .float()
    with np.printoptions(edgeitems=3, threshold=1000, linewidth=75, suppress=False, nanstr="nan", infstr="inf",
                         sign="-", floatmode="maxprec", legacy=False):
        text = np.array_str(weight, precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- reading ------------------------------------------------------------------------------------


def read_lens(path) -> LensFiles:
    """A lens directory (config.json + params.pt or params.safetensors) or a bare translator file."""
    path = as_path(path, "lens")
    refuse_temporary(path)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise RefGPTError(f"{path}: not a lens directory: it has no config.json (the tuned-lens package "
                              "writes config.json and params.pt)")
        params = [path / name for name in PARAMS_FILES if (path / name).is_file()]
        if not params:
            raise RefGPTError(f"{path}: not a lens directory: it has no params.pt (or params.safetensors)")
        if len(params) > 1:
            raise RefGPTError(f"{path}: holds both params.pt and params.safetensors; which one is meant is a guess")
        config, stream, notes = read_config(config_path)
        lens = read_translator_file(params[0])
        lens.config, lens.stream, lens.source, lens.notes = config, stream, path, notes + lens.notes
        _check_against_config(lens, params[0])
        return lens
    if not path.exists():
        raise RefGPTError(f"{path}: lens not found")
    return read_translator_file(path)


def read_config(path: Path) -> tuple[dict, str, list]:
    """config.json → (its fields, with the misspelled hash read as unembed_hash; the stream; notes)."""
    raw = strict_json.loads(read_bytes(path, "lens config"), str(path))
    if not isinstance(raw, dict):
        raise RefGPTError(f"{path}: must hold a JSON object, found {type(raw).__name__}")
    notes, config = [], {}
    for name, kinds in (("base_model_name_or_path", str), ("d_model", int), ("num_hidden_layers", int)):
        if name not in raw:
            raise RefGPTError(f"{path}: {name!r} is missing (the tuned-lens package requires it)")
    expected = {"base_model_name_or_path": (str,), "d_model": (int,), "num_hidden_layers": (int,), "bias": (bool,),
                "base_model_revision": (str, type(None)), "unembed_hash": (str, type(None)), "lens_type": (str,),
                MISSPELLED_HASH: (str, type(None)), "stream": (str,)}
    for name, value in raw.items():
        if name not in expected:
            notes.append(f"config.json key {name!r} is not the package's; ignored (the package ignores it too)")
            continue
        if not isinstance(value, expected[name]) or (isinstance(value, bool) and bool not in expected[name]):
            raise RefGPTError(f"{path}: {name!r} is {value!r:.60}, expected "
                              f"{' or '.join('null' if k is type(None) else k.__name__ for k in expected[name])}")
        config[name] = value
    for name in ("d_model", "num_hidden_layers"):
        if config[name] < 1:
            raise RefGPTError(f"{path}: {name!r} is {config[name]}, expected a whole number ≥ 1")
    if config.get("lens_type", LENS_TYPE) != LENS_TYPE:
        raise RefGPTError(f"{path}: lens_type is {config['lens_type']!r}; refgpt reads {LENS_TYPE!r} lenses only")
    if MISSPELLED_HASH in config:
        misspelled = config.pop(MISSPELLED_HASH)
        if config.get("unembed_hash") is None:
            config["unembed_hash"] = misspelled
            notes.append(f"config.json spells the unembedding hash {MISSPELLED_HASH!r} (as the hosted lenses do): "
                         "the tuned-lens package drops that key and never checks it; refgpt reads it as unembed_hash")
        elif config["unembed_hash"] != misspelled:
            notes.append(f"config.json has both unembed_hash and {MISSPELLED_HASH!r}, and they differ: "
                         "refgpt checks unembed_hash")
    stream = config.pop("stream", "resid_pre")
    if stream not in STREAMS:
        raise RefGPTError(f"{path}: 'stream' is {stream!r}; a lens reads one of {', '.join(STREAMS)}")
    return config, stream, notes


def read_translator_file(path: Path) -> LensFiles:
    """Translators from a params.pt (torch zip) or safetensors file, in either key spelling."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except IsADirectoryError:
        raise RefGPTError(f"{path}: is a directory without config.json, not a lens") from None
    except OSError as error:
        raise RefGPTError(f"{path}: cannot read ({error.strerror or error})") from None
    if magic == b"PK\x03\x04":
        tensors = read_state_dict(path)
    else:
        tensors = _read_safetensors(path)
    return _translators(tensors, path)


def _read_safetensors(path: Path) -> dict:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as error:  # safetensors raises its own types for a malformed file
        raise RefGPTError(f"{path}: neither a torch zip file nor a readable safetensors file ({error})") from None


def _translators(tensors: dict, path: Path) -> LensFiles:
    """{i: (W, b)} from tensors keyed ``{i}.weight`` or ``layer_translators.{i}.weight`` (one spelling)."""
    import re

    notes, found, spellings = [], {}, set()
    for key, array in tensors.items():
        match = re.fullmatch(r"(layer_translators\.)?(0|[1-9][0-9]{0,5})\.(weight|bias)", key)
        if match is None:
            if key.startswith("unembed."):
                notes.append(f"{path.name}: {key!r} (a copy of the unembedding) is ignored: refgpt uses the model's")
                continue
            raise RefGPTError(f"{path}: key {key!r} is not a translator's ('{{i}}.weight', '{{i}}.bias', or "
                              "'layer_translators.{i}.weight', …)")
        spellings.add(match.group(1) or "")
        found.setdefault(int(match.group(2)), {})[match.group(3)] = array
    if len(spellings) > 1:
        raise RefGPTError(f"{path}: mixes the keys '{{i}}.weight' and 'layer_translators.{{i}}.weight'; "
                          "one file holds one spelling")
    if not found:
        raise RefGPTError(f"{path}: holds no translators")
    prefix = spellings.pop()
    n = max(found) + 1
    translators = {}
    for i in range(n):
        parts = found.get(i, {})
        if "weight" not in parts:
            raise RefGPTError(f"{path}: {prefix}{i}.weight is missing (translators 0 … {n - 1} are numbered without gaps)")
        W = np.asarray(parts["weight"])
        d = W.shape[0] if W.ndim == 2 else None
        b = parts.get("bias")
        for name, array, ndim in (("weight", W, 2), ("bias", b, 1)):
            if array is None:
                continue
            array = np.asarray(array)
            if array.dtype.kind != "f" or array.ndim != ndim or any(s != d for s in array.shape):
                raise RefGPTError(f"{path}: {prefix}{i}.{name} is {array.dtype} {list(array.shape)}, expected a float "
                                  f"array {[d] * ndim if d else '[d_model, d_model]'}")
            if not np.all(np.isfinite(array)):
                raise RefGPTError(f"{path}: {prefix}{i}.{name} has non-finite values")
        translators[i] = (W, None if b is None else np.asarray(b))
    widths = {W.shape[0] for W, _ in translators.values()}
    if len(widths) > 1:
        raise RefGPTError(f"{path}: the translators have different widths {sorted(widths)}")
    with_bias = {b is not None for _, b in translators.values()}
    if len(with_bias) > 1:
        missing = min(i for i, (_, b) in translators.items() if b is None)
        raise RefGPTError(f"{path}: {prefix}{missing}.bias is missing (the others have one)")
    if with_bias == {False}:
        d = widths.pop()
        translators = {i: (W, np.zeros(d, W.dtype)) for i, (W, _) in translators.items()}
        notes.append(f"{path.name}: no biases (a lens with bias=false): b = 0")
    return LensFiles(translators=translators, source=path, notes=notes)


def _check_against_config(lens: LensFiles, params: Path):
    config, n = lens.config, len(lens.translators)
    d = next(iter(lens.translators.values()))[0].shape[0]
    if config["num_hidden_layers"] != n:
        raise RefGPTError(f"{params}: holds {n} translators, but config.json says num_hidden_layers = "
                          f"{config['num_hidden_layers']}")
    if config["d_model"] != d:
        raise RefGPTError(f"{params}: translators are {d} wide, but config.json says d_model = {config['d_model']}")
    if config.get("bias", True) is False and any(np.any(b) for _, b in lens.translators.values()):
        raise RefGPTError(f"{params}: has biases, but config.json says bias = false")


# ---- writing ------------------------------------------------------------------------------------


def lens_config(d_model: int, num_hidden_layers: int, base_model: str, unembed: str | None,
                revision: str | None = None, stream: str = "resid_pre") -> dict:
    """config.json's fields for a lens refgpt writes (the package's seven; ``stream`` if resid_mid)."""
    if stream not in STREAMS:
        raise RefGPTError(f"lens stream must be one of {', '.join(STREAMS)}, found {stream!r}")
    config = {"base_model_name_or_path": str(base_model), "d_model": int(d_model),
              "num_hidden_layers": int(num_hidden_layers), "bias": True, "base_model_revision": revision,
              "unembed_hash": unembed, "lens_type": LENS_TYPE}
    if stream != "resid_pre":
        config["stream"] = stream
    return config


def write_lens(directory, translators: dict, config: dict, safetensors: bool = False,
               training_log: str | None = None) -> Path:
    """Write a lens directory the tuned-lens package loads: params.pt (``{i}.weight``, ``{i}.bias``,
    in the arrays' dtype) and config.json. ``safetensors=True`` writes params.safetensors instead
    (which refgpt reads and the package does not); ``training_log`` (text) is training_log.json.

    The directory is written as one unit (refgpt.files.atomic_write.write_directory_atomically):
    a kill, a full disk or a second writer leaves the old lens or the new one, never a new
    params.pt beside an old config.json. Other files already in the directory are kept, except an
    old training_log.json, which would describe another lens."""
    directory = as_path(directory, "lens directory")
    if directory.exists() and not directory.is_dir():
        raise RefGPTError(f"{directory}: exists and is not a directory")
    n = len(translators)
    if sorted(translators) != list(range(n)) or n != config["num_hidden_layers"]:
        raise RefGPTError(f"write_lens: translators {sorted(translators)[:6]} must be 0 … "
                          f"{config['num_hidden_layers'] - 1}, one per block")
    tensors = {}
    for i in range(n):
        W, b = (np.asarray(a) for a in translators[i])
        tensors[f"{i}.weight"], tensors[f"{i}.bias"] = W, b
    other = directory / PARAMS_FILES[0 if safetensors else 1]
    if other.exists():
        raise RefGPTError(f"{other}: already there; a lens directory holds one params file (remove it first)")
    text = strict_json.dumps(config)
    blob = None if safetensors else state_dict_bytes(tensors, archive="params")  # refusals before any write

    def fill(staging: Path):
        if safetensors:
            from safetensors.numpy import save_file

            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(staging / "params.safetensors"))
        else:
            (staging / "params.pt").write_bytes(blob)
        (staging / "config.json").write_text(text, encoding="utf-8")
        if training_log is not None:
            (staging / "training_log.json").write_text(training_log, encoding="utf-8")

    owned = {"config.json", "training_log.json", *PARAMS_FILES}
    return write_directory_atomically(directory, fill, owned=owned.__contains__, what="lens")
