"""``refgpt sweep PROMPTS --task TASK -o OUT``: one task over a corpus, serially or on Dask.

    refgpt sweep prompts.txt --task loss -o out/                        # a LocalCluster sized to the machine
    refgpt sweep prompts.jsonl --task golden --backward -o goldens/ --model gpt2 --workers 4
    refgpt sweep prompts.txt --task lens --translators lens.safetensors -o lens/ --scheduler tcp://10.0.0.1:8786
    refgpt sweep prompts.txt --task compare --candidates mine/ -o verdicts/ --workers 0   # in this process

What each task computes, OUT's layout, resumption and the cluster are refgpt.sweep's
(refgpt/sweep/driver.py; docs/sweep.md). This module reads the options, runs the sweep and
prints what it found: the counts, then the task's summary in brief (all of it is OUT/summary.json).
Exit status 0 when every prompt has its record and (compare) every candidate is within tolerance;
1 when a prompt failed (their count, and the first error; every error is in OUT/manifest.jsonl) or
a candidate is out of tolerance; 130 after Ctrl-C, which leaves only complete records: run the
same command again to go on.
"""

from __future__ import annotations

import sys

from .. import strict_json
from ..errors import RefGPTError, one_line, size_shown
from ..sweep.driver import run_sweep
from ..sweep.prompts import FORMATS
from ..sweep.registry import TASKS
from ..analysis.attribution import GRANULARITIES
from ..oracle.comparison import UNIT_ROUNDOFF
from ..oracle.name_maps import MAPS
from ._arguments import add_token_argument, count, non_negative_float, positive_int
from ._chosen_model import add_subcommand, is_llmc_checkpoint
from ._table import table

DESCRIPTION = """\
Run one task over every prompt of PROMPTS (a text file, one prompt per line; or JSON Lines,
{"id": …, "text": …} or {"id": …, "tokens": […]}) and write one record per prompt, a manifest and
a summary to OUT. By default on a Dask LocalCluster sized to this machine (the `dask` extra);
--workers 0 runs in this process. A re-run skips the prompts already recorded; summary.json is
the same bytes whatever the number of workers. See docs/sweep.md.

tasks:
  golden     one golden file per prompt (--backward: with every gradient)
  compare    each prompt's candidate file in --candidates DIR against the reference: a verdict per
             prompt, and which tensors fail first, how often
  lens       per-layer KL, cross-entropy and entropy of the logit lens (and --translators lenses)
  attribute  exact logit attribution per layer/head/neuron: of --target at --pos, or of each
             position's next token; means over the corpus
  loss       the loss of every next token
"""

USES = ("--model", "--dtype", "--json", "--bos")  # --bos: before each text prompt (there is no TEXT)

EXAMPLES = (
    "refgpt sweep prompts.txt --task loss -o loss     # a LocalCluster sized to this machine",
    "refgpt sweep prompts.txt --task golden -o goldens --workers 0     # in this process, no Dask",
    "refgpt sweep prompts.txt --task compare --candidates goldens/goldens -o verdicts --workers 0",
    "refgpt sweep prompts.txt --task lens --translators lens.safetensors -o lens --workers 0 --json",
)

#: option (argparse dest) → the tasks it belongs to, and its flag as the user typed it
TASK_OPTIONS = {
    "backward": (("golden", "compare"), "--backward"), "names": (("golden",), "--names"),
    "candidates": (("compare",), "--candidates"), "name_map": (("compare",), "--map"),
    "profile": (("compare",), "--profile"), "atol": (("compare",), "--atol"), "rtol": (("compare",), "--rtol"),
    "translators": (("lens",), "--translators"), "lens": (("lens",), "--lens"),
    "target": (("attribute",), "--target"), "target_id": (("attribute",), "--target-id"),
    "against": (("attribute",), "--against"), "against_id": (("attribute",), "--against-id"),
    "pos": (("attribute",), "--pos"), "granularity": (("attribute",), "--granularity"),
}


def add_parser(subparsers):
    p = add_subcommand(subparsers, "sweep", run, uses=USES, optional_text=None, examples=EXAMPLES,
                       help="one task over a corpus of prompts, on Dask or serially", description=DESCRIPTION)
    p.add_argument("prompts", metavar="PROMPTS", help="text (one prompt per line) or JSON Lines (.jsonl)")
    p.add_argument("--task", required=True, choices=list(TASKS), help="what to compute per prompt")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="the directory for records, manifest, summary")
    p.add_argument("--format", choices=FORMATS, help="how to read PROMPTS (default: jsonl for .jsonl/.ndjson, else text)")
    where = p.add_argument_group("where it runs")
    where.add_argument("--workers", type=count, metavar="N", help="worker processes of a LocalCluster on this machine "
                       "(default: one per core, as memory allows); 0: serially, in this process, without Dask")
    where.add_argument("--scheduler", metavar="ADDR", help="the address of a running Dask scheduler "
                       "(tcp://HOST:8786; docs/sweep.md) instead of a LocalCluster")
    where.add_argument("--batch-size", type=positive_int, metavar="N",
                       help="prompts per Dask task (default: about 4 tasks per worker, at most 16 prompts)")
    where.add_argument("--blas-threads", type=positive_int, metavar="N",
                       help="BLAS threads per worker (default on a LocalCluster: cores / workers)")
    g = p.add_argument_group("golden and compare")
    g.add_argument("--backward", action="store_true", default=None, help="also every gradient")
    g.add_argument("--names", metavar="PATTERN", action="append", help="golden: keep only tensors matching this glob")
    g.add_argument("--candidates", metavar="DIR", help="compare: the candidates, one file per prompt "
                   "(ID.HASH.safetensors as --task golden names them, or ID.safetensors / ID.npz)")
    g.add_argument("--map", dest="name_map", choices=MAPS, help="compare: how the candidates name their tensors")
    g.add_argument("--profile", choices=sorted(UNIT_ROUNDOFF), help="compare: tolerances of this format")
    g.add_argument("--atol", type=non_negative_float, help="compare: absolute tolerance")
    g.add_argument("--rtol", type=non_negative_float, help="compare: relative tolerance")
    lens = p.add_argument_group("lens")
    lens.add_argument("--translators", metavar="FILE", action="append",
                      help="also the lens of these translators: a lens directory (config.json + params.pt, as the "
                           "tuned-lens package and refgpt train-lens write it) or a .safetensors/.pt translator file "
                           "(repeatable)")
    lens.add_argument("--lens", metavar="MODULE:FUNCTION[=PATH]", action="append",
                      help="also a plug-in lens: FUNCTION(PATH, model) returns it (refgpt/sweep/task_lens.py; repeatable)")
    a = p.add_argument_group("attribute")
    add_token_argument(a, "target", "attribute this token's logit at --pos (default: each next token)")
    add_token_argument(a, "against", "attribute target − against")
    a.add_argument("--pos", type=int, help="with --target: the position (default -1, the last)")
    a.add_argument("--granularity", choices=GRANULARITIES, help="components: per layer (default), head or neuron")


def task_options(args) -> dict:
    """The task's options from the flags given; a flag of another task is a usage error."""
    options = {}
    for dest, (tasks, flag) in TASK_OPTIONS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if args.task not in tasks:
            args.usage_error(f"{flag} goes with --task {' or '.join(tasks)}, not --task {args.task}")
        options[dest] = value
    for name in ("target", "against"):
        text, number = options.pop(name, None), options.pop(f"{name}_id", None)
        if text is not None and number is not None:
            args.usage_error(f"give --{name} or --{name}-id, not both")
        if text is not None and text.startswith("#") and len(text) > 1:
            if not text[1:].isdigit():
                raise RefGPTError(f"--{name}: {text!r} is not #ID with an integer ID")
            number, text = int(text[1:]), None
        if text is not None or number is not None:
            options[name] = text if text is not None else number
    lenses = [{"translators": t} for t in options.pop("translators", None) or []]
    for spec in options.pop("lens", None) or []:
        factory, _, path = spec.partition("=")
        lenses.append({"factory": factory, "path": path or None})
    if lenses:
        options["lenses"] = lenses
    return options


def run(args) -> int:
    options = task_options(args)
    if args.model is not None:
        is_llmc_checkpoint(args.model)  # a file is refused here, as in every subcommand: never a hub name
    try:
        result = run_sweep(args.prompts, args.task, args.output, options=options, model=args.model, dtype=args.dtype,
                           bos=args.bos, workers=args.workers, scheduler=args.scheduler, batch_size=args.batch_size,
                           blas_threads=args.blas_threads, prompts_format=args.format)
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in ("dask", "distributed", "threadpoolctl"):
            raise RefGPTError(f"refgpt sweep on Dask needs the dask extra: pip install 'refgpt[dask]' ({error.name} "
                              "is missing); --workers 0 runs in this process without it") from None
        raise
    except KeyboardInterrupt:
        sys.stderr.write(f"refgpt: interrupted; the prompts done have their records in {args.output}: run the same "
                         "command again to go on\n")
        return 130
    for note in result.notes:
        sys.stderr.write(f"refgpt: note: {one_line(note)}\n")
    summary = result.summary
    not_ok = summary["result"]["not_ok"] if args.task == "compare" and summary else 0
    if args.json:
        print(strict_json.dumps({"out": str(result.out), "task": args.task, "prompts": result.total,
                                 "skipped": result.skipped, "ran": result.ran, "seconds": result.seconds,
                                 "where": result.where, "failed": [{"id": i, "error": e} for i, e in result.failed],
                                 "notes": result.notes, "summary": summary}, indent=2, ensure_ascii=False))
    else:
        print("\n".join(report_lines(args, result)))
    if result.failed:
        first_id, first_error = result.failed[0]
        sys.stderr.write(f"refgpt: error: {len(result.failed)} of {result.total} prompts failed (each error is in "
                         f"{result.out / 'manifest.jsonl'}); prompt {first_id!r}: {one_line(first_error)}\n")
        return 1
    if not_ok:
        sys.stderr.write(f"refgpt: error: {not_ok} of {summary['result']['candidates']} candidates are out of "
                         f"tolerance ({result.out / 'summary.json'})\n")
        return 1
    return 0


def report_lines(args, result) -> list[str]:
    rate = f", {result.ran / result.seconds:.3g} prompts/s" if result.ran and result.seconds > 0 else ""
    lines = [f"model: {args.model or 'the embedded default'} ({args.dtype})",
             f"sweep: --task {args.task} over {result.total} prompts: {result.ran} run, {result.skipped} already "
             f"recorded, {len(result.failed)} failed; {result.seconds:.1f} s{rate}; {result.where}",
             f"wrote {result.out}: records/, manifest.jsonl" + (", summary.json" if result.summary else "")
             + (", goldens/" if args.task == "golden" else "")]
    if result.summary is None:
        return lines
    s = result.summary["result"]
    lines.append("")
    if args.task == "loss" and s["targets"]:
        lines.append(f"mean loss {s['loss_mean']:.6g} nats per token over {s['targets']} targets "
                     f"(perplexity {s['perplexity']:.6g}); mean of the prompts' means {s['prompt_loss_mean']:.6g}")
    elif args.task == "lens" and s["prompts"]:
        names = list(s["lenses"])
        header = ["stream"] + [f"{what} ({name})" for name in names for what in ("KL", "CE", "entropy")]
        rows = [[label] + [f"{s['lenses'][n][m][i]:.4f}" if s['lenses'][n][m][i] is not None else "-"
                           for n in names for m in ("kl_mean", "cross_entropy_mean", "entropy_mean")]
                for i, label in enumerate(s["streams"])]
        lines += [f"corpus means over {s['positions']} positions ({s['targets']} targets), nats:", "",
                  table(header, rows, align="<" + ">" * (len(header) - 1))]
    elif args.task == "attribute" and s["prompts"]:
        rows = [[t["component"], f"{t['mean']:+.6f}", f"{t['mean_abs']:.6f}"] for t in s["top"][:10]]
        lines += [f"mean contribution per attributed position over {s['positions']} positions "
                  f"(mean logit {s['logit_mean']:+.6g}; largest |Σ − logit| {s['max_error']:.2e}), "
                  f"the 10 largest of {len(s['labels'])} components in mean |contribution|:", "",
                  table(["component", "mean", "mean |·|"], rows, align="<>>")]
    elif args.task == "golden" and s["files"]:
        worst = sorted(s["conditioning_max"].items(), key=lambda kv: -kv[1]["c_X"])[:5]
        lines.append(f"{s['files']} golden files, {size_shown(s['bytes'])}; mean loss {s['loss_mean']:.6g} "
                     f"over {s['targets']} targets")
        lines.append("largest conditioning c_X (units of float32's roundoff): "
                     + ", ".join(f"{name} {w['c_X']:.3g} (prompt {w['prompt']})" for name, w in worst))
    elif args.task == "compare" and s["candidates"]:
        lines.append(f"{s['ok']} of {s['candidates']} candidates within tolerance")
        if s["first_divergence"]:
            rows = [[t["tensor"], t["prompts"]] for t in s["first_divergence"][:10]]
            lines += ["", table(["first tensor out of tolerance", "prompts"], rows, align="<>")]
    return lines
