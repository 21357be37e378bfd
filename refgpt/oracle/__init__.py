"""The oracle: golden files, comparisons that name the first divergence, and foreign formats.

- ``golden`` — every activation of one forward pass, written to a safetensors file any language reads.
- ``comparison`` — a candidate's tensors against a golden: the first tensor out of tolerance.
- ``name_maps`` — other implementations' tensor names (HF, TransformerLens, llm.c) → refgpt's.
- ``llmc`` — llm.c's binary checkpoint, tokenizer and debug-state formats, read and written.

``refgpt.oracle.compare(reference, candidate)`` is ``comparison.compare``.
"""

from .comparison import Report, compare, describe_divergence, format_report, load

__all__ = ["Report", "compare", "describe_divergence", "format_report", "load"]
