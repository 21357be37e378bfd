"""llama.cpp's own converter (``convert_hf_to_gguf.py`` from the llama-cpp-python source package,
tests/llama_cpp_source.py) run on a checkpoint refgpt saved, as llama.cpp's users run it: refgpt
loads its GGUF files to exactly the weights, types and tokenizer of the files refgpt's own writer
makes. Python only (the converter needs torch and transformers, the peers extra); judging llama.cpp
on these files is tests/oracle/test_llama_cpp.py's (REFGPT_LLAMA_CPP=long).

The converter recognises a BPE tokenizer by the hash of its pre-tokenization of a fixed text, so the
checkpoint carries GPT-2's own tokenizer (tests/tl_port.py's TOKENIZER_DIR, d_vocab = 50257)."""

from __future__ import annotations

import numpy as np
import pytest

import refgpt

pytestmark = [pytest.mark.peer, pytest.mark.slow]  # torch and transformers run the converter, ~10 s a file

pytest.importorskip("torch", reason="llama.cpp's converter imports torch (the peers extra)")
pytest.importorskip("transformers", reason="llama.cpp's converter reads the tokenizer with transformers")

#: --outtype → the type of the weight matrices in the file
OUTTYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}


def converted_files(tmp_path) -> tuple[refgpt.Model, dict[str, object]]:
    """(the float32 checkpoint's model, {outtype: the converter's GGUF file})."""
    from llama_cpp_source import convert, converter_model

    hf = refgpt.save(converter_model(), tmp_path / "hf", dtype="float32")
    return refgpt.load(hf), {t: convert(hf, t, tmp_path / f"converted.{t}.gguf") for t in OUTTYPES}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from llama_cpp_source import source_or_skip

    source_or_skip()
    return converted_files(tmp_path_factory.mktemp("converter"))


@pytest.mark.parametrize("outtype", sorted(OUTTYPES))
def test_the_converters_file_loads_to_the_weights_refgpts_writer_makes(converted, tmp_path, outtype):
    float_model, files = converted
    theirs = refgpt.load(files[outtype])
    ours = refgpt.load(refgpt.save(float_model, tmp_path / "ours.gguf", type=OUTTYPES[outtype]))
    assert theirs.cfg == ours.cfg == float_model.cfg
    assert theirs.quantization == ours.quantization
    assert theirs.quantization["blk.1.ffn_down.weight"] == OUTTYPES[outtype]
    for name, value in ours.params.items():
        assert np.array_equal(theirs.params[name], value), name  # bit for bit, every type
    assert theirs.tokenizer.encoder == float_model.tokenizer.encoder
    assert theirs.tokenizer.merges == float_model.tokenizer.merges
    if outtype == "f32":  # float32 weights stored as they are
        for name, value in float_model.params.items():
            assert np.array_equal(theirs.params[name], value), name
