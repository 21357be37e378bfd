"""GPT-2 as an ONNX graph: run on a golden's tokens, every intermediate under refgpt's names.

    refgpt compare golden.safetensors model.onnx                      # ONNX Runtime
    refgpt compare golden.safetensors model.onnx --runtime tinygrad   # tinygrad runs the same graph

**Making the graph** (``export``): the ONNX file is torch.onnx's export (``dynamo=True``, opset 18)
of the Hugging Face GPT2LMHeadModel that ``refgpt.save`` writes, loaded by transformers itself —
the exporter's graph, never a hand-written copy. Eager attention is asked for, so scores and
pattern are tensors of the graph rather than one fused kernel; batch and position are dynamic.

**Finding GPT-2 in a graph** (``tensor_names``). The exporter names tensors after its own ops
(``layer_norm_3``, ``addmm_2``, ``softmax_1``), so names say nothing; the graph's structure does:

- the ``LayerNormalization`` nodes (opset ≥ 17), in graph order, are ln1, ln2 of each block and
  then ln_final — a GPT-2 of L layers has 2L + 1 of them. Each one's input is the residual stream
  (``hook_resid_pre``, ``hook_resid_mid``, the last block's ``hook_resid_post``) and its output
  ``….out``. Its optional ``Mean`` and ``InvStdDev`` outputs are LayerNorm's statistics: refgpt
  adds them to the node when the exporter left them off and reads ``hook_mean`` and
  ``hook_scale`` = 1 / InvStdDev (computed in float64 from the float32 InvStdDev: one more
  rounding of 2⁻⁵³, far below the float32 tolerance);
- the residual ``Add`` feeding ln2 adds ``hook_attn_out`` to ``hook_resid_pre``; the one feeding
  the next LayerNorm adds ``hook_mlp_out`` to ``hook_resid_mid``;
- the first residual stream is the sum of two ``Gather``s: the one indexed by the token ids is
  ``hook_embed``, the other ``hook_pos_embed`` (broadcast over the batch, as computed);
- the ``Softmax`` nodes, in order, are each block's attention: output ``hook_pattern``, input
  the masked scores ``hook_attn_scores`` (judged on the causal part only); the ``MatMul`` of the
  scores takes q and kᵀ through ``Transpose``s of ``[batch, pos, head, d_head]`` views, which are
  ``hook_q`` and ``hook_k``; the ``MatMul`` of the pattern takes ``hook_v`` the same way, and its
  output transposed back is ``hook_z``;
- the MLP's input projection (``Gemm``, or ``MatMul`` + bias ``Add``) of ln2's output gives
  ``mlp.hook_pre``; the output projection's input is ``mlp.hook_post``;
- the graph output ``logits``.

What is not found is left unjudged, and the report's notes say so: ``hook_normalized`` (ONNX's
LayerNormalization never exposes x̂), and any piece a graph computes another way (a scale folded
into q before the MatMul, a fused attention op). Each tensor found is promoted to a graph output;
ONNX Runtime runs with its default optimizations, which keep every graph output.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from . import RUNTIMES as _ALL
from .extras import require

RUNTIMES = tuple(r for r, runs in _ALL.items() if runs == ".onnx")
OPSET = 18

#: The statistics refgpt adds to a LayerNormalization node the exporter left them off.
_MEAN, _INV_STD = "{}.refgpt_mean", "{}.refgpt_inv_std_dev"
_RESHAPES = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast")


def export(checkpoint, path, tokens=None, padded=False) -> Path:
    """torch.onnx's export of the HF GPT2LMHeadModel in ``checkpoint`` (a directory ``refgpt.save``
    wrote) to ``path``, float32, batch and position dynamic. ``tokens`` [batch, pos]: the example
    input the exporter traces (default: 2 × 3 zeros). ``padded``: the graph also takes
    ``attention_mask`` and ``position_ids`` (HF's forward arguments), so a padded golden's rows run."""
    from ..files.atomic_write import write_atomically

    torch = require("torch", "onnx", "exporting ONNX")
    transformers = require("transformers", "onnx", "exporting ONNX")
    require("onnxscript", "onnx", "exporting ONNX")
    checkpoint, path = as_path(checkpoint, "checkpoint"), as_path(path, "ONNX path")
    hf = transformers.GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager",
                                                      dtype=torch.float32).eval()
    hf.config.use_cache = False  # the exporter cannot return a DynamicCache
    example = torch.as_tensor(np.zeros((2, 3), np.int64) if tokens is None else np.asarray(tokens, np.int64))
    dynamic = {0: "batch", 1: "pos"}
    kwargs = {"attention_mask": torch.ones_like(example),
              "position_ids": torch.arange(example.shape[1]).expand(example.shape).clone()} if padded else {}
    with torch.no_grad():
        program = torch.onnx.export(hf, (example,), kwargs=kwargs, dynamo=True, opset_version=OPSET,
                                    input_names=["input_ids", *kwargs], output_names=["logits"],
                                    dynamic_shapes={"input_ids": dynamic, **{k: dynamic for k in kwargs}},
                                    verbose=False)
    return write_atomically(path, lambda tmp: program.save(str(tmp)))


def load(path):
    """The ONNX model in ``path`` (weights inside the file or beside it), checked."""
    onnx = require("onnx", "onnx", "an .onnx candidate")
    path = as_path(path, "ONNX file")
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as error:  # noqa: BLE001 - onnx raises many kinds; each is one line here
        raise RefGPTError(f"{path}: not a readable ONNX model ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else 'unreadable'})") from None
    return model


class _Graph:
    """Who produces and who consumes each tensor of an ONNX graph."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.constants = {i.name for i in graph.initializer} | {
            out for node in graph.node if node.op_type == "Constant" for out in node.output}
        self.inputs = {i.name for i in graph.input} - self.constants

    def made_by(self, name, *ops):
        node = self.producer.get(name)
        return node if node is not None and node.op_type in ops else None

    def back(self, name):
        """Back through reshapes and casts to the tensor they were made from."""
        while (node := self.made_by(name, *_RESHAPES)) is not None:
            name = node.input[0]
        return name

    def forward(self, name):
        """Forward through a reshape that is a tensor's only consumer."""
        while len(self.consumers[name]) == 1 and self.consumers[name][0].op_type in _RESHAPES:
            name = self.consumers[name][0].output[0]
        return name

    def is_constant(self, name):
        return name in self.constants or name == ""

    def linear_input(self, name):
        """x of y = x·W + b (Gemm, or MatMul then Add of a constant), y given: None if not one."""
        name = self.back(name)
        node = self.made_by(name, "Gemm", "Add")
        if node is not None and node.op_type == "Add":
            data = [x for x in node.input if not self.is_constant(x)]
            node = self.made_by(self.back(data[0]), "MatMul") if len(data) == 1 else None
        return self.back(node.input[0]) if node is not None else None

    def linear_output(self, name):
        """y of y = x·W + b, x given: None if x feeds no single projection."""
        name = self.forward(name)
        users = [n for n in self.consumers[name] if n.op_type in ("Gemm", "MatMul")]
        if len(users) != 1:
            return None
        out = users[0].output[0]
        if users[0].op_type == "MatMul":
            adds = [n for n in self.consumers[self.forward(out)] if n.op_type == "Add"]
            if len(adds) == 1 and any(self.is_constant(x) for x in adds[0].input):
                out = adds[0].output[0]
        return self.forward(out)

    def before_transpose(self, name):
        """The [batch, pos, head, d_head] view a Transpose made ``name`` from, or None."""
        node = self.made_by(name, "Transpose")
        return node.input[0] if node is not None else None

    def input_reached(self, name, depth=8):
        """The graph input ``name`` is computed from along first inputs (a few ops back), or None."""
        for _ in range(depth):
            if name in self.inputs:
                return name
            node = self.producer.get(name)
            if node is None or not node.input:
                return None
            name = node.input[0]
        return None


def tensor_names(graph, n_layers: int) -> tuple[dict[str, str], list[str]]:
    """refgpt name → the graph's tensor name, for every GPT-2 tensor found in ``graph`` (an
    onnx GraphProto of a GPT-2 of ``n_layers`` blocks), and notes on what was not found. Adds
    ``Mean`` and ``InvStdDev`` outputs to LayerNormalization nodes that lack them (``graph`` is
    changed)."""
    lns = [n for n in graph.node if n.op_type == "LayerNormalization"]
    if len(lns) != 2 * n_layers + 1:
        raise RefGPTError(f"the ONNX graph has {len(lns)} LayerNormalization nodes; a GPT-2 of {n_layers} layers "
                          f"(the golden's) has {2 * n_layers + 1}, ln1 and ln2 of each block and ln_final "
                          f"(an export at opset < 17 spells LayerNorm out in small ops: export at opset ≥ 17)")
    names, notes = {}, []
    for i, node in enumerate(lns):
        while len(node.output) < 3:
            node.output.append("")
        for slot, pattern in ((1, _MEAN), (2, _INV_STD)):
            if not node.output[slot]:
                node.output[slot] = pattern.format(node.output[0])
        ln = "ln_final" if i == 2 * n_layers else f"blocks.{i // 2}.ln{1 + i % 2}"
        names.update({f"{ln}.out": node.output[0], f"{ln}.hook_mean": node.output[1],
                      f"{ln}.inv_std_dev": node.output[2]})
        stream = ("ln_final" if i == 2 * n_layers else
                  f"blocks.{i // 2}.hook_resid_{'pre' if i % 2 == 0 else 'mid'}")
        names[f"blocks.{n_layers - 1}.hook_resid_post" if stream == "ln_final" else stream] = node.input[0]
    for layer in range(n_layers - 1):  # a block's output is the next block's input: one tensor
        names[f"blocks.{layer}.hook_resid_post"] = names[f"blocks.{layer + 1}.hook_resid_pre"]
    g = _Graph(graph)
    for layer in range(n_layers):
        _residual_branch(g, names, f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.hook_resid_pre",
                         f"blocks.{layer}.hook_attn_out")
        after = f"blocks.{layer + 1}.hook_resid_pre" if layer + 1 < n_layers else f"blocks.{layer}.hook_resid_post"
        _residual_branch(g, names, after, f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.hook_mlp_out")
        _mlp(g, names, layer)
    _embeddings(g, names)
    softmaxes = [n for n in graph.node if n.op_type == "Softmax"]
    if len(softmaxes) == n_layers:
        for layer, node in enumerate(softmaxes):
            _attention(g, names, layer, node)
    else:
        notes.append(f"the graph has {len(softmaxes)} Softmax nodes, not one per block ({n_layers}): attention's "
                     f"scores, pattern, q, k, v and z are not judged")
    outputs = [o.name for o in graph.output]
    names["logits"] = "logits" if "logits" in outputs else outputs[0]
    return names, notes


def _residual_branch(g, names, total, stream, branch):
    """``total`` = ``stream`` + ``branch``: name the branch (the Add's other input)."""
    node = g.made_by(names[total], "Add")
    if node is not None and names[stream] in node.input and len(node.input) == 2:
        names[branch] = node.input[1 - list(node.input).index(names[stream])]


def _mlp(g, names, layer):
    b = f"blocks.{layer}"
    pre = g.linear_output(names[f"{b}.ln2.out"])
    if pre is not None:
        names[f"{b}.mlp.hook_pre"] = pre
    if f"{b}.hook_mlp_out" in names:
        post = g.linear_input(names[f"{b}.hook_mlp_out"])
        if post is not None:
            names[f"{b}.mlp.hook_post"] = post


def _embeddings(g, names):
    node = g.made_by(names["blocks.0.hook_resid_pre"], "Add")
    gathers = [g.made_by(g.back(x), "Gather") for x in node.input] if node is not None else []
    if len(gathers) == 2 and all(gathers):
        by_tokens = [g.input_reached(x.input[1]) not in (None, "attention_mask", "position_ids") for x in gathers]
        if by_tokens.count(True) == 1:
            names["hook_embed"] = node.input[by_tokens.index(True)]
            names["hook_pos_embed"] = node.input[by_tokens.index(False)]


def _attention(g, names, layer, softmax):
    a = f"blocks.{layer}.attn"
    names[f"{a}.hook_pattern"], names[f"{a}.hook_attn_scores"] = softmax.output[0], softmax.input[0]
    x, node = softmax.input[0], None
    for _ in range(4):  # back through the mask's Add and the scale's Mul/Div to QKᵀ
        node = g.producer.get(x)
        if node is None or node.op_type == "MatMul":
            break
        data = [i for i in node.input if not g.is_constant(i)] if node.op_type in ("Add", "Mul", "Div", "Where") else []
        x = data[0] if node.op_type != "Where" else (node.input[1] if len(node.input) == 3 else "")
    if node is not None and node.op_type == "MatMul":
        for name, t in (("hook_q", node.input[0]), ("hook_k", node.input[1])):
            view = g.before_transpose(t)
            if view is not None:
                names[f"{a}.{name}"] = view
    users = [n for n in g.consumers[softmax.output[0]] if n.op_type == "MatMul"]
    if len(users) == 1:
        v = g.before_transpose(users[0].input[1])
        if v is not None:
            names[f"{a}.hook_v"] = v
        back = [n for n in g.consumers[users[0].output[0]] if n.op_type == "Transpose"]
        if len(back) == 1:
            names[f"{a}.hook_z"] = back[0].output[0]


def _promoted(model, names):
    """A copy of ``model`` whose graph outputs every tensor in ``names``."""
    onnx = require("onnx", "onnx", "an .onnx candidate")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names.values()):
        if name not in have:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
    return out


def _feeds(g, tokens, attention_mask=None, position_ids=None):
    """The graph's inputs: the token ids, and where it takes them the attention mask (default all 1)
    and the positions (default 0, 1, …); a mask or positions the graph has no input for are refused."""
    tokens = np.asarray(tokens, np.int64)  # [batch, pos]
    for name, given in (("attention_mask", attention_mask), ("position_ids", position_ids)):
        if given is not None and name not in g.inputs:
            raise RefGPTError(f"the ONNX graph has no {name} input: a padded golden's rows need the graph fed their "
                              f"attention_mask and position_ids (export it with those inputs)")
    feeds = {}
    for name in sorted(g.inputs):
        if name == "attention_mask":
            feeds[name] = np.ones_like(tokens) if attention_mask is None else np.asarray(attention_mask, np.int64)
        elif name == "position_ids":
            feeds[name] = (np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape).copy() if position_ids is None
                           else np.asarray(position_ids, np.int64))
        elif name in ("input_ids",) or len(g.inputs) == 1:
            feeds[name] = tokens
        else:
            raise RefGPTError(f"the ONNX graph has an input {name!r} refgpt cannot fill; it feeds input_ids "
                              f"(and attention_mask, position_ids)")
    return feeds


def _run_onnxruntime(model, feeds, wanted):
    ort = require("onnxruntime", "onnx", "running an .onnx candidate on ONNX Runtime")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(wanted, session.run(wanted, feeds)))


def _run_tinygrad(model, feeds, wanted):
    require("tinygrad", "tinygrad", "running an .onnx candidate on tinygrad")
    runner = require("tinygrad.nn.onnx", "tinygrad", "running an .onnx candidate on tinygrad")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="refgpt-tinygrad-") as where:  # its parser reads a file
        path = Path(where) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        out = runner.OnnxRunner(path)(dict(feeds))
        return {name: out[name].numpy() for name in wanted}


def capture(path, tokens, n_layers: int, runtime: str = "onnxruntime", attention_mask=None,
            position_ids=None) -> tuple[dict[str, np.ndarray], list[str]]:
    """Run the ONNX GPT-2 in ``path`` on ``tokens`` [batch, pos] with ``runtime`` (onnxruntime or
    tinygrad), fed ``attention_mask`` and ``position_ids`` [batch, pos] when given (a padded golden's;
    the graph must take them): (every tensor found, under refgpt's names and the golden's shapes; notes)."""
    if runtime not in RUNTIMES:
        raise RefGPTError(f"unknown runtime {runtime!r} for an ONNX file; choose one of {', '.join(RUNTIMES)}")
    model = load(path)
    names, notes = tensor_names(model.graph, n_layers)
    promoted = _promoted(model, names)
    feeds = _feeds(_Graph(promoted.graph), tokens, attention_mask, position_ids)
    wanted = list(dict.fromkeys(names.values()))
    run = _run_onnxruntime if runtime == "onnxruntime" else _run_tinygrad
    try:
        values = run(promoted, feeds, wanted)
    except RefGPTError:
        raise
    except Exception as error:  # noqa: BLE001 - the runtime's own failure, in one line
        raise RefGPTError(f"{path}: {runtime} failed to run the graph ({type(error).__name__}: "
                          f"{str(error).splitlines()[0][:300] if str(error) else ''})") from None
    return as_refgpt(values, names, tokens), notes + NOTES


#: What no ONNX graph of GPT-2 gives, said in every report.
NOTES = ["ONNX's LayerNormalization exposes no x̂: the hook_normalized tensors are not judged"]


def as_refgpt(values: dict, names: dict, tokens) -> dict[str, np.ndarray]:
    """The graph's tensors ``values`` (ONNX name → array) under refgpt's names (``names`` from
    ``tensor_names``) and the golden's shapes, with the ``tokens`` they ran on; 1 / InvStdDev is
    ``hook_scale``. A name the run did not give is left out (unjudged)."""
    batch, pos = np.shape(tokens)
    captured = {"tokens": np.asarray(tokens, np.int64)}  # [batch, pos]
    for name, onnx_name in names.items():
        if onnx_name not in values:
            continue
        x = np.asarray(values[onnx_name])
        if name.endswith(".inv_std_dev"):
            name, x = name.replace(".inv_std_dev", ".hook_scale"), 1.0 / x.astype(np.float64)  # [batch, pos, 1]
        captured[name] = _as_golden_shape(name, x, batch, pos)
    return captured


def _as_golden_shape(name, x, batch, pos):
    """[batch·pos, …] → [batch, pos, …]; [1, pos, d] → [batch, pos, d] (the position embedding)."""
    if x.ndim >= 1 and x.shape[0] == batch * pos and name.split(".")[-1] not in ("hook_pattern", "hook_attn_scores"):
        if x.ndim == 2 or (x.ndim >= 2 and x.shape[1] != pos):
            x = x.reshape(batch, pos, *x.shape[1:])
    if name == "hook_pos_embed" and x.ndim == 3 and x.shape[0] == 1 and batch != 1:
        x = np.broadcast_to(x, (batch, *x.shape[1:]))  # [batch, pos, d_model]
    return x


def in_graph_names(golden_tensors: dict, names: dict, graph) -> dict[str, np.ndarray]:
    """The inverse of ``as_refgpt``: a golden's tensors under the graph's names and in the graph's
    shapes (its value_info's rank: [batch·pos, …] where the graph flattens, [1, pos, d] for the
    position embedding), for every tensor the graph itself computes. The LayerNorm statistics
    refgpt adds to a node are not the graph's own tensors and are left out, and so are attention's
    masked scores: refgpt's are −∞ where a graph adds its own large negative constant, so a
    tool that compares every element (Polygraphy) would flag the mask, not GPT-2's numbers."""
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in list(graph.value_info) + list(graph.output)
            if v.type.tensor_type.HasField("shape")}
    out = {}
    for name, onnx_name in names.items():
        if (name not in golden_tensors or onnx_name.endswith((".refgpt_mean", ".refgpt_inv_std_dev"))
                or name.endswith("hook_attn_scores")):
            continue
        x = np.asarray(golden_tensors[name])
        want = rank.get(onnx_name, x.ndim)
        if want == x.ndim - 1:
            x = x.reshape(-1, *x.shape[2:])  # [batch·pos, …]
        if name == "hook_pos_embed":
            x = x[:1]  # [1, pos, d_model]: the graph computes it once for every row
        out[onnx_name] = x
    return out
