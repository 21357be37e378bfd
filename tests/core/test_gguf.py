"""GGUF in and out (refgpt/files/gguf_file.py, ggml_blocks.py), judged by ggml's own ``gguf`` package.

- every block type refgpt reads dequantizes bit for bit as the gguf package does, and quantizes
  bit for bit as its reference quantizer (ggml's, tested there against the C library);
- a file refgpt writes is read by the gguf package's GGUFReader with llama.cpp's converter's names,
  dims, types and hyperparameters; a file the gguf package's GGUFWriter writes as the converter
  does (Conv1D transposed, 1-D and position_embd in F32, the rest quantized) loads in refgpt as the
  dequantized weights;
- save → load gives the model back (F32: bit for bit the float32-rounded weights), with its
  tokenizer and ``model.quantization``;
- lies in a header are refused in one line (the fuzzing is tests/core/test_gguf_fuzz.py).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import refgpt
from random_models import random_model, tied_model
from refgpt import Config, RefGPTError
from refgpt.files.ggml_blocks import TYPES, dequantize, quantize
from refgpt.files.gguf_file import GGUFFile

gguf = pytest.importorskip("gguf", reason="the gguf extra (pip install 'refgpt[gguf]') judges the GGUF tests")

CFG = Config(d_model=64, n_layers=2, n_heads=4, d_mlp=96, d_vocab=300, n_ctx=16)
QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def _rows(seed: int) -> np.ndarray:
    """float32 rows meant to catch every rounding branch: Gaussian rows over 12 decades, all-zero and
    constant blocks, ties in magnitude of opposite sign, halves of the step, f16 overflow and subnormals."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((16, 64)) * 10.0 ** rng.integers(-8, 4, (16, 1))).astype(np.float32)  # [rows, 64]
    x[0, :32] = 0
    x[1, :32] = 3.0
    x[2, 0], x[2, 1] = 5.0, -5.0  # equal magnitudes: the first wins
    x[3, :32] = np.arange(32, dtype=np.float32) - 15.5  # values at half steps
    x[4, :32] *= 1e6  # a scale past f16's range
    x[5, :32] = rng.standard_normal(32).astype(np.float32) * 1e-9  # subnormal scales
    return x


@pytest.mark.parametrize("name", list(TYPES))
def test_quantize_and_dequantize_bit_for_bit_as_ggml(name):
    kind = TYPES[name]
    code = gguf.GGMLQuantizationType(kind.code)
    for seed in range(4):
        x = _rows(seed)
        ours = quantize(x, kind)
        theirs = np.asarray(gguf.quants.quantize(x, code)).reshape(-1).view(np.uint8)
        assert np.array_equal(ours, theirs), (name, seed)
        raw = np.random.default_rng(seed).integers(0, 256, kind.nbytes(x.size), dtype=np.uint8)  # any bytes, NaN scales too
        for data in (ours, raw):
            with np.errstate(all="ignore"):
                expected = np.asarray(gguf.quants.dequantize(data.reshape(x.shape[0], -1), code), np.float32).reshape(-1)
            assert np.array_equal(dequantize(data, kind, x.size).view(np.uint32), expected.view(np.uint32)), (name, seed)


def _model():
    return tied_model(CFG, seed=1, tokenizer=True)


@pytest.mark.parametrize("name", ["F32", "F16", "BF16", *QUANTIZED])
def test_save_then_load_gives_the_dequantized_model(tmp_path, name):
    model = _model()
    path = refgpt.save(model, tmp_path / "m.gguf", type=name)
    back = refgpt.load(path)
    assert back.cfg == model.cfg and back.tokenizer.encoder == model.tokenizer.encoder
    assert back.tokenizer.merges == model.tokenizer.merges and back.tokenizer.eot_token == CFG.d_vocab - 1
    assert back.quantization["blk.0.attn_qkv.weight"] == name and back.quantization["position_embd.weight"] == "F32"
    assert back.quantization["blk.1.ffn_norm.bias"] == "F32"
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:  # every tensor as the gguf package dequantizes it, transposed where the converter does
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float64)
        mine = GGUFFile(path).tensor(t.name)
        assert np.array_equal(mine, values), t.name
    if name == "F32":  # bit for bit the weights rounded to float32
        for key, value in model.params.items():
            assert np.array_equal(back.params[key], value.astype(np.float32).astype(np.float64)), key


def test_refgpts_file_has_the_converters_names_dims_and_keys(tmp_path):
    path = refgpt.save(_model(), tmp_path / "m.gguf", type="Q8_0")
    reader = gguf.GGUFReader(path)
    dims = {t.name: (list(map(int, t.shape)), t.tensor_type.name) for t in reader.tensors}
    d, m, v = CFG.d_model, CFG.d_mlp, CFG.d_vocab
    assert dims["token_embd.weight"] == ([d, v], "Q8_0") and "output.weight" not in dims  # tied: one matrix
    assert dims["position_embd.weight"] == ([d, CFG.n_ctx], "F32")
    assert dims["blk.1.attn_qkv.weight"] == ([d, 3 * d], "Q8_0") and dims["blk.1.attn_qkv.bias"] == ([3 * d], "F32")
    assert dims["blk.0.ffn_up.weight"] == ([d, m], "Q8_0") and dims["blk.0.ffn_down.weight"] == ([m, d], "Q8_0")
    assert len(dims) == 4 + 12 * CFG.n_layers
    fields = reader.fields
    assert fields["general.architecture"].contents() == "gpt2" and fields["gpt2.block_count"].contents() == 2
    assert fields["gpt2.feed_forward_length"].contents() == m and fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.tokens"].contents()[-1] == "<|endoftext|>"
    assert fields["general.file_type"].contents() == 7  # LLAMA_FTYPE_MOSTLY_Q8_0


def _converter_file(model, path, qtype):
    """What llama.cpp's convert_hf_to_gguf.py writes for GPT-2 (its GPT2Model), done with the gguf
    package's writer: HF's tensors, Conv1D weights transposed, wte again as output (as an older
    converter wrote a tied GPT-2; 0.3.36's writes it once: tests/oracle/test_llama_cpp_converter.py)."""
    from refgpt.files.checkpoint import hf_tensors

    w = gguf.GGUFWriter(path, "gpt2")
    w.add_block_count(CFG.n_layers)
    w.add_context_length(CFG.n_ctx)
    w.add_embedding_length(CFG.d_model)
    w.add_feed_forward_length(CFG.d_mlp)
    w.add_head_count(CFG.n_heads)
    w.add_layer_norm_eps(CFG.eps)
    w.add_file_type(7)
    names = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight", "ln_f.weight": "output_norm.weight",
             "ln_f.bias": "output_norm.bias"}
    block = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for key, value in hf_tensors(model.cfg, model.params, prefix="").items():
        value = np.asarray(value, np.float32)
        if key in names:
            name = names[key]
        else:
            _, L, rest = key.split(".", 2)
            part, what = rest.rsplit(".", 1)
            name = f"blk.{L}.{block[part]}.{what}"
            if what == "weight" and value.ndim == 2:
                value = np.ascontiguousarray(value.T)
        targets = [name] + (["output.weight"] if name == "token_embd.weight" else [])
        for target in targets:
            if value.ndim == 2 and target != "position_embd.weight":
                w.add_tensor(target, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(target, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_a_file_written_as_the_converter_writes_it_loads_as_its_dequantized_weights(tmp_path, qtype):
    model = tied_model(CFG, seed=2)
    code = gguf.GGMLQuantizationType[qtype]
    _converter_file(model, tmp_path / "c.gguf", code)
    back = refgpt.load(tmp_path / "c.gguf")
    assert back.tokenizer is None and back.cfg.tie_word_embeddings
    mine = refgpt.load(refgpt.save(model, tmp_path / "r.gguf", type=qtype))
    for key, value in back.params.items():  # the same file contents: refgpt's writer is the converter's
        assert np.array_equal(value, mine.params[key]), key
    W_in = np.asarray(model.params["blocks.1.mlp.W_in"], np.float32)  # [d_model, d_mlp]
    expected = gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(W_in.T), code), code).T
    assert np.array_equal(back.params["blocks.1.mlp.W_in"], expected)


def _header(kv: list[bytes], tensors: list[bytes], n_kv=None, n_tensors=None, version=3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kv) if n_kv is None else n_kv) + b"".join(kv) + b"".join(tensors)


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


@pytest.mark.parametrize("data, says", [
    (b"", "empty"),
    (b"GGML" + bytes(20), "not a GGUF file"),
    (b"GGUF" + struct.pack("<I", 0x03000000) + bytes(16), "big-endian"),
    (b"GGUF" + struct.pack("<I", 7) + bytes(16), "version 7"),
    (_header([], [], n_kv=2**62), "the header says 4611686018427387904 key/value pairs"),
    (_header([], [], n_tensors=2**40), "1099511627776 tensors"),
    (_header([_s("a") + struct.pack("<I", 8) + struct.pack("<Q", 2**60)], []), "truncated"),
    (_header([_s("a") + struct.pack("<IIQ", 9, 8, 2**61)], []), "strings in 'a'"),
    (_header([_s("a") + struct.pack("<IIQ", 9, 12, 2**61)], []), "elements in 'a'"),
    (_header([_s("a") + struct.pack("<II", 4, 1)] * 2, []), "'a' appears twice"),
    (_header([_s("a") + struct.pack("<I", 99)], []), "unknown GGUF value type 99"),
    (_header([b"\x02" + bytes(7) + b"\xff\xfe" + struct.pack("<II", 4, 1)], []), "not UTF-8"),
    (_header([], [_s("t") + struct.pack("<I", 9) + bytes(40)]), "9 dimensions"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 2**60, 0, 0)]), "absurd dimensions"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 0, 0, 0)]), "absurd dimensions"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 32, 12, 0)]), "Q4_K, which refgpt does not read"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 33, 8, 0)]), "whole number of 32-number blocks"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 4, 0, 3)]), "not a multiple of the alignment"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 10, 0, 0)]), "runs past the end"),
    (_header([], [_s("t") + struct.pack("<IQIQ", 1, 4, 0, 0), _s("u") + struct.pack("<IQIQ", 1, 4, 0, 0)]) + bytes(64),
     "overlap"),
    (_header([_s("general.alignment") + struct.pack("<II", 4, 3)], []), "power of two"),
])
def test_header_lies_are_refused_in_one_line(tmp_path, data, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(RefGPTError, match=None) as caught:
        refgpt.load(path)
    assert says in str(caught.value) and "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_files_that_are_not_gpt2_or_whose_tokenizer_disagrees_are_refused(tmp_path):
    model = _model()
    path = refgpt.save(model, tmp_path / "m.gguf", type="F16")
    data = path.read_bytes()

    def refused(edit, says):
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(edit(data))
        with pytest.raises(RefGPTError) as caught:
            refgpt.load(bad)
        assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)

    refused(lambda d: d.replace(_s("gpt2"), _s("gptj"), 1), "refgpt reads GPT-2 ('gpt2') only")
    # (edits of equal length: the data section stays where it was)
    refused(lambda d: d.replace(_s("w10"), _s("w11"), 1), "is both id")
    refused(lambda d: d.replace(_s("Ġ t"), _s("Ġtt"), 1), "not two symbols separated by one space")
    refused(lambda d: d.replace(_s("Ġ t"), _s("Ġ ~"), 1), "tokenizer: ")
    refused(lambda d: d.replace(_s("blk.1.ffn_up.bias"), _s("blk.7.ffn_up.bias"), 1), "unexpected tensor 'blk.7.ffn_up.bias'")
    count = struct.pack("<I", 4) + struct.pack("<I", CFG.n_layers)
    refused(lambda d: d.replace(_s("gpt2.block_count") + count, _s("gpt2.block_count") + struct.pack("<II", 4, 2**30), 1),
            "block_count disagrees with the tensors")
    nan = np.float16(np.nan).tobytes()
    head = len(data) - sum(e.nbytes + (-e.nbytes % 32) for e in GGUFFile(path).tensors.values())
    entry = GGUFFile(path).tensors["blk.0.attn_qkv.weight"]
    refused(lambda d: d[:entry.offset] + nan + d[entry.offset + 2:], "non-finite value")
    assert head > 0


def test_save_refuses_what_a_gguf_file_cannot_hold(tmp_path):
    with pytest.raises(RefGPTError, match="not one refgpt reads and writes; supported: F32, F16"):
        refgpt.save(_model(), tmp_path / "m.gguf", type="Q4_K")
    with pytest.raises(RefGPTError, match="gelu_new"):
        refgpt.save(random_model(Config(d_model=8, n_layers=1, n_heads=2, d_mlp=8, d_vocab=5, n_ctx=3, act_fn="relu")),
                    tmp_path / "r.gguf")
    with pytest.raises(RefGPTError, match="type='Q8_0' is for GGUF files"):
        refgpt.save(_model(), tmp_path / "dir", type="Q8_0")
    assert not list(tmp_path.iterdir())


def test_load_gguf_from_the_command_line(tmp_path, capsys):
    from refgpt.cli import main

    path = refgpt.save(refgpt.load_default(), tmp_path / "d.gguf", type="Q8_0")
    assert main(["predict", "To be, or not to", "--model", str(path), "--top-k", "2"]) in (0, None)
    assert "d.gguf" in capsys.readouterr().out


def test_a_missing_file_or_a_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "d.gguf").mkdir()
    for path, says in ((tmp_path / "none.gguf", "GGUF file not found"), (tmp_path / "d.gguf", "is a directory, not a GGUF file")):
        with pytest.raises(RefGPTError, match=says):
            refgpt.load(path)


def test_a_file_truncated_while_it_is_read_is_one_line_not_a_sigbus(tmp_path):
    path = refgpt.save(_model(), tmp_path / "m.gguf", type="Q8_0")
    g = GGUFFile(path)
    with open(path, "r+b") as f:  # rewritten in place by another process
        f.truncate(len(path.read_bytes()) // 2)
    with pytest.raises(RefGPTError, match="the file shrank from"):
        g.tensor(max(g.tensors, key=lambda name: g.tensors[name].offset))  # the file's last tensor
