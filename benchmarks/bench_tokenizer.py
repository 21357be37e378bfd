"""Encoding speed of refgpt's BPE tokenizer (cold and warm word cache) next to tiktoken.

Run it as ``python benchmarks/bench_tokenizer.py``; a benchmark runner can import :func:`run`,
which returns a dict of results. Speeds are MB/s of UTF-8 input (1 MB = 10**6 bytes) on one
core: each library is called single-threaded (tiktoken's ``encode_ordinary``, not its batch
API), and each figure is the best of ``repeats`` runs. "Cold" empties refgpt's per-word cache
before each run (the cache still fills as the run goes, as it would on a fresh tokenizer);
"warm" encodes the same text again with every word already cached.

The text is "English-like" and built reproducibly without downloads: words are drawn with a
seeded RNG from GPT-2's own vocabulary — the tokens that are a space plus a lowercase word —
with Zipf weights 1/rank in id order (GPT-2 learned its merges in order of frequency, so low
ids are common words). About one word in ten is glued to a second word, giving the rare,
multi-token words real text has; sentences get capitals, commas, full stops and paragraph
breaks. See :func:`english_like_text`.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    from refgpt.gpt2.tokenizer import GPT2_PATTERN, Tokenizer, bytes_to_unicode
except ImportError:  # run from a checkout without installing: use the repository's package
    sys.path.insert(0, str(REPO))
    from refgpt.gpt2.tokenizer import GPT2_PATTERN, Tokenizer, bytes_to_unicode

DEFAULT_GPT2_DIR = REPO.parent / "shared" / "gpt2"


def english_like_text(vocab: dict[str, int], size_bytes: int, seed: int = 0) -> str:
    """About ``size_bytes`` of Zipf-distributed English words from GPT-2's vocabulary."""
    words = sorted((i, token[1:]) for token, i in vocab.items()
                   if token.startswith("Ġ") and token[1:].isascii() and token[1:].isalpha()
                   and token[1:].islower() and len(token) > 2)
    words = [word for _, word in words]
    rng = random.Random(seed)
    zipf = list(itertools.accumulate(1 / rank for rank in range(1, len(words) + 1)))
    paragraphs, size = [], 0
    while size < size_bytes:
        sentences = []
        for _ in range(rng.randint(3, 7)):
            sentence = rng.choices(words, cum_weights=zipf, k=rng.randint(6, 20))
            sentence = [w + rng.choices(words, cum_weights=zipf)[0] if rng.random() < 0.1 else w
                        for w in sentence]
            sentence = [w + "," if rng.random() < 0.08 else w for w in sentence]
            sentences.append(" ".join(sentence).capitalize().rstrip(",") + ".")
        paragraphs.append(" ".join(sentences))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs)[:size_bytes]


def _best_seconds(fn, repeats: int, before=lambda: None) -> float:
    best = float("inf")
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _tiktoken_encoding(gpt2_dir: Path):
    """tiktoken's gpt2 built offline from the same files (rank = id), or None if absent."""
    try:
        import tiktoken
    except ImportError:
        return None
    vocab = json.loads((gpt2_dir / "vocab.json").read_text(encoding="utf-8"))
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items()
             if token != "<|endoftext|>"}
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": vocab["<|endoftext|>"]})


def run(gpt2_dir: str | Path | None = None, size_bytes: int = 2_000_000,
        repeats: int = 3) -> dict:
    """Time encoding ``size_bytes`` of English-like text; return speeds in MB/s."""
    gpt2_dir = Path(gpt2_dir) if gpt2_dir is not None else DEFAULT_GPT2_DIR
    tokenizer = Tokenizer.from_dir(gpt2_dir)
    text = english_like_text(tokenizer.encoder, size_bytes)
    megabytes = len(text.encode("utf-8")) / 1e6

    ids = tokenizer.encode(text)
    cold = _best_seconds(lambda: tokenizer.encode(text), repeats, before=tokenizer.clear_cache)
    warm = _best_seconds(lambda: tokenizer.encode(text), repeats)
    decode = _best_seconds(lambda: tokenizer.decode(ids), repeats)
    results = {
        "text_megabytes": round(megabytes, 3),
        "tokens": len(ids),
        "refgpt_cold_mb_s": megabytes / cold,
        "refgpt_warm_mb_s": megabytes / warm,
        "refgpt_decode_mb_s": megabytes / decode,
        "tiktoken_mb_s": None,
        "tiktoken_decode_mb_s": None,
        "identical_to_tiktoken": None,
    }
    encoding = _tiktoken_encoding(gpt2_dir)
    if encoding is not None:
        results["tiktoken_mb_s"] = megabytes / _best_seconds(
            lambda: encoding.encode_ordinary(text), repeats)
        results["tiktoken_decode_mb_s"] = megabytes / _best_seconds(
            lambda: encoding.decode(ids), repeats)
        results["identical_to_tiktoken"] = encoding.encode_ordinary(text) == ids
    return results


def main() -> dict:
    results = run()
    print(f"English-like text: {results['text_megabytes']} MB, {results['tokens']} tokens")
    print(f"{'tokenizer':<28}{'MB/s':>10}")
    rows = [("refgpt encode, cold cache", results["refgpt_cold_mb_s"]),
            ("refgpt encode, warm cache", results["refgpt_warm_mb_s"]),
            ("tiktoken encode_ordinary", results["tiktoken_mb_s"]),
            ("refgpt decode", results["refgpt_decode_mb_s"]),
            ("tiktoken decode", results["tiktoken_decode_mb_s"])]
    for name, speed in rows:
        print(f"{name:<28}{'n/a' if speed is None else f'{speed:.2f}':>10}")
    print(f"identical to tiktoken: {results['identical_to_tiktoken']}")
    print(results)
    return results


if __name__ == "__main__":
    main()
