"""llama.cpp's own source, from the llama-cpp-python source package pip downloads: its converter
(``convert_hf_to_gguf.py``, run as its users run it) and, for the long run, its libraries built with a
one-line patch (a planted kernel bug).

Nothing of llama.cpp is vendored into refgpt: `.ci/run` downloads the package
(``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36``) into
``.cache/llama-cpp-python/``; ``REFGPT_LLAMA_CPP_SDIST`` names another copy. Without it the tests
that need it skip, saying how to get it. The unpacked tree is kept between runs in
``refgpt-llama-cpp-0.3.36`` in the temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from refgpt import Config

VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST = Path(os.environ.get("REFGPT_LLAMA_CPP_SDIST",
                            Path(__file__).resolve().parent.parent / ".cache" / "llama-cpp-python" / SDIST_NAME))
CACHE = Path(tempfile.gettempdir()) / f"refgpt-llama-cpp-{VERSION}"
VENDOR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"

#: The converter's GPT-2: d_mlp = 4·d_model (it writes feed_forward_length so), GPT-2's vocabulary
CONVERTER_CFG = Config(d_model=64, n_layers=2, n_heads=4, d_mlp=256, d_vocab=50257, n_ctx=32)

#: The planted bug: GELU's cubic coefficient with a zero too many (0.044715 → 0.0044715), in the CPU
#: kernel every GELU of llama.cpp's CPU backend computes (ggml-cpu/vec.h: ggml_gelu_f32 and the
#: float16 table built from it).
PATCH_FILE = "ggml/src/ggml-cpu/vec.h"
PATCH = ("static const float GELU_COEF_A     = 0.044715f;", "static const float GELU_COEF_A     = 0.0044715f;")

#: The libraries only, as llama-cpp-python's own build configures them on a machine of unknown CPU
BUILD_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
               "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]


def source_or_skip() -> Path:
    """The unpacked vendor/llama.cpp of the source package (unpacked once), or a skip."""
    import pytest

    if not SDIST.is_file():
        pytest.skip(f"llama.cpp's source: pip download --no-deps --no-binary :all: llama-cpp-python=={VERSION} "
                    f"-d {SDIST.parent} (or set REFGPT_LLAMA_CPP_SDIST)")
    tree = CACHE / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        staging = Path(tempfile.mkdtemp(dir=CACHE.parent if CACHE.parent.exists() else None, prefix="refgpt-llama-"))
        with tarfile.open(SDIST) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(VENDOR)]
            for m in members:
                m.name = m.name[len(VENDOR):]
            archive.extractall(staging, members=[m for m in members if m.name], filter="data")
        CACHE.mkdir(exist_ok=True)
        try:
            staging.rename(tree)
        except OSError:  # another run unpacked it first
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def converter_model(seed: int = 21):
    """A random GPT-2 of CONVERTER_CFG's shape, tied (the converter writes one matrix), with GPT-2's
    own tokenizer: the converter recognises a BPE tokenizer by the hash of its pre-tokenization of a
    fixed text (tests/tl_port.py's TOKENIZER_DIR; without it, a skip)."""
    import refgpt
    from random_models import random_params
    from tl_port import TOKENIZER_DIR, tokenizer_files_or_skip

    tokenizer_files_or_skip()
    params = random_params(CONVERTER_CFG, seed)
    params["unembed.W_U"] = params["embed.W_E"].T.copy()  # [d_model, d_vocab]
    model = refgpt.Model(CONVERTER_CFG, params)
    model.tokenizer = refgpt.Tokenizer.from_dir(TOKENIZER_DIR)
    return model


def convert(hf_dir: Path, outtype: str, outfile: Path) -> Path:
    """``python convert_hf_to_gguf.py HF_DIR --outtype OUTTYPE --outfile OUTFILE``, as llama.cpp's
    users run it (its own gguf-py first on the path, as the script arranges), in this interpreter."""
    tree = source_or_skip()
    run = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", outtype,
                          "--outfile", str(outfile)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return outfile


def patched_source() -> Path:
    """A copy of the source package's llama.cpp with ``PATCH`` applied (made once)."""
    tree = source_or_skip()
    source = CACHE / "llama.cpp-gelu-patch"
    if not source.is_dir():
        shutil.copytree(tree, source)
    kernel = source / PATCH_FILE
    text = kernel.read_text()
    if PATCH[0] in text:
        assert text.count(PATCH[0]) == 1, f"{PATCH_FILE}: the line to patch is not unique"
        kernel.write_text(text.replace(PATCH[0], PATCH[1]))
    assert PATCH[1] in kernel.read_text(), f"{PATCH_FILE} no longer has {PATCH[0]!r}"
    return source


def patched_libraries() -> tuple[Path, float | None]:
    """(directory of libllama.so and its libggml*, seconds the build took or None if it was kept
    from an earlier run): llama.cpp's libraries built from the source package with ``PATCH``."""
    build = CACHE / "build-gelu-patch"
    lib = build / "bin"
    if (lib / "libllama.so").is_file() and (lib / "libggml-cpu.so").is_file():
        return lib, None
    source = patched_source()
    start = time.monotonic()
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *BUILD_FLAGS], check=True, capture_output=True,
                   timeout=600)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", "llama", "ggml-cpu"], check=True,
                   capture_output=True, timeout=4 * 3600)
    return lib, time.monotonic() - start
