"""Runtimes as candidates: a GPT-2 that runs somewhere else, run by refgpt on a golden's tokens.

A port author whose GPT-2 runs in another runtime hands ``refgpt compare`` the model itself; refgpt
runs that runtime, captures every intermediate it exposes and names them as refgpt does, so the
oracle judges them like any candidate. Each runtime is an optional extra, imported only here,
never by the core; a missing one is a one-line error naming the extra.

- ``extras`` — importing a runtime, or the one-line error naming its extra.
- ``onnx_model`` — GPT-2 as an ONNX graph (torch.onnx's export of the HF model refgpt saves):
  every intermediate promoted to an output, run by ONNX Runtime or tinygrad, mapped to refgpt's names.
- ``polygraphy_json`` — Polygraphy's RunResults JSON, read (a candidate) and written (a golden).
- ``ctranslate2_model`` — a CTranslate2 model directory, run for its logits.
- ``mlx_model`` — mlx-lm's GPT-2 of an HF directory, its modules wrapped to keep their tensors.
- ``tl_bridge`` — TransformerLens 4's TransformerBridge of an HF directory, every hook it caches.
"""

#: ``refgpt compare --runtime``: each engine and what it runs (an .onnx file, a model directory).
RUNTIMES = {"onnxruntime": ".onnx", "tinygrad": ".onnx", "ctranslate2": "directory", "mlx": "directory",
            "transformer-lens": "directory"}
