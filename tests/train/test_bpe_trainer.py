"""The BPE trainer: it writes files the tokenizer reads, they round-trip text, the merges come
out in rank order, and the fast incremental trainer learns exactly the brute-force merges."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refgpt.train.bpe_trainer import learn_merges, merge_pair, train_bpe, train_bpe_reference, word_counts, write_tokenizer
from refgpt.gpt2.tokenizer import BYTE_TO_CHAR, ENDOFTEXT, Tokenizer

CORPUS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n",
    "Naïve café owners said: «Ça va?» — 3.14159 is π, and 2718 is e·1000.\n\t  trailing spaces   \n",
    "the the the then there these those they them their theirs thee thou thy thine " * 3,
]


def test_trained_files_load_with_the_tokenizer_and_round_trip_text(tmp_path):
    vocab, merges = train_bpe(CORPUS, 400)
    tok = write_tokenizer(tmp_path, vocab, merges)
    assert tok.vocab_size == len(vocab) <= 400
    assert Tokenizer.from_dir(tmp_path).encoder == vocab
    assert tok.eot_token == len(vocab) - 1 and tok.special_tokens == {ENDOFTEXT: len(vocab) - 1}
    assert all(vocab[BYTE_TO_CHAR[b]] == b for b in range(256))  # ids 0-255: the bytes, in byte order
    for text in CORPUS + ["unseen words: zebra quokka 🦘 ok", ""]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert len(tok.encode(CORPUS[2])) < len(CORPUS[2].encode("utf-8")) / 3  # it compresses what repeats


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips_through_a_trained_tokenizer(text):
    tok = Tokenizer(*train_bpe(CORPUS, 350))
    assert tok.decode(tok.encode(text)) == text


def test_merges_are_in_rank_order(tmp_path):
    """Merge i makes token 256 + i, merges.txt lists them in the order learned, the tokenizer
    ranks them in that order, and the frequency of the chosen pair never increases."""
    vocab, merges = train_bpe(CORPUS, 400)
    tok = write_tokenizer(tmp_path, vocab, merges)
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2" and lines[1:] == [f"{a} {b}" for a, b in merges]
    assert [vocab[a + b] for a, b in merges] == list(range(256, 256 + len(merges)))
    assert [tok._ranks[pair] for pair in merges] == list(range(len(merges)))
    for a, b in merges:  # each merged token encodes as itself
        text = bytes(BYTE_TO_CHAR_INV[c] for c in a + b).decode("utf-8", errors="ignore")
        if text and text.encode("utf-8") == bytes(BYTE_TO_CHAR_INV[c] for c in a + b) and len(tok._pattern.findall(text)) == 1:
            assert tok.encode(text) == [vocab[a + b]]
    counts = chosen_counts(word_counts(CORPUS), merges)
    assert counts == sorted(counts, reverse=True) and counts[-1] >= 2


BYTE_TO_CHAR_INV = {c: b for b, c in BYTE_TO_CHAR.items()}


def chosen_counts(words: Counter, merges) -> list[int]:
    """Replay the merges, recording how often each merged pair occurred when it was merged."""
    spellings = {w: list(w) for w in words}
    out = []
    for pair in merges:
        out.append(sum(n * sum(1 for p in zip(spellings[w], spellings[w][1:]) if p == pair) for w, n in words.items()))
        spellings = {w: merge_pair(s, pair) for w, s in spellings.items()}
    return out


def test_incremental_trainer_learns_the_brute_force_merges():
    assert learn_merges(word_counts(CORPUS), 150) == train_bpe_reference(CORPUS, 150)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="ab c\nxyé", max_size=60), max_size=6), st.integers(0, 40))
def test_incremental_trainer_equals_brute_force_on_random_corpora(texts, n_merges):
    """Small alphabets make many ties and overlapping pairs (aaa): the hard cases."""
    assert learn_merges(word_counts(texts), n_merges) == train_bpe_reference(texts, n_merges)


def test_merging_overlapping_pairs_scans_left_to_right():
    assert merge_pair(list("aaa"), ("a", "a")) == ["aa", "a"]
    assert merge_pair(list("aaaa"), ("a", "a")) == ["aa", "aa"]


def test_words_never_merge_across_the_pre_tokenizer_boundaries():
    vocab, merges = train_bpe(["dog. dog. dog. dog."] * 5, 300)
    assert all(not ("." in a + b and any(ch.isalpha() for ch in a + b)) for a, b in merges)


def test_training_a_few_hundred_kilobytes_takes_seconds():
    """Incremental counting over unique words: ~300 kB in well under the brute force's time."""
    rng = np.random.default_rng(0)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "we", "zu", "the", "and", "ing"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)]
    text = " ".join(rng.choice(words, size=50_000))
    import time

    start = time.perf_counter()
    vocab, merges = train_bpe([text], 2000)
    assert time.perf_counter() - start < 20 and len(merges) > 1000
