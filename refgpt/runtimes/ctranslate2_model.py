"""A CTranslate2 GPT-2 (a directory its converter wrote) run on a golden's tokens: its logits.

    ct2-transformers-converter --model my-gpt2/ --output_dir my-gpt2-ct2 --quantization float32
    refgpt compare golden.safetensors my-gpt2-ct2/ --runtime ctranslate2

CTranslate2 exposes no intermediate tensor: ``Generator.forward_batch`` returns the logits
[batch, pos, d_vocab], which is all that is judged (shift-invariantly, as every candidate's
logits are); the report lists every activation as not in the candidate. The directory's compute
type is run as converted (``compute_type="default"``). Reading the weights of model.bin itself
(to judge a quantized model's error against its own dequantized weights) is
refgpt/oracle/ctranslate2_file.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from .extras import require

NOTES = ["CTranslate2 exposes the logits alone: every activation is left unjudged"]


def capture(directory, tokens) -> tuple[dict[str, np.ndarray], list[str]]:
    """Run the CTranslate2 model in ``directory`` on ``tokens`` [batch, pos]: ({tokens, logits}, notes)."""
    ctranslate2 = require("ctranslate2", "ctranslate2", "running a CTranslate2 candidate")
    directory = as_path(directory, "CTranslate2 model directory")
    if not (Path(directory) / "model.bin").is_file():
        raise RefGPTError(f"{directory}: not a CTranslate2 model directory (no model.bin); its converter writes one: "
                          f"ct2-transformers-converter --model HF_DIR --output_dir {directory}")
    tokens = np.asarray(tokens, np.int64)  # [batch, pos]
    try:
        generator = ctranslate2.Generator(str(directory), device="cpu", compute_type="default")
        logits = np.array(generator.forward_batch(tokens.tolist()))  # [batch, pos, d_vocab]
    except (RuntimeError, ValueError) as error:
        raise RefGPTError(f"{directory}: CTranslate2 failed to run it ({type(error).__name__}: "
                          f"{str(error).splitlines()[0][:300] if str(error) else ''})") from None
    return {"tokens": tokens, "logits": logits}, list(NOTES)
