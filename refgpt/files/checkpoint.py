"""From an HF GPT-2 checkpoint directory to weights in circuits notation.

HF stores GPT-2 as OpenAI did: ``wte``, ``wpe``, and per block ``h.L`` a fused ``c_attn`` Conv1D
whose weight is [d_model, 3·d_model] (Conv1D weights are [in, out], the transpose of nn.Linear's),
columns ordered Q | K | V and, within each, head by head. TransformerLens and refgpt name the same
numbers in circuits notation (Elhage et al. 2021):

    W_E [d_vocab, d_model]    W_pos [n_ctx, d_model]    W_U [d_model, d_vocab]
    W_Q, W_K, W_V [head, d_model, d_head]    b_Q, b_K, b_V [head, d_head]
    W_O [head, d_head, d_model]              b_O [d_model]
    W_in [d_model, d_mlp]  b_in [d_mlp]      W_out [d_mlp, d_model]  b_out [d_model]
    ln1.w, ln1.b, ln2.w, ln2.b, ln_final.w, ln_final.b [d_model]

Every one of these is a reshaped *view* of the stored tensor when it is stored in the compute
dtype: nothing is copied. The parameter dict uses TransformerLens's state-dict names
(``blocks.3.attn.W_Q``), so the two can be compared key by key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from .. import strict_json
from ..gpt2.config import Config
from ..dtypes import compute_dtype
from ..errors import RefGPTError, as_path
from ..model import Model
from ..tl.processing import process as process_weights
from .atomic_write import old_directory_left, refuse_temporary
from .manifest import check as check_manifest
from .safetensors_file import SafetensorsFile
from .whole_file import read_bytes
from ..gpt2.tokenizer import Tokenizer
from ..reference import weights

# HF's non-parameter buffers: the causal mask and the masked fill value. Never weights.
_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every HF key of a GPT-2 with this config (bare, no ``transformer.`` prefix) and its shape."""
    d, m = cfg.d_model, cfg.d_mlp
    shapes = {"wte.weight": (cfg.d_vocab, d), "wpe.weight": (cfg.n_ctx, d)}
    for L in range(cfg.n_layers):
        shapes.update({
            f"h.{L}.ln_1.weight": (d,), f"h.{L}.ln_1.bias": (d,),
            f"h.{L}.attn.c_attn.weight": (d, 3 * d), f"h.{L}.attn.c_attn.bias": (3 * d,),
            f"h.{L}.attn.c_proj.weight": (d, d), f"h.{L}.attn.c_proj.bias": (d,),
            f"h.{L}.ln_2.weight": (d,), f"h.{L}.ln_2.bias": (d,),
            f"h.{L}.mlp.c_fc.weight": (d, m), f"h.{L}.mlp.c_fc.bias": (m,),
            f"h.{L}.mlp.c_proj.weight": (m, d), f"h.{L}.mlp.c_proj.bias": (d,),
        })
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.d_vocab, d)
    return shapes


def weight_files(directory: Path) -> list[Path]:
    """``model.safetensors``, or the shards a ``model.safetensors.index.json`` names."""
    return sorted(set(_weight_map(directory).values())) if _is_sharded(directory) else [directory / "model.safetensors"]


def _is_sharded(directory: Path) -> bool:
    if (directory / "model.safetensors").exists():
        return False
    if (directory / "model.safetensors.index.json").exists():
        return True
    raise RefGPTError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _weight_map(directory: Path) -> dict[str, Path]:
    """The shard index's tensor name → shard file, checked: a non-empty object of file names
    that exist beside the index."""
    index = directory / "model.safetensors.index.json"
    document = strict_json.loads(read_bytes(index, "shard index"), f"{index}: not a valid shard index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise RefGPTError(f"{index}: not a valid shard index: 'weight_map' must be a non-empty object "
                          f"of tensor name → shard file, found {weight_map!r:.80}")
    shards = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise RefGPTError(f"{index}: weight_map[{name!r}] must be a file name beside the index, found {shard!r:.80}")
        if not (directory / shard).is_file():
            raise RefGPTError(f"{index}: weight_map[{name!r}] names shard {shard!r}, which does not exist")
        shards[name] = directory / shard
    return shards


def read_hf_tensors(files: list[Path], cfg: Config, dtype: np.dtype,
                    weight_map: dict[str, Path] | None = None) -> dict[str, np.ndarray]:
    """Every weight of the checkpoint under its bare HF key, checked and in ``dtype``.

    A weight found twice — with and without the ``transformer.`` prefix, or in two shards — is an
    error, even when both copies agree: which one is meant would be a guess. With a shard index
    (``weight_map``), every tensor must be in the shard the index names, and every tensor of a
    shard must be listed.
    """
    found: dict[str, tuple[SafetensorsFile, str]] = {}
    for path in files:
        st = SafetensorsFile(path)
        for name in st.names:
            if weight_map is not None and weight_map.get(name) != path:
                listed = weight_map.get(name)
                raise RefGPTError(f"{path}: holds tensor {name!r}, which the shard index "
                                  + (f"places in {listed.name!r}" if listed else "does not list"))
            key = name.removeprefix("transformer.")
            if key in found:
                other, other_name = found[key]
                raise RefGPTError(f"{path}: tensor {name!r} is stored twice: also as {other_name!r}"
                                  + (f" in {other.path}" if other.path != path else "")
                                  + "; which copy is meant is ambiguous")
            found[key] = (st, name)
    if weight_map is not None:
        for name, path in weight_map.items():
            if found.get(name.removeprefix("transformer."), (None, None))[1] != name:
                raise RefGPTError(f"{path}: the shard index lists tensor {name!r}, but the shard does not hold it")
    blocks = {int(m.group(1)) for key in found if (m := re.match(r"h\.(\d+)\.", key))}
    if len(blocks) != cfg.n_layers and (not blocks or max(blocks) < cfg.n_layers):
        # checked before the n_layer-long list of expected shapes is built (n_layer may be huge)
        raise RefGPTError(f"{files[0].parent}: config.json says n_layer={cfg.n_layers}, but the checkpoint "
                          f"holds {len(blocks)} blocks: n_layer disagrees with the tensors")
    expected = expected_shapes(cfg)
    tensors = {}
    for key, (st, name) in found.items():
        if _BUFFER.fullmatch(key) or (key == "lm_head.weight" and cfg.tie_word_embeddings):
            continue  # a buffer, or a tied lm_head (HF uses wte and ignores a stored copy)
        if key not in expected:
            raise RefGPTError(_explain_unexpected(st.path, name, key, cfg))
    for key, shape in expected.items():
        if key not in found:
            hint = (" (tie_word_embeddings is false, so the model needs its own lm_head)"
                    if key == "lm_head.weight" else "")
            raise RefGPTError(f"{files[0].parent}: tensor {key!r} is missing from the checkpoint{hint}")
        st, name = found[key]
        if st.shape(name) != shape:
            raise RefGPTError(_explain_shape(st.path, name, st.shape(name), shape))
        tensors[key] = st.float_tensor(name, dtype)
        if st.raw(name).dtype != dtype:  # converted (e.g. float32 stored, float64 computed): a copy,
            st.release(name)  # so the stored bytes' pages go; one copy of the weights is held, not two
    return tensors


def _explain_unexpected(path, name, key, cfg):
    layer = re.match(r"h\.(\d+)\.", key)
    if layer and int(layer.group(1)) >= cfg.n_layers:
        return (f"{path}: tensor {name!r} belongs to block {layer.group(1)}, but config.json says "
                f"n_layer={cfg.n_layers}: n_layer disagrees with the tensors")
    return f"{path}: unexpected tensor {name!r}: not part of a GPT-2 (GPT2LMHeadModel) checkpoint"


def _explain_shape(path, name, found, expected):
    msg = f"{path}: tensor {name!r} has shape {list(found)}, expected {list(expected)}"
    key = name.removeprefix("transformer.")
    if key in ("wte.weight", "lm_head.weight") and found[1:] == expected[1:]:
        msg += f": vocab_size={expected[0]} in config.json disagrees with the tensors ({found[0]} rows)"
    elif key == "wpe.weight" and found[1:] == expected[1:]:
        msg += f": n_positions={expected[0]} in config.json disagrees with the tensors ({found[0]} rows)"
    return msg


def to_circuits(t: dict[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """HF keys → TransformerLens state-dict names, as views wherever the layout allows: the
    reference's map (refgpt/reference/weights.py)."""
    return weights.to_circuits(t, cfg.n_layers, cfg.n_heads, cfg.tie_word_embeddings)


def hf_tensors(cfg: Config, params, prefix: str = "transformer.") -> dict[str, np.ndarray]:
    """TransformerLens state-dict names → HF GPT2LMHeadModel keys and layouts: the inverse of
    ``to_circuits``, bit for bit (refgpt/reference/weights.py)."""
    return weights.to_hf(params, cfg.n_layers, cfg.tie_word_embeddings, prefix)


def load(path: str | Path, dtype="float64", tokenizer=True, process=None):
    """Load an HF GPT-2 checkpoint: a directory (``config.json`` + ``model.safetensors``), a
    llama.cpp GGUF file (``*.gguf``: every tensor dequantized as ggml defines it, its tokenizer
    from the file, ``model.quantization`` its tensors' types; refgpt/files/gguf_file.py), or a hub
    name (``gpt2``, ``openai-community/gpt2@REVISION``) found in the HF cache or downloaded into it
    (refgpt.files.hub.resolve; ``HF_HUB_OFFLINE=1``: the cache only).

    ``dtype`` is the compute dtype, float64 (default) or float32; weights stored in any float
    format are converted to it. Weights stored in the compute dtype are memory-mapped, not copied.
    With ``tokenizer=True`` a ``vocab.json`` + ``merges.txt`` (or ``encoder.json`` + ``vocab.bpe``)
    beside the weights becomes ``model.tokenizer``. ``process``: None (default, the weights as
    stored), True (TransformerLens's from_pretrained defaults) or processing step names
    (refgpt.tl.processing).
    """
    directory = as_path(path, "load: path")
    dtype = compute_dtype(dtype)
    if directory.suffix.lower() == ".gguf":
        return _load_gguf(directory, dtype, tokenizer, process)
    try:
        return _load(path, directory, dtype, tokenizer, process)
    except OSError as error:  # ENAMETOOLONG, EACCES, ELOOP, …: the file system refused a path
        raise RefGPTError(f"{_shown(error.filename or directory)}: cannot open ({error.strerror or error})") from None


def _load_gguf(path: Path, dtype, tokenizer, process):
    from .gguf_file import read_model

    cfg, tensors, found_tokenizer, types = read_model(path, dtype, tokenizer)
    model = Model(cfg, to_circuits(tensors, cfg), dtype=dtype, source=path)
    model.tokenizer = found_tokenizer
    model.quantization = types  # GGUF tensor name → its stored type ('Q8_0', 'F32', …)
    return process_weights(model, process) if process else model


def _shown(path, limit: int = 120) -> str:
    """``path`` for an error message: a path too long for the file system is shown by its start."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _load(path, directory: Path, dtype, tokenizer, process):
    refuse_temporary(directory)
    if not directory.is_dir():  # a hub name? (the HTTP client's imports cost ~0.1 s: only then)
        left = old_directory_left(directory) if isinstance(path, (str, Path)) else None
        if left is not None and not directory.exists():
            raise RefGPTError(f"{directory}: model directory not found; an interrupted refgpt.save left the old "
                              f"model at {left} (rename it back, or save again)")
        from .hub import resolve

        directory = resolve(path)
    for _ in range(5):
        pinned = _pin(directory)
        if pinned is None:
            break
        fd, inside = pinned  # every file is read from the directory as it was when the load began
        try:
            return _load_files(inside, directory, dtype, tokenizer, process)
        except (RefGPTError, OSError) as error:
            if _identity(directory) != _identity(fd):  # a save switched it, and removed the one held: again
                continue
            if isinstance(error, OSError):
                if error.filename:  # errors name the directory as given, not /proc/self/fd/N
                    error.filename = str(error.filename).replace(str(inside), str(directory))
                raise
            raise RefGPTError(str(error).replace(str(inside), str(directory))) from None
        finally:
            os.close(fd)
    for _ in range(5):  # no /proc: a directory switched by a concurrent refgpt.save mid-load is read again
        before = _identity(directory)
        try:
            model = _load_files(directory, directory, dtype, tokenizer, process)
        except RefGPTError:
            if _identity(directory) != before:
                continue
            raise
        if _identity(directory) == before:
            return model
    raise RefGPTError(f"{directory}: replaced five times while it was being read (another process keeps "
                      "saving into it)")


def _pin(directory: Path):
    """(fd, path) through which the directory's files are read as one: ``/proc/self/fd/N`` names the
    directory this fd holds, whatever takes its place meanwhile (refgpt.save exchanges a whole
    directory; a load reads several files). A save that switched the directory removes the one
    held, though: a load that fails while the path names another directory is read again. None
    where there is no /proc (then: read, and read again if the directory was replaced)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    inside = Path(f"/proc/self/fd/{fd}")
    if not (inside / ".").is_dir():
        os.close(fd)
        return None
    return fd, inside


def _identity(directory):
    """(device, inode) of a directory given by path or fd; None if it cannot be seen."""
    try:
        info = os.stat(directory)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _load_files(directory: Path, source: Path, dtype, tokenizer, process):
    """Read the checkpoint's files from ``directory``; the model's source is ``source`` (the same
    directory, as the caller named it)."""
    cfg = Config.from_json(directory / "config.json")
    cfg.check_fits_in_memory(dtype.itemsize, source=str(directory / "config.json"))
    weight_map = _weight_map(directory) if _is_sharded(directory) else None
    files = sorted(set(weight_map.values())) if weight_map else [directory / "model.safetensors"]
    tensors = read_hf_tensors(files, cfg, dtype, weight_map)
    model = Model(cfg, to_circuits(tensors, cfg), dtype=dtype, source=source)
    if tokenizer:
        model.tokenizer = _find_tokenizer(directory)
    check_manifest(directory)  # after every file was read and checked: a broken file is named as such first
    if process:
        model = process_weights(model, process)
    return model


_TOKENIZER_FILES = [("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")]


def _find_tokenizer(directory: Path):
    if not any((directory / v).exists() and (directory / m).exists() for v, m in _TOKENIZER_FILES):
        return None
    return Tokenizer.from_dir(directory)
