"""Training a GPT-2 byte-level BPE vocabulary: the other half of refgpt/gpt2/tokenizer.py.

Byte pair encoding learns its merges greedily. Cut the corpus into words with GPT-2's
pre-tokenizer (:data:`~refgpt.gpt2.tokenizer.GPT2_PATTERN`), spell each word as its UTF-8 bytes (written
as the printable characters of :func:`~refgpt.gpt2.tokenizer.bytes_to_unicode`), then repeat:

    count every adjacent pair of symbols inside every word, weighted by the word's frequency
    merge the most frequent pair (a, b) into one new symbol ab, everywhere; record "a b"

until the vocabulary is big enough. The merges, in the order they were learned, are
``merges.txt``; the 256 bytes, then each merged symbol, then ``<|endoftext|>`` are ``vocab.json``
(ids 0-255 are the bytes in byte order, merge i makes id 256 + i, as GPT-2's ids 256 and up;
in the rare case that two merges spell the same symbol, the second adds no id).
Encoding a word later replays the merges by rank (tokenizer.py's ``_bpe``), which gives the same
segmentation as the training saw.

Ties: when several pairs are equally frequent, the one whose (first, second) strings sort first
wins, so a corpus always gives the same merges.

Speed. Counting pairs afresh after every merge costs a pass over the corpus per merge. Two
observations make it cheap enough for megabytes of text in plain Python:

1. *Count over unique words.* Text repeats words; each distinct word is stored once with its
   frequency (Shakespeare's 5 MB is ~1.3 M words but only ~70 k distinct ones).
2. *Update counts incrementally.* A merge of (a, b) changes only the words containing a then b.
   An index pair → words finds them; for each, the counts of its old pairs are taken away and
   those of its merged spelling added. The most frequent pair is kept in a heap; an entry whose
   count has changed since it was pushed is stale and skipped when popped ("lazy deletion").

``train_bpe_reference`` is the slow, obvious algorithm (recount everything, every merge); the
tests check that both learn the same merges.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable

import regex

from ..errors import RefGPTError
from ..files.saving import save_tokenizer
from ..gpt2.tokenizer import BYTE_TO_CHAR, ENDOFTEXT, GPT2_PATTERN, Tokenizer, merge_pair  # merge_pair: the same merge the tokenizer applies

Pair = tuple[str, str]


def word_counts(texts: Iterable[str]) -> Counter:
    """How often each pre-tokenized word occurs, spelled as a tuple of byte characters."""
    pattern = regex.compile(GPT2_PATTERN)
    words: Counter = Counter()
    for text in texts:
        words.update(pattern.findall(text))
    return Counter({tuple(BYTE_TO_CHAR[b] for b in word.encode("utf-8")): n for word, n in words.items()})


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens=(ENDOFTEXT,)) -> tuple[dict[str, int], list[Pair]]:
    """Learn (vocab, merges) from ``texts`` so that the vocabulary has ``vocab_size`` entries
    (256 bytes + merges + special tokens), or fewer if the corpus runs out of pairs that occur
    at least twice."""
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise RefGPTError(f"vocab_size {vocab_size} is less than the 256 byte tokens plus "
                          f"{len(special_tokens)} special token(s)")
    merges = learn_merges(word_counts(texts), n_merges)
    return build_vocab(merges, special_tokens), merges


def learn_merges(words: Counter, n_merges: int) -> list[Pair]:
    """The first ``n_merges`` merges for a Counter of words (tuples of symbols), incrementally."""
    spellings = [list(word) for word in words]  # word index → its current symbols
    freqs = list(words.values())  # word index → frequency
    counts: Counter = Counter()  # pair → occurrences in the corpus
    where: defaultdict = defaultdict(set)  # pair → indices of words that may hold it
    for i, symbols in enumerate(spellings):
        for pair in zip(symbols, symbols[1:]):
            counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-n, pair) for pair, n in counts.items()]  # max count first, then smallest pair
    heapq.heapify(heap)

    merges: list[Pair] = []
    merged: set[Pair] = set()
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg:
            continue  # stale: this pair's count changed after the entry was pushed
        if -neg < 2:
            break  # merging a pair seen once compresses nothing worth a token
        if pair not in merged:  # (a symbol made twice, by two merges, can pair up again)
            merges.append(pair)
            merged.add(pair)
        changed: Counter = Counter()
        for i in where.pop(pair):
            old = spellings[i]
            new = merge_pair(old, pair)
            if len(new) == len(old):
                continue  # the index was stale: an earlier merge took this occurrence
            for p in zip(old, old[1:]):
                changed[p] -= freqs[i]
            for p in zip(new, new[1:]):
                changed[p] += freqs[i]
                where[p].add(i)
            spellings[i] = new
        for p, delta in changed.items():
            if delta:
                counts[p] += delta
                if counts[p] > 0:
                    heapq.heappush(heap, (-counts[p], p))
                else:
                    del counts[p]
        counts.pop(pair, None)
    return merges


def train_bpe_reference(texts: Iterable[str], n_merges: int) -> list[Pair]:
    """The brute-force trainer: recount every pair of every word before each merge."""
    words = word_counts(texts)
    spellings = {word: list(word) for word in words}
    merges: list[Pair] = []
    while len(merges) < n_merges:
        counts: Counter = Counter()
        for word, n in words.items():
            s = spellings[word]
            for pair in zip(s, s[1:]):
                counts[pair] += n
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        if counts[best] < 2:
            break
        if best not in merges:  # (as in learn_merges)
            merges.append(best)
        spellings = {word: merge_pair(s, best) for word, s in spellings.items()}
    return merges


def build_vocab(merges: list[Pair], special_tokens=(ENDOFTEXT,)) -> dict[str, int]:
    """Bytes 0-255 in byte order, then one token per merge, then the special tokens."""
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))  # two merges may make the same symbol: one id
    for name in special_tokens:
        vocab[name] = len(vocab)
    return vocab


def write_tokenizer(directory, vocab: dict[str, int], merges: list[Pair]) -> Tokenizer:
    """Write ``vocab.json`` and ``merges.txt`` as Hugging Face lays them out (refgpt.files.saving); return
    them read back."""
    return Tokenizer.from_dir(save_tokenizer(Tokenizer(vocab, merges), directory))
