"""Files and hub: safetensors read and written, HF checkpoints in and out of a Model, the embedded
model, the Hugging Face cache on disk and the hub client that fills it; torch.save's zip files
(``torch_zip``, never unpickled) and the tuned-lens package's lens directories (``lens_directory``);
a whole small file read so that a missing or unreadable one is one RefGPTError (``whole_file``);
llama.cpp's GGUF files read and written (``gguf_file``) with ggml's block types (``ggml_blocks``).

``hub`` and ``hf_cache`` load on first use (``refgpt.files.hub.download(...)`` after a plain
``import refgpt``): a model loaded from a directory never needs the HTTP client's imports.
"""

import importlib as _importlib

_LAZY = ("hub", "hf_cache")


def __getattr__(name):
    if name in _LAZY:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
