"""ONNX graphs of GPT-2 for the runtime tests (tests/runtimes/): torch.onnx's export of a random
model refgpt saved, with its golden, and bugs planted in the graph itself."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from random_models import saved
from refgpt.gpt2.config import Config
from refgpt.runtimes import onnx_model

SMALL = Config(d_model=32, n_layers=4, n_heads=4, d_mlp=128, d_vocab=50, n_ctx=16)
# 2 × 16 positions: each LayerNorm's scale has 32 elements, enough for the bias check (≥ 16), which
# is what sees epsilon ×100 — a shift of ε·99/(2·scale) in every element, far below the elementwise
# tolerance when the stream's scale is large (random weights of scale 0.3), but all of one sign.
SMALL_POS = 16


def exported(tmp_path_factory, cfg, name, scale, pos):
    """(the golden file, the exported .onnx) of a random model with ``cfg`` on 2 × ``pos`` tokens."""
    golden_path, directory = saved(tmp_path_factory, cfg, name, scale, pos)
    return golden_path, onnx_model.export(directory, directory.parent / "model.onnx")


def epsilon_times_100(path, out, ln_index):
    model = onnx.load(str(path))
    ln = [n for n in model.graph.node if n.op_type == "LayerNormalization"][ln_index]
    for a in ln.attribute:
        if a.name == "epsilon":
            a.f *= 100
    onnx.save(model, str(out))
    return out


def gelu_in_erf_form(path, out, layer):
    """Replace block ``layer``'s GELU (tanh form, as the exporter wrote it) by x·½(1 + erf(x/√2))."""
    model = onnx.load(str(path))
    graph = model.graph
    names, _ = onnx_model.tensor_names(onnx.load(str(path)).graph, SMALL.n_layers)
    pre, post = names[f"blocks.{layer}.mlp.hook_pre"], names[f"blocks.{layer}.mlp.hook_post"]
    below = {pre}  # hook_pre and the tensors computed from it
    for node in graph.node:
        if below & set(node.input):
            below |= set(node.output)
    below.remove(pre)
    above, inside = {post}, []  # tensors hook_post is computed from
    for node in reversed(graph.node):
        if above & set(node.output):
            above |= set(node.input)
            if set(node.output) & below:
                inside.append(node)
    at = min(list(graph.node).index(n) for n in inside)
    for node in inside:
        graph.node.remove(node)
    graph.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), f"planted.{k}")
                              for k, v in (("inv_sqrt2", 1 / np.sqrt(2)), ("one", 1.0), ("half", 0.5))])
    new = [helper.make_node("Mul", [pre, "planted.inv_sqrt2"], ["planted.a"]),
           helper.make_node("Erf", ["planted.a"], ["planted.b"]),
           helper.make_node("Add", ["planted.b", "planted.one"], ["planted.c"]),
           helper.make_node("Mul", [pre, "planted.c"], ["planted.d"]),
           helper.make_node("Mul", ["planted.d", "planted.half"], [post])]
    for i, node in enumerate(new):
        graph.node.insert(at + i, node)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out
