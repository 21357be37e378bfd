"""Tests for refgpt.gpt2.tokenizer: GPT-2's byte-level BPE, checked against tiktoken's gpt2."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refgpt.errors import RefGPTError, RefGPTTypeError
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

# GPT-2's real files: $REFGPT_GPT2_TOKENIZER (as tests/tl_port.py reads it), else shared/gpt2 beside the repository.
GPT2_DIR = Path(os.environ.get("REFGPT_GPT2_TOKENIZER") or Path(__file__).resolve().parents[3] / "shared" / "gpt2")
EOT = "<|endoftext|>"
# GPT-2's pre-tokenizer, written out here rather than imported, so the tiktoken reference below
# does not inherit a mistake in refgpt's copy.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The fixtures are module-scoped, which hypothesis is fine with: they are never mutated.
fixture_settings = settings(max_examples=150, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture])


def data_gym_byte_map() -> dict[str, int]:
    """char -> byte, defined independently of refgpt the way tiktoken's data_gym loader does:
    printable non-space bytes are themselves, the rest take chr(256), chr(257), ... in order."""
    keep = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    shifted = [b for b in range(256) if b not in keep]
    return {chr(b): b for b in keep} | {chr(256 + n): b for n, b in enumerate(shifted)}


@pytest.fixture(scope="module")
def gpt2_dir() -> Path:
    if not (GPT2_DIR / "vocab.json").exists() or not (GPT2_DIR / "merges.txt").exists():
        pytest.skip(f"GPT-2 vocab.json/merges.txt not found in {GPT2_DIR} "
                    "(expected a shared/gpt2 directory beside the repository)")
    return GPT2_DIR


@pytest.fixture(scope="module")
def gpt2(gpt2_dir) -> Tokenizer:
    return Tokenizer.from_dir(gpt2_dir)


@pytest.fixture(scope="module")
def tiktoken_gpt2(gpt2_dir):
    """tiktoken's gpt2 encoding, built offline from the same files. tiktoken ranks a token by
    its id: bytes 0-255 come first, and merge i produces id 256 + i (tested below)."""
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is not installed")
    vocab = json.loads((gpt2_dir / "vocab.json").read_text(encoding="utf-8"))
    to_byte = data_gym_byte_map()
    ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items() if token != EOT}
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: vocab[EOT]})


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """The embedded default model's vocabulary: 256 byte tokens (id = byte) + <|endoftext|>."""
    encoder = {char: byte for byte, char in bytes_to_unicode().items()} | {EOT: 256}
    return Tokenizer(encoder, merges=[])


# Real text of every kind the tokenizer meets.
CORPUS = {
    "python": 'def f(x: int) -> int:\n    """Double x."""\n    return x * 2  # ok\n\n\n'
              'if __name__ == "__main__":\n\tprint(f(21), {"a": [1, 2.5e-3]})\n',
    "prose": "It was the best of times, it was the worst of times; it was the age of wisdom. "
             "\"Really?\" she asked -- and he said: 'No.'",
    "whitespace": "  leading\ttabs\t\tand   runs   \n\n\n  trailing spaces   \n"
                  " \r\n\t \x0b\x0c\u00a0\u3000 end ",
    "contractions": "I'll've done it, you're sure they'd've? WE'LL SEE. it's Bob's 'quoted'",
    "unicode": "naïve café façade — “smart quotes” … Ünïcödé résumé ß Æsir ΑΒΓ Привет мир",
    "emoji": "family 👨‍👩‍👧‍👦 thumbs 👍🏽 flag 🇫🇷 heart ❤️ keycap 1️⃣ 🤖🤖",
    "cjk": "日本語のテキストです。中文文本，还有한국어 텍스트도。",
    "mixed_scripts": "English עברית العربية हिन्दी ไทย ქართული 123٤٥٦ mixedСкрипт",
    "numbers": "0 00 000 1234567890 3.14159 -42 1,000,000 1e10 0x1F ½ ² Ⅻ ٣",
    "symbols": "a+b=c; x<=y && z!=w || ~q ^ @decorator #hash $var %mod `tick` \\ / |",
    "endoftext_as_text": f"before{EOT}after <|endoftext|><|endoftext|> <|fake|>",
    "empty": "",
}


# ---- the byte map and the merge list -------------------------------------------------------

def test_bytes_to_unicode_is_a_bijection_onto_printable_characters():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert (table[32], table[10], table[0], table[ord("A")]) == ("Ġ", "Ċ", "Ā", "A")


def test_bytes_to_unicode_matches_the_data_gym_definition_tiktoken_uses():
    assert {c: b for b, c in bytes_to_unicode().items()} == data_gym_byte_map()


def test_gpt2_merge_i_has_id_256_plus_i(gpt2_dir):
    vocab = json.loads((gpt2_dir / "vocab.json").read_text(encoding="utf-8"))
    lines = (gpt2_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [line.split(" ") for line in lines if not line.startswith("#version")]
    assert len(merges) == 50000
    assert all(vocab[a + b] == 256 + i for i, (a, b) in enumerate(merges))
    assert sorted(vocab[c] for c in bytes_to_unicode().values()) == list(range(256))


def test_every_gpt2_token_encodes_to_itself(gpt2):
    """So tiktoken's shortcut (a word that is a whole token is that token) agrees with BPE."""
    tokens = [t for t in gpt2.encoder if t not in gpt2.special_tokens]
    assert [t for t in tokens if gpt2._bpe(list(t)) != [t]] == []


def test_gpt2_attributes(gpt2):
    assert gpt2.vocab_size == 50257
    assert gpt2.eot_token == gpt2.bos_token_id == 50256
    assert gpt2.special_tokens == {EOT: 50256}


# ---- known vectors and agreement with tiktoken ---------------------------------------------

@pytest.mark.parametrize("text, ids", [
    ("hello world", [31373, 995]),
    ("Hello world", [15496, 995]),
    *[("0" * n, ids) for n, ids in enumerate(
        [[15], [405], [830], [2388], [20483], [10535], [24598], [8269], [10535, 830]], start=1)],
])
def test_known_gpt2_vectors(gpt2, text, ids):
    assert gpt2.encode(text) == ids
    assert gpt2.decode(ids) == text


@pytest.mark.peer
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_encode_matches_tiktoken_on_real_text(gpt2, tiktoken_gpt2, name):
    text = CORPUS[name]
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)
    assert gpt2.decode(gpt2.encode(text)) == text


@pytest.mark.peer
def test_encode_matches_tiktoken_on_the_whole_corpus_at_once(gpt2, tiktoken_gpt2):
    text = "\n".join(CORPUS.values()) * 3
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)


@pytest.mark.peer
@fixture_settings
@given(text=st.text())
def test_encode_matches_tiktoken_on_arbitrary_text(gpt2, tiktoken_gpt2, text):
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)


@pytest.mark.peer
@fixture_settings
@given(text=st.text(alphabet=st.sampled_from(" \t\n'sltvredmI0123456789aZé日👍\u200d.,!-")))
def test_encode_matches_tiktoken_on_text_dense_in_tricky_characters(gpt2, tiktoken_gpt2, text):
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)


@fixture_settings
@given(text=st.text())
def test_decode_inverts_encode_for_any_text(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text
    assert gpt2.decode_bytes(gpt2.encode(text)) == text.encode("utf-8")


def test_words_are_cached_until_clear_cache():
    """Each encoded word's ids are kept (up to cache_size words); clear_cache forgets them all."""
    tok = Tokenizer(tiny_vocab(), TINY_MERGES)
    ids = tok.encode(" the he")
    assert tok._cache == {" the": (tiny_vocab()["Ġthe"],), " he": (tiny_vocab()["Ġ"], tiny_vocab()["he"])}
    tok.clear_cache()
    assert tok._cache == {} and tok.encode(" the he") == ids
    one = Tokenizer(tiny_vocab(), TINY_MERGES, cache_size=1)
    assert one.encode(" the he") == ids and list(one._cache) == [" he"]  # the last word only


def test_a_tiny_cache_gives_the_same_ids_and_stays_bounded(gpt2_dir, gpt2):
    small = Tokenizer.from_dir(gpt2_dir, cache_size=3)
    text = CORPUS["prose"] + CORPUS["python"]
    assert small.encode(text) == small.encode(text) == gpt2.encode(text)
    assert len(small._cache) <= 3
    uncached = Tokenizer.from_dir(gpt2_dir, cache_size=0)
    assert uncached.encode(text) == gpt2.encode(text) and not uncached._cache


# ---- special tokens ------------------------------------------------------------------------

@pytest.mark.peer
def test_endoftext_is_ordinary_text_by_default(gpt2, tiktoken_gpt2):
    ids = gpt2.encode(f"a{EOT}b")
    assert 50256 not in ids
    assert ids == tiktoken_gpt2.encode_ordinary(f"a{EOT}b")
    assert gpt2.decode(ids) == f"a{EOT}b"


@pytest.mark.peer
@pytest.mark.parametrize("allowed", ["all", {EOT}, [EOT], EOT])
def test_allowed_special_maps_endoftext_to_its_id(gpt2, tiktoken_gpt2, allowed):
    text = f"Hello{EOT} world{EOT}{EOT}<|endof"
    assert gpt2.encode(EOT, allowed_special=allowed) == [50256]
    assert gpt2.encode(text, allowed_special=allowed) == \
        tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2.decode(gpt2.encode(text, allowed_special=allowed)) == text


def test_decode_of_endoftext_id_is_its_text(gpt2):
    assert gpt2.decode([50256]) == EOT
    assert gpt2.decode([31373, 50256, 995]) == f"hello{EOT} world"


def test_unknown_allowed_special_name_raises(gpt2):
    with pytest.raises(RefGPTError, match="<|fake|>"):
        gpt2.encode("x", allowed_special={"<|fake|>"})


@pytest.mark.parametrize("allowed", [5, None])
def test_allowed_special_of_a_wrong_type_raises(gpt2, allowed):
    with pytest.raises(RefGPTTypeError, match="allowed_special must be 'all', a name or names"):
        gpt2.encode("x", allowed_special=allowed)


# ---- decoding ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [50257, -1, 10**9])
def test_decode_out_of_range_id_raises_naming_it(gpt2, bad):
    with pytest.raises(RefGPTError, match=str(bad)):
        gpt2.decode([31373, bad])
    with pytest.raises(RefGPTError, match=str(bad)):
        gpt2.decode_bytes([bad])


@pytest.mark.parametrize("ids, message", [
    (b"ab", "token ids must be integers, found the bytes b'ab'"),
    ("ab", "token ids must be integers, found the str 'ab'"),
    (5, "token ids must be a sequence of integers, found 5"),
    ([0, True], "token id True at position 1 is not an integer"),
    ([305.7], "token id 305.7 at position 0 is not an integer"),
])
def test_decode_refuses_what_is_not_a_sequence_of_integer_ids(gpt2, ids, message):
    with pytest.raises(RefGPTTypeError, match=re.escape(message)):
        gpt2.decode(ids)


def test_encode_refuses_what_is_not_text(gpt2):
    with pytest.raises(RefGPTTypeError, match="encode: text must be a str, found bytes"):
        gpt2.encode(b"x")


def test_decode_names_the_first_out_of_range_id_and_its_position(gpt2):
    """Id 0 is a token (the byte "!"): the error is about the id after it."""
    with pytest.raises(RefGPTError, match=r"token id 50257 at position 1 is out of range"):
        gpt2.decode([0, 50257, -1])
    assert gpt2.decode([0]) == "!"


def test_decode_replaces_a_cut_character_but_decode_bytes_is_exact(gpt2):
    ids = gpt2.encode("👍")
    assert len(ids) > 1  # the emoji's 4 bytes are split over several tokens
    assert gpt2.decode_bytes(ids[:1]) == "👍".encode()[:len(gpt2.decode_bytes(ids[:1]))]
    assert "\ufffd" in gpt2.decode(ids[:1])
    assert gpt2.decode([]) == "" and gpt2.encode("") == []


def test_lone_surrogate_raises(gpt2):
    with pytest.raises(RefGPTError, match="surrogate"):
        gpt2.encode("ok \ud800 no")


# ---- the byte-level vocabulary (no merges) -------------------------------------------------

@fixture_settings
@given(text=st.text())
def test_byte_level_vocab_encodes_each_utf8_byte_to_one_token_and_round_trips(byte_level, text):
    assert byte_level.encode(text) == list(text.encode("utf-8"))
    assert byte_level.decode(byte_level.encode(text)) == text


def test_byte_level_vocab_attributes_and_special_token(byte_level):
    assert byte_level.vocab_size == 257 and byte_level.eot_token == 256
    assert byte_level.encode(f"a{EOT}", allowed_special="all") == [97, 256]
    assert byte_level.decode([104, 105, 256]) == f"hi{EOT}"


def test_byte_level_vocab_loads_from_files_with_an_empty_or_version_only_merges_file(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(tiny_vocab(merges=())), encoding="utf-8")
    for merges_text in ["", "#version: 0.2\n"]:
        (tmp_path / "merges.txt").write_text(merges_text, encoding="utf-8")
        assert Tokenizer.from_dir(tmp_path).encode("hé") == [ord("h"), 0xC3, 0xA9]


# ---- loading files, good and broken --------------------------------------------------------

TINY_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]


def tiny_vocab(merges=TINY_MERGES) -> dict[str, int]:
    """A small valid vocab: 256 bytes (id = byte), the merges' results, then <|endoftext|>."""
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return vocab | {EOT: len(vocab)}


def write_tiny(tmp_path, vocab_text=None, merges_text=None, names=("vocab.json", "merges.txt")):
    vocab_path, merges_path = tmp_path / names[0], tmp_path / names[1]
    vocab_path.write_text(vocab_text if vocab_text is not None else json.dumps(tiny_vocab()),
                          encoding="utf-8")
    merges_path.write_text(merges_text if merges_text is not None else
                           "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in TINY_MERGES),
                           encoding="utf-8")
    return vocab_path, merges_path


@pytest.mark.parametrize("names", [("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")])
def test_from_dir_reads_hf_and_openai_file_names(tmp_path, names):
    write_tiny(tmp_path, names=names)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.encode(" the") == [tiny_vocab()["Ġthe"]]
    assert tok.eot_token == tok.vocab_size - 1 == 259


def test_from_dir_reads_the_real_gpt2_files_under_openai_names(gpt2_dir, gpt2, tmp_path):
    shutil.copy(gpt2_dir / "vocab.json", tmp_path / "encoder.json")
    shutil.copy(gpt2_dir / "merges.txt", tmp_path / "vocab.bpe")
    text = CORPUS["prose"]
    assert Tokenizer.from_dir(tmp_path).encode(text) == gpt2.encode(text)


def test_merges_file_without_version_line_or_with_crlf_loads(tmp_path):
    write_tiny(tmp_path, merges_text="Ġ t\r\nh e\r\nĠt he\r\n")
    assert Tokenizer.from_dir(tmp_path).encode(" the") == [tiny_vocab()["Ġthe"]]


def test_from_dir_without_tokenizer_files_raises(tmp_path):
    with pytest.raises(RefGPTError, match="vocab.json"):
        Tokenizer.from_dir(tmp_path)


MERGES = "#version: 0.2\nĠ t\nh e\nĠt he\n"
BROKEN_FILES = {
    # name: (vocab text or None for the valid one, merges text or None, faulty file, line)
    "vocab_not_json": ('{"a": 1,\n "b": }', None, "vocab.json", 2),
    "vocab_not_an_object": ('[1, 2, 3]', None, "vocab.json", 1),
    "vocab_id_not_an_int": (json.dumps(tiny_vocab() | {"Ġ": "32"}), None, "vocab.json", 1),
    "vocab_duplicate_id": (json.dumps(tiny_vocab() | {EOT: 0}), None, "vocab.json", 1),
    "vocab_duplicate_token":
        ('{\n' + json.dumps(tiny_vocab())[1:-1].replace(", ", ",\n") + ',\n"h": 104\n}',
         None, "vocab.json", 262),
    "vocab_id_out_of_range": (json.dumps(tiny_vocab() | {EOT: 999}), None, "vocab.json", 1),
    "vocab_id_negative": (json.dumps(tiny_vocab() | {EOT: -1}), None, "vocab.json", 1),
    "vocab_id_equal_to_size": (json.dumps(tiny_vocab() | {EOT: 260}), None, "vocab.json", 1),
    "vocab_token_not_bytes": (json.dumps(tiny_vocab() | {"a b": 260}), None, "vocab.json", 1),
    "merge_one_symbol": (None, MERGES + "Ġthe\n", "merges.txt", 5),
    "merge_three_symbols": (None, "Ġ t\nh e x\nĠt he\n", "merges.txt", 2),
    "merge_double_space": (None, "Ġ  t\nh e\nĠt he\n", "merges.txt", 1),
    "merge_blank_line_inside": (None, "Ġ t\n\nh e\nĠt he\n", "merges.txt", 2),
    "merge_symbol_not_in_alphabet": (None, MERGES + "x\u4e00 y\n", "merges.txt", 5),
    "merge_result_not_in_vocab": (None, "Ġ t\nh e\nĠ th\n", "merges.txt", 3),
    "merge_listed_twice": (None, MERGES + "h e\n", "merges.txt", 5),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_broken_file_raises_naming_file_and_line(tmp_path, case):
    vocab_text, merges_text, faulty, line = BROKEN_FILES[case]
    paths = dict(zip(["vocab.json", "merges.txt"], write_tiny(tmp_path, vocab_text, merges_text)))
    with pytest.raises(RefGPTError) as err:
        Tokenizer.from_files(paths["vocab.json"], paths["merges.txt"])
    assert str(paths[faulty]) in str(err.value)
    assert f"line {line}" in str(err.value)


@pytest.mark.parametrize("case, reason", [
    ("vocab_duplicate_id", "duplicate id 0: used by both 'Ā' and '<|endoftext|>'"),
    ("vocab_id_negative", "token '<|endoftext|>' has id -1, but a vocabulary of 260 tokens must use ids 0..259"),
    ("merge_listed_twice", "merge h e is listed twice"),
    ("merge_result_not_in_vocab", "merge Ġ th: the merged token 'Ġth' is not in the vocabulary"),
])
def test_broken_file_message_says_what_is_wrong(tmp_path, case, reason):
    vocab_text, merges_text, faulty, line = BROKEN_FILES[case]
    paths = dict(zip(["vocab.json", "merges.txt"], write_tiny(tmp_path, vocab_text, merges_text)))
    with pytest.raises(RefGPTError) as err:
        Tokenizer.from_files(paths["vocab.json"], paths["merges.txt"])
    assert str(err.value) == f"{paths[faulty]}, line {line}: {reason}"


def test_a_fault_at_a_non_ascii_token_names_its_line(tmp_path):
    """vocab.json as GPT-2's is written: non-ASCII tokens ("Ġ" is byte 32) stored as themselves."""
    lines = [f"{json.dumps(token, ensure_ascii=False)}: {i}" for token, i in (tiny_vocab() | {"Ġ": 0}).items()]
    vocab_path, merges_path = write_tiny(tmp_path, vocab_text="{\n" + ",\n".join(lines) + "\n}")
    line = lines.index('"Ġ": 0') + 2  # after the "{" line
    with pytest.raises(RefGPTError, match=rf"vocab.json, line {line}: duplicate id 0"):
        Tokenizer.from_files(vocab_path, merges_path)


def test_a_vocab_that_is_not_utf8_is_refused_naming_it(tmp_path):
    vocab_path, merges_path = write_tiny(tmp_path)
    vocab_path.write_bytes(b'{"\xff": 0}')
    with pytest.raises(RefGPTError, match="vocab.json: cannot read tokenizer file"):
        Tokenizer.from_files(vocab_path, merges_path)


def test_special_tokens_are_the_whole_names_and_the_longest_wins():
    """By default a special token is a vocab entry "<|…|>" (not "<|a" or "a|>"); with two names
    where one starts the other, encode takes the longer one."""
    vocab = tiny_vocab() | {"<|a": 260, "b|>": 261, "<|fim|>": 262, "<|fim|>_pre|>": 263}
    tok = Tokenizer(vocab, TINY_MERGES)
    assert tok.special_tokens == {EOT: 259, "<|fim|>": 262, "<|fim|>_pre|>": 263}
    assert tok.encode("<|fim|>_pre|><|fim|>", allowed_special="all") == [263, 262]


@pytest.mark.parametrize("missing", ["vocab.json", "merges.txt"])
def test_missing_file_raises_naming_it(tmp_path, missing):
    write_tiny(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(RefGPTError, match="not found") as err:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path / missing) in str(err.value)


def test_vocab_missing_a_byte_token_raises(tmp_path):
    vocab = {token: i for i, token in enumerate(t for t in tiny_vocab() if t != "Ā")}
    vocab_path, merges_path = write_tiny(tmp_path, vocab_text=json.dumps(vocab))
    with pytest.raises(RefGPTError, match="single-byte") as err:
        Tokenizer.from_files(vocab_path, merges_path)
    assert str(vocab_path) in str(err.value)


@pytest.mark.parametrize("encoder, merges", [
    ({"a": 0, "b": 0}, []),
    ({"a": 1.5}, []),
    (tiny_vocab(), [("Ġ", "x")]),
    (tiny_vocab(), [("Ġt",)]),
])
def test_constructor_rejects_bad_in_memory_vocab_or_merges(encoder, merges):
    with pytest.raises(RefGPTError):
        Tokenizer(encoder, merges)


@pytest.mark.parametrize("pair", [("Ġ", ""), (1, 2), (b"h", b"e"), ("h", "e", "x"), "he"])
def test_a_merge_must_be_two_non_empty_strings(pair):
    with pytest.raises(RefGPTError, match=f"merge {re.escape(repr(pair))} is not a pair of two symbols"):
        Tokenizer(tiny_vocab(), [pair])


def test_unknown_special_token_in_constructor_raises():
    with pytest.raises(RefGPTError, match="<|fake|>"):
        Tokenizer(tiny_vocab(), TINY_MERGES, special_tokens=["<|fake|>"])
