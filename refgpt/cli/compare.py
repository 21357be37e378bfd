"""``refgpt compare``: where does a candidate's forward pass leave the reference's?

    refgpt compare golden.safetensors mine.safetensors              # profile from mine's dtype
    refgpt compare golden.safetensors hf.safetensors --map hf --profile float32
    refgpt compare golden.safetensors acts.bin --map llmc --json

Prints a table of every tensor in forward order (a decode golden's step by step), then every
gradient in backward order (max abs
and relative error, the largest error over its tolerance, the mean signed error over the bias
bound, the share of elements out of tolerance; the golden's own error when it is certified) and
names the first tensor out of tolerance. A ``.bin`` candidate with ``--map llmc`` is llm.c's: a raw
acts_memory dump, refgpt's llm.c dump (tokens, activations and gradients), or a debug state; a
directory with ``--map llmc`` holds llm.c-style per-step dumps of a decode (step0.bin, …). ``--names
GLOB`` and ``--failing`` filter the table (not the verdict); ``--judge-pads`` judges a padded
golden's pads; ``--forward-only`` lets a golden without gradients judge a candidate with them.
A CANDIDATE that is an ``.onnx`` file is a model, not a dump: refgpt runs it on the golden's tokens
(``--runtime onnxruntime``, the default, or ``tinygrad``), captures every intermediate the graph
computes under refgpt's names (refgpt/runtimes/onnx_model.py) and judges those; a CTranslate2
model directory with ``--runtime ctranslate2`` gives its logits, an HF directory with ``--runtime mlx``
mlx-lm's GPT-2's module outputs, and with ``--runtime transformer-lens`` TransformerLens 4's bridge
every hook it caches (refgpt/runtimes/tl_bridge.py). A decode golden's steps are run as passes over
the sequence so far (refgpt/runtimes/steps.py); a padded golden's rows only on a graph fed
attention_mask and position_ids. ``--local`` walks the captured tensors and names the ops the
runtime hides. ``--save FILE`` keeps the captured
tensors as a safetensors file under refgpt's names. ``--map onnx --onnx model.onnx``: a candidate
keyed by that graph's tensor names (a Polygraphy RunResults .json).
Exit status 0 when everything is within tolerance, 1 otherwise.

A quantized port (refgpt/oracle/quantized.py): REFERENCE is the golden of the quantized file
(``refgpt golden --model m.Q4_0.gguf``), ``--float-golden`` the float checkpoint's, ``--gguf`` the
file itself; the table gives per tensor the quantization error and the implementation error (NMSE,
SNR) and every matrix product's verdict on the candidate's own input; exit 0 when every product
is within its bound.
"""

from __future__ import annotations

import json

import numpy as np

from .. import strict_json
from ..errors import RefGPTError
from ..files.checkpoint import load
from ..oracle import comparison as oracle
from ..oracle import golden as golden_file
from ..oracle import local
from ..oracle.name_maps import MAPS
from ..runtimes import RUNTIMES  # names only: each runtime is imported when run
from ._arguments import non_negative_float
from ._chosen_model import add_subcommand


USES = ("--json",)  # it runs no model: REFERENCE holds everything the comparison needs (--local-model: its own)

EXAMPLES = (
    'refgpt golden "To be, or not to" -o golden.safetensors',
    'refgpt golden "To be, or not to" -o mine.safetensors --dtype float32     # a stand-in for your port\'s tensors',
    'refgpt compare golden.safetensors mine.safetensors     # tolerances from mine\'s dtype, float32',
    'refgpt compare golden.safetensors mine.safetensors --profile bfloat16 --json',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "compare", run, uses=USES, help="compare a candidate's activations with a golden file",
                       description="Compare CANDIDATE's tensors with REFERENCE's (a golden file) and name the first "
                       "tensor out of tolerance. Exit status 0 if all are within tolerance, 1 if not.",
                       examples=EXAMPLES)
    p.add_argument("reference", metavar="REFERENCE", help="golden file written by `refgpt golden`")
    p.add_argument("candidate", metavar="CANDIDATE", help=".safetensors or .npz (or an llm.c .bin with --map llmc: "
                   "acts_memory, refgpt's llm.c dump, or a debug state); or a model, run on the golden's tokens: an "
                   ".onnx file, or a model directory with --runtime")
    p.add_argument("--atol", type=non_negative_float, help="absolute tolerance (with --rtol: |c − r| ≤ atol + rtol·|r|)")
    p.add_argument("--rtol", type=non_negative_float, help="relative tolerance")
    p.add_argument("--profile", choices=sorted(oracle.UNIT_ROUNDOFF),
                   help="tolerances from a format's unit roundoff (default: the candidate's precision)")
    p.add_argument("--map", dest="name_map", choices=(*MAPS, "onnx"), default="refgpt",
                   help="how the candidate names its tensors (default: refgpt/TransformerLens hook names; onnx: "
                        "the tensor names of the graph --onnx FILE, e.g. a Polygraphy RunResults .json)")
    p.add_argument("--onnx", metavar="FILE", help="with --map onnx: the ONNX GPT-2 whose tensor names the candidate uses")
    p.add_argument("--forward-only", action="store_true",
                   help="judge the forward pass alone: a candidate's gradients against a golden made without "
                        "--backward are otherwise a failure")
    p.add_argument("--judge-pads", action="store_true",
                   help="judge a padded golden's pad positions too (by default only real positions must agree)")
    p.add_argument("--names", metavar="GLOB", action="append",
                   help="show only tensors matching this glob (repeatable), e.g. 'step.3.*' or 'grad.blocks.0.*'; "
                        "the verdict is still the whole comparison's")
    p.add_argument("--failing", action="store_true", help="show only tensors out of tolerance")
    p.add_argument("--float-golden", metavar="FLOAT_GOLDEN",
                   help="a quantized port: the float checkpoint's golden (REFERENCE is then the quantized file's, "
                        "made by `refgpt golden` from the GGUF file): split the error into quantization and implementation")
    p.add_argument("--gguf", metavar="FILE", help="with --float-golden: the GGUF file the port ran (its weights and types)")
    p.add_argument("--local", action="store_true",
                   help="also judge every op on the candidate's own inputs (recomputed in float64 with the golden's "
                        "checkpoint) by its rounding bound at the candidate's precision (--profile's), and name the "
                        "first op that introduced an error (docs/oracle.md, \"Local verdicts\")")
    p.add_argument("--local-model", metavar="DIR", help="with --local: the checkpoint the golden was made from "
                   "(checked against its recorded weights_sha256; default: the embedded model, if it is that one)")
    p.add_argument("--local-bound", choices=("worst", "probabilistic"), default="worst",
                   help="with --local: the long sums' bound, worst case (default) or Higham & Mary's "
                        "probabilistic one (exceeded with probability ≤ 1e-9 per sum); the vocabulary's sums "
                        "(log_probs, probs, the loss) are always judged by the probabilistic one")
    p.add_argument("--local-layer-norm", choices=local.LAYER_NORMS, default="two-pass",
                   help="with --local: how the port computes its LayerNorms' mean and variance: two-pass "
                        "(default; TransformerLens's, llm.c's: each statistic judged) or any (torch's nn.LayerNorm, "
                        "HF's: each LayerNorm judged from its input to its output)")
    p.add_argument("--local-kv-cache", choices=local.KV_CACHES, default="kept",
                   help="with --local on a decode golden: how the port keeps its keys and values: kept (default; "
                        "a KV cache, each step's judged as the copy of the step before's with the new keys "
                        "appended) or recomputed (llm.c's loop, recomputing the whole sequence every step: only "
                        "the step's own keys judged as a copy)")
    p.add_argument("--runtime", choices=tuple(RUNTIMES),
                   help="the engine that runs a model CANDIDATE: onnxruntime (the default for an .onnx file) or "
                        "tinygrad for an .onnx file, ctranslate2 for a CTranslate2 model directory, mlx for an HF "
                        "directory mlx-lm loads, transformer-lens for an HF directory TransformerLens 4's bridge "
                        "boots (each its extra; TransformerLens 4 beside 3: REFGPT_TL4_DIR)")
    p.add_argument("--save", metavar="FILE",
                   help="for a model CANDIDATE: keep the tensors it computed, under refgpt's names, "
                        "as a safetensors file")
    return p


def _is_model(args) -> bool:
    return str(args.candidate).endswith(".onnx") or RUNTIMES.get(args.runtime) == "directory"


def _golden(args):
    golden = golden_file.read(args.reference)
    cfg = golden.config
    if cfg is None or "tokens" not in golden.tensors:
        raise RefGPTError(f"{args.reference}: a model candidate runs on the golden's tokens with the golden's "
                          f"config: REFERENCE must be a golden file written by `refgpt golden`")
    return golden


def _run_model(args):
    """Run the model CANDIDATE on the golden's tokens: (the golden, its tensors under refgpt's names,
    notes, and for TransformerLens 4's bridge every group of its names (tl_bridge.groups), else None)."""
    from ..runtimes import ctranslate2_model, mlx_model, onnx_model, steps, tl_bridge

    golden = _golden(args)
    cfg = golden.config
    runtime = args.runtime or "onnxruntime"
    if (RUNTIMES[runtime] == ".onnx") != str(args.candidate).endswith(".onnx"):
        args.usage_error(f"--runtime {runtime} runs {'an .onnx file' if RUNTIMES[runtime] == '.onnx' else 'a model directory'}")
    tokens, mask = golden.tensors["tokens"], golden.tensors.get("attention_mask")
    if mask is not None and RUNTIMES[runtime] != ".onnx":
        raise RefGPTError(f"{args.reference}: a padded golden; --runtime {runtime} is fed the token ids alone, and a "
                          f"padded row needs its attention_mask and position_ids (an ONNX graph with those inputs)")
    ranges = steps.step_ranges(golden.tensors)
    positions = (np.concatenate([golden.tensors[f"step.{S}.position_ids"] for S, _, _ in ranges], axis=1) if ranges
                 else golden.tensors.get("position_ids")) if mask is not None else None  # [batch, pos]

    def run(end=None):  # the pass over the first ``end`` positions: (groups of (name, tensor) dicts, notes)
        cut = (lambda x: x) if end is None else (lambda x: None if x is None else np.asarray(x)[:, :end])
        if runtime == "transformer-lens":
            return tl_bridge.capture(args.candidate, cut(tokens), cfg.n_layers)
        if runtime == "ctranslate2":
            from ..oracle.ctranslate2_file import int8_logits_notes

            captured, notes = ctranslate2_model.capture(args.candidate, cut(tokens))
            notes += int8_logits_notes(args.candidate, captured["logits"])
        elif runtime == "mlx":
            captured, notes = mlx_model.capture(args.candidate, cut(tokens), cfg.n_layers)
        else:
            captured, notes = onnx_model.capture(args.candidate, cut(tokens), cfg.n_layers, runtime,
                                                 attention_mask=cut(mask), position_ids=cut(positions))
        return [{name: (name, value) for name, value in captured.items()}], notes

    grouped, notes = steps.run_steps(run, golden, ranges) if ranges else run()
    captured = {name: value for name, (_, value) in grouped[0].items()}
    if args.save:
        golden_file.write(args.save, golden_file.Golden(captured, {
            "captured_from": str(args.candidate), "runtime": runtime}))
    return golden, captured, notes, grouped if runtime == "transformer-lens" else None


def _onnx_named(args):
    """A candidate keyed by an ONNX graph's tensor names (a Polygraphy RunResults .json, or any
    file compare reads): (the golden, its tensors under refgpt's names, notes)."""
    from ..runtimes import onnx_model, polygraphy_json

    golden = _golden(args)
    if str(args.candidate).endswith(".json"):
        values = polygraphy_json.read(args.candidate)
    else:
        values = oracle.load(args.candidate)[0]
    names, notes = onnx_model.tensor_names(onnx_model.load(args.onnx).graph, golden.config.n_layers)
    notes += onnx_model.NOTES + ["--map onnx: the candidate is taken to have run on the golden's tokens"]
    return golden, onnx_model.as_refgpt(values, names, golden.tensors["tokens"]), notes


def run(args) -> int:
    if (args.float_golden is None) != (args.gguf is None):
        args.usage_error("--float-golden and --gguf go together (a quantized port: both goldens and its file)")
    if args.float_golden is not None:
        return _run_quantized(args)
    if args.profile is not None and (args.atol is not None or args.rtol is not None):
        args.usage_error("give either --profile or --atol/--rtol, not both")
    if args.json and (args.names or args.failing):  # refused, not ignored: the JSON holds every tensor
        args.usage_error("--names and --failing filter the table; --json gives every tensor (filter it there)")
    if not args.local and (args.local_model is not None or args.local_bound != "worst"):
        args.usage_error("--local-model and --local-bound go with --local")
    if not args.local and (args.local_layer_norm != "two-pass" or args.local_kv_cache != "kept"):
        args.usage_error("--local-layer-norm and --local-kv-cache go with --local")
    if (args.runtime or args.save) and args.name_map == "onnx":
        args.usage_error("--runtime and --save run a model CANDIDATE; with --map onnx the candidate holds tensors "
                         "already computed (a Polygraphy RunResults .json), keyed by --onnx's graph")
    if (args.runtime or args.save) and not _is_model(args):
        args.usage_error("--runtime and --save are for a model CANDIDATE (an .onnx file, or a model directory "
                         "with --runtime)")
    if (args.name_map == "onnx") != (args.onnx is not None):
        args.usage_error("--map onnx and --onnx FILE go together: the graph names the candidate's tensors")
    reference, candidate, notes, grouped = args.reference, args.candidate, [], None
    if args.name_map == "onnx":
        reference, candidate, notes = _onnx_named(args)
    elif _is_model(args):
        if args.name_map != "refgpt":
            args.usage_error("--map names a dump's tensors; a model candidate's are named by refgpt")
        reference, candidate, notes, grouped = _run_model(args)
    options = dict(atol=args.atol, rtol=args.rtol, profile=args.profile, forward_only=args.forward_only,
                   judge_pads=args.judge_pads)
    if grouped is not None:  # TransformerLens 4's bridge: every name it caches, each judged
        report = oracle.compare_groups(reference, grouped, **options)
    else:
        report = oracle.compare(reference, candidate, name_map="refgpt" if args.name_map == "onnx" else args.name_map,
                                **options)
    report.notes[:0] = notes
    if not args.local:
        print(report.to_json() if args.json else report.table(names=args.names, failing=args.failing))
        return 0 if report.ok else 1
    verdicts, skipped = local.judge_files(args.reference, candidate, _local_model(args),
                                          "refgpt" if args.name_map == "onnx" else args.name_map,
                                          args.profile, args.local_bound, args.forward_only, args.local_layer_norm,
                                          args.local_kv_cache)
    if args.json:
        answer = json.loads(report.to_json())
        verdict = {"skipped": skipped, "local_first": None} if verdicts is None else verdicts.as_dict()
        answer["local_first"] = verdict.pop("local_first")
        answer["local"] = verdict  # {"precision", "ops"}, or {"skipped": the one line}
        print(strict_json.dumps(answer, indent=1, default=str))  # an exact op's SNR is ∞: "inf", not Infinity
    else:
        print(report.table(names=args.names, failing=args.failing))
        failing = {t.name for t in report.tensors if not t.ok}
        print(skipped if verdicts is None else local.format_local(verdicts, out_of_tolerance=failing))
        if verdicts is not None and candidate is not args.candidate:  # a model, or --map onnx: what it hides
            print(_hidden(verdicts))
    return 0 if report.ok and (verdicts is None or verdicts.first is None) else 1


def _hidden(verdicts) -> str:
    """One line: the ops a model candidate's runtime left unjudged locally, because it hides their
    output or their inputs (docs/oracle.md, each runtime's section)."""
    ops: dict[str, int] = {}
    for v in verdicts.ops:
        if v.skipped:
            ops[v.op] = ops.get(v.op, 0) + 1
    if not ops:
        return "local verdicts: every op judged (the runtime exposes each op's inputs and output)"
    return (f"local verdicts: {sum(ops.values())} ops skipped, their output or inputs hidden by the runtime: "
            + ", ".join(f"{op} ×{n}" for op, n in ops.items()))


def _local_model(args):
    """--local-model's checkpoint in float64; without it the embedded model, if the golden was made
    from it (its recorded weights_sha256); else None."""
    if args.local_model is not None:
        return load(args.local_model, dtype="float64", tokenizer=False)
    return local.embedded_if_recorded(args.reference)


def _run_quantized(args) -> int:
    if args.atol is not None or args.rtol is not None or args.profile or args.name_map != "refgpt" or args.names \
            or args.failing or args.judge_pads or args.forward_only or args.local or args.local_model is not None \
            or args.local_bound != "worst" or args.local_layer_norm != "two-pass" or args.local_kv_cache != "kept" \
            or args.runtime or args.save or args.onnx:
        args.usage_error("with --float-golden only --gguf and --json apply: the bounds are derived per product")
    from ..oracle.quantized import format_split, split

    report = split(args.float_golden, args.reference, args.candidate, load(args.gguf, tokenizer=False))
    if args.json:
        print(strict_json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print(format_split(report))
    return 0 if report.ok else 1
