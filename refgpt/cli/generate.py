"""``refgpt generate TEXT -n N``: continue TEXT by N tokens, one forward step per token.

Each step runs only the newest token through the model, with the keys and values of the earlier
positions kept in a KV cache (refgpt/gpt2/kv_cache.py); the result equals recomputing the whole text
every step. Temperature 0 is greedy decoding; otherwise tokens are sampled from the softmax of
logits / temperature, restricted to the top K with --top-k, reproducibly for a given --seed.
Progress (tokens so far) goes to stderr when it is a terminal (``--progress``, ``--quiet``).
"""

from __future__ import annotations

from . import _progress
from ._arguments import count, non_negative_float, positive_int
from ._chosen_model import add_subcommand, load_chosen, print_json, token_json, tokens_of, untrained_note
from ._output import escaped

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt generate "To be, or not to" -n 20 --temperature 0',
    'refgpt generate "Now is the winter of" -n 50 --top-k 40 --seed 1',
    'refgpt generate "The king" -n 5 --bos --json',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "generate", run, uses=USES, help="continue TEXT by N tokens (KV-cached decoding)",
                       description="Continue TEXT by N tokens: greedy with --temperature 0, else sampled "
                                   "(optionally from the top K) with a seeded generator.",
                       examples=EXAMPLES)
    p.add_argument("-n", "--max-new-tokens", type=count, default=20, metavar="N",
                   help="how many tokens to add (default 20)")
    p.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy (default 1)")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="sample only from the K most likely (not with --temperature 0)")
    p.add_argument("--seed", type=count, default=None, help="seed of the sampler (default 0; not with --temperature 0)")
    _progress.add_arguments(p)


def run(args) -> int:
    greedy = args.temperature == 0
    for option, value in (("--top-k", args.top_k), ("--seed", args.seed)):
        if greedy and value is not None:  # refused, not ignored: greedy decoding samples nothing
            args.usage_error(f"{option} is for sampling; --temperature 0 decodes greedily and would ignore it")
    seed = None if greedy else args.seed if args.seed is not None else 0
    model = load_chosen(args)
    prompt = tokens_of(model, args)  # [pos]
    progress = _progress.Progress.of(args, "generate")
    steps = [0]

    def tick(activation, hook):  # one forward pass per generated token
        steps[0] += 1
        progress(steps[0], args.max_new_tokens)

    try:
        with model.hooks([("ln_final.hook_scale", tick)]):
            out = model.generate(prompt, args.max_new_tokens, temperature=args.temperature,
                                 top_k=args.top_k, seed=seed, stop_at_eos=False)  # [pos + n], exactly n new
    finally:
        progress.close()
    new = out[len(prompt):]  # [n]
    if args.json:
        return print_json(model, {"text": args.text, "tokens": [token_json(model, t) for t in prompt],
                                  "continuation": model.to_string(new),
                                  "new_tokens": [token_json(model, t) for t in new],
                                  "temperature": args.temperature, "top_k": args.top_k, "seed": seed})
    note = untrained_note(model)
    print("\n".join([*([note, ""] if note else []), escaped(model.to_string(out))]))
    return 0
