"""``refgpt download NAME [--revision R]``: a GPT-2 from the Hugging Face hub into the HF cache.

What is fetched, how it is verified and where it goes: :mod:`refgpt.files.hub` (the client) and
:mod:`refgpt.files.hf_cache` (the layout). Afterwards ``--model NAME`` finds it, and so do transformers'
and TransformerLens's ``from_pretrained(NAME)``.
"""

from __future__ import annotations

import sys

from ..errors import RefGPTError
from ..files.hf_cache import parse_name
from ..files.hub import download_files
from ._chosen_model import add_subcommand

DESCRIPTION = """\
Download a GPT-2 checkpoint from the Hugging Face hub into the HF cache (HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub), laid out as huggingface_hub lays it out:
config.json, model.safetensors (or its shards and index), vocab.json and merges.txt. Each file's
hash is checked against the hub's (sha256 for LFS files, git's sha1 for the others); a broken
download resumes where it stopped. Afterwards --model NAME runs on it, offline too.
HF_ENDPOINT chooses another hub (a mirror).
"""

USES = ()

EXAMPLES = (
    'refgpt download gpt2 && refgpt predict "The capital of France is" --model gpt2',
    'refgpt download openai-community/gpt2-medium --revision main',
    'HF_HUB_OFFLINE=1 refgpt predict "Hello" --model gpt2      # the cache only, no network',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "download", run, uses=USES, help="a GPT-2 from the HF hub into the HF cache",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("name", metavar="NAME", help="a hub repository: gpt2, gpt2-medium, distilgpt2, "
                   "openai-community/gpt2, any owner/name GPT-2 (NAME@REVISION also works)")
    p.add_argument("--revision", metavar="R", default=None,
                   help="a branch, tag or commit hash (default main)")


def run(args) -> int:
    parsed = parse_name(args.name)
    if parsed is None:
        args.usage_error(f"argument NAME: not a hub repository id ([owner/]name[@revision]): {args.name!r}")
    repo_id, revision = parsed
    if args.revision is not None:
        if "@" in args.name and args.revision != revision:
            raise RefGPTError(f"two revisions: {args.name!r} and --revision {args.revision!r}")
        revision = args.revision
    try:
        snapshot, files = download_files(repo_id, revision)
    except KeyboardInterrupt:  # exit 130 (refgpt.cli.main); say what became of the bytes already here
        sys.stderr.write("refgpt: interrupted; the partial download is kept and resumes next time\n")
        raise
    rows = [f"  {f.filename:<36} {f.size:>14,} bytes  {'sha256' if len(f.etag) == 64 else 'git sha1'} "
            f"{f.etag}" for f in files]
    print("\n".join([f"{repo_id}@{revision} = commit {files[0].commit}: every file's hash checked", *rows,
                     f"in {snapshot}"]))
    return 0
