"""The oracle: golden files, comparisons that name the first divergence, and foreign formats.

- ``golden`` — every activation of one forward pass (a padded batch too), written to a safetensors file any language reads.
- ``sequential`` — GPT-2 as a port written in loops adds (every sum in index order): the golden's second float32 pass.
- ``perturbed`` — refgpt's float32 pass with one more random rounding at every hook point: the golden's third.
- ``decode`` — decode goldens: the prompt pass and every KV-cached decoding step.
- ``gradients`` — with ``--backward``, the loss and ∂loss/∂ every parameter, activation and the logits.
- ``certify`` — with ``--certify``, the golden's own error, measured against extended precision.
- ``comparison`` — a candidate's tensors against a golden: the first tensor out of tolerance.
- ``name_maps`` — other implementations' tensor names (HF, TransformerLens, llm.c) → refgpt's.
- ``llmc`` — llm.c's binary checkpoint, tokenizer, debug-state and data-shard formats, read and written.
- ``token_files`` — a golden's tokens from files (ids, .npy, llm.c's), and the tokenizer an llm.c checkpoint lacks.
- ``llmc_dump`` — a dump of an llm.c run (tokens, activations, gradients), and llm.c's gradient names.
- ``quantized`` — a quantized port's error split into the file's quantization and the port's implementation,
  every matrix product judged against ggml's activation rounding and a derived bound; llama.cpp's names.
- ``ctranslate2_file`` — CTranslate2's converted GPT-2 (``model.bin``), its int8 weights read back into a golden.

``refgpt.oracle.compare(reference, candidate)`` is ``comparison.compare``.
"""

from .comparison import Report, compare, describe_divergence, format_report, load

__all__ = ["Report", "compare", "describe_divergence", "format_report", "load"]
