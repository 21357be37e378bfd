"""CTranslate2 int8 (its own converter, its own runtime, as a user runs them): its logit error split
into the quantization's and the implementation's (refgpt/oracle/ctranslate2_file.py reads the
int8 weights and scales it stored back into a golden)."""

from __future__ import annotations

import numpy as np
import pytest

import refgpt
from refgpt import Config
from refgpt.oracle import golden
from refgpt.oracle.ctranslate2_file import read_model
from refgpt.oracle.quantized import nmse

pytestmark = pytest.mark.peer  # CTranslate2 (the peers extra) converts and runs the model

ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 (the peers extra) is the runtime judged")
pytest.importorskip("transformers", reason="CTranslate2's converter reads the checkpoint with transformers")

CFG = Config(d_model=64, n_layers=2, n_heads=4, d_mlp=256, d_vocab=300, n_ctx=32)
TOKENS = [5, 200, 17, 42, 280, 9, 77, 1]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from ctranslate2.converters import TransformersConverter
    from random_models import tied_model

    tmp = tmp_path_factory.mktemp("ct2")
    model = tied_model(CFG, 3, tokenizer=True)
    tokens = sorted(model.tokenizer.encoder, key=model.tokenizer.encoder.get)
    refgpt.save(model, tmp / "hf", dtype="float32")
    for kind in ("int8", "float32"):
        TransformersConverter(str(tmp / "hf")).convert(str(tmp / kind), quantization=kind, force=True)
    return tmp, tokens


def _logits(directory, tokens, compute_type):
    generator = ctranslate2.Generator(str(directory), device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=1)
    return np.array(generator.forward_batch([[tokens[i] for i in TOKENS]]), dtype=np.float64)  # [1, pos, d_vocab]


def test_ctranslate2_int8s_logit_error_is_split_into_quantization_and_implementation(converted):
    tmp, tokens = converted
    float_model = refgpt.load(tmp / "hf")
    float_logits = golden.make(float_model, np.array([TOKENS]), command=["test"]).tensors["logits"]
    int8 = read_model(tmp / "int8")
    assert int8.quantization["decoder/layer_1/ffn/linear_0/weight"] == "int8"
    int8_golden = golden.make(int8, np.array([TOKENS]), command=["test"])
    assert "int8" in int8_golden.metadata["quantization"]
    quantization = nmse(float_logits, int8_golden.tensors["logits"])
    implementation = nmse(int8_golden.tensors["logits"], _logits(tmp / "int8", tokens, "int8"))
    total = nmse(float_logits, _logits(tmp / "int8", tokens, "int8"))
    print(f"CTranslate2 int8 logits: total NMSE {total:.3e} = quantization {quantization:.3e} "
          f"+ implementation {implementation:.3e}")
    # docs/oracle.md: about 10⁻³ in all, each part about half, the two adding up (uncorrelated errors' NMSEs add)
    assert 1e-4 < total < 1e-2 and 0.2 * total < quantization < 0.8 * total and 0.2 * total < implementation < 0.8 * total
    assert abs(total - (quantization + implementation)) < 0.3 * total


def test_ctranslate2_int8s_logits_are_judged_locally_as_an_int8_product(converted):
    """CTranslate2 exposes its logits only; judge_int8_logits recovers the int8 input of the last
    product from them and judges the product within its derived bound. The same product computed
    with a saturating int16 GEMM (tests/quantized_port.py), on the quantized golden's input, is out
    of it, and named at the logits as an implementation error."""
    from quantized_port import ct2_int8_product
    from refgpt import RefGPTError
    from refgpt.oracle.ctranslate2_file import judge_int8_logits, read_variables
    from refgpt.oracle.quantized import int8_rows

    tmp, tokens = converted
    verdict = judge_int8_logits(tmp / "int8", _logits(tmp / "int8", tokens, "int8"))
    print(f"CTranslate2 int8 logits product: worst error / bound {verdict.worst:.3g}")
    assert verdict.ok and verdict.weight_type == "int8", verdict
    variables, _ = read_variables(tmp / "int8" / "model.bin")
    W_q, w_scale = variables["decoder/embeddings/weight"], variables["decoder/embeddings/weight_scale"]
    x = golden.make(read_model(tmp / "int8"), np.array([TOKENS]), command=["test"]).tensors["ln_final.out"]
    q, a = int8_rows(np.asarray(x).reshape(len(TOKENS), -1))
    assert judge_int8_logits(tmp / "int8", ct2_int8_product(q, a, W_q, w_scale)[None]).ok
    wrong = judge_int8_logits(tmp / "int8", ct2_int8_product(q, a, W_q, w_scale, saturate=True)[None])
    assert not wrong.ok and wrong.op == "logits", wrong
    with pytest.raises(RefGPTError, match="is not stored as int8"):
        judge_int8_logits(tmp / "float32", _logits(tmp / "float32", tokens, "float32"))
    with pytest.raises(RefGPTError, match="do not fit the projection"):
        judge_int8_logits(tmp / "int8", np.zeros((1, 2, 7)))


def test_compare_runs_ctranslate2_int8_and_notes_its_logits_local_verdict(converted, tmp_path, capsys):
    from refgpt.cli import main

    tmp, _ = converted
    golden.write(tmp_path / "q.safetensors", golden.make(read_model(tmp / "int8"), np.array([TOKENS]), command=["test"]))
    main(["compare", str(tmp_path / "q.safetensors"), str(tmp / "int8"), "--runtime", "ctranslate2"])
    out = capsys.readouterr().out
    assert "CTranslate2 int8: the logits judged as an int8 product" in out and "within it" in out, out


def test_ctranslate2_float32_is_refgpts_model_to_float32_rounding(converted):
    """The reader maps every variable where CTranslate2 runs it: at float32 nothing but rounding is left."""
    tmp, tokens = converted
    model = read_model(tmp / "float32")
    reference = golden.make(model, np.array([TOKENS]), command=["test"]).tensors["logits"]
    error = nmse(reference, _logits(tmp / "float32", tokens, "float32"))
    print(f"CTranslate2 float32 logits: NMSE {error:.3e}")
    assert error < 1e-10  # docs/oracle.md


def test_a_damaged_model_bin_is_refused_in_one_line(converted, tmp_path):
    from refgpt import RefGPTError

    tmp, _ = converted
    data = (tmp / "int8" / "model.bin").read_bytes()
    for edit, says in ((lambda d: d[: len(d) // 2], "truncated CTranslate2 model"),
                       (lambda d: b"\x07" + d[1:], "binary version 7"),
                       (lambda d: d + b"\0", "1 bytes after the model's last entry"),
                       (lambda d: d.replace(b"TransformerDecoderSpec", b"TransformerEncoderSpec", 1), "refgpt reads CTranslate2's GPT-2")):
        (tmp_path / "model.bin").write_bytes(edit(data))
        with pytest.raises(RefGPTError) as caught:
            read_model(tmp_path)
        assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
