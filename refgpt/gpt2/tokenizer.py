"""GPT-2's byte-level BPE tokenizer, in plain Python.

A language model reads integers, not text. GPT-2 turns text into integers in three steps.

**1. Bytes, shown as printable characters.** Text is encoded as UTF-8, so any string at all
becomes a sequence of bytes from an alphabet of only 256 symbols — no "unknown character" can
ever occur. To keep the vocabulary files readable, each byte is written as one printable
Unicode character: bytes that already print nicely (``!`` to ``~``, ``¡`` to ``ÿ`` except the
soft hyphen) stand for themselves, and the other 68 (control bytes, space, ...) are shifted to
characters 256 and up, in byte order. That is why a space appears as ``Ġ`` (byte 32 is the
33rd such byte, ``chr(256 + 32)``) and a newline as ``Ċ``. See :func:`bytes_to_unicode`.

**2. Pre-tokenization.** A regular expression (:data:`GPT2_PATTERN`) cuts the text into
"words": contractions (``'ll``), runs of letters, runs of digits and runs of punctuation, each
with at most one leading space, plus runs of whitespace. BPE then works inside each word, so
a token never spans ``" dog"`` and ``"."``. Because the same words recur, the tokens of each
word are cached.

**3. Byte pair encoding.** ``merges.txt`` is a ranked list of symbol pairs, learned by
repeatedly merging the most frequent adjacent pair in a training corpus. To encode a word,
start from its single-byte symbols and repeatedly merge the adjacent pair that has the lowest
rank (the one learned earliest), everywhere it occurs, until no adjacent pair is in the list.
Each remaining symbol is a key of ``vocab.json``, whose value is the token id. In GPT-2, ids
0-255 are the bytes, merge ``i`` creates id ``256 + i``, and 50256 is ``<|endoftext|>``.

Decoding is the easy direction: look up each id's string, map its characters back to bytes,
join, and decode the UTF-8 (a token may hold half a character, hence :meth:`decode_bytes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from itertools import repeat
from numbers import Integral
from pathlib import Path

import regex

from refgpt import strict_json
from refgpt.errors import RefGPTError, RefGPTTypeError, shown

#: GPT-2's pre-tokenizer: contractions, letters, digits, other symbols (each optionally
#: preceded by one space), whitespace not followed by a word, and any leftover whitespace.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
_NEVER = float("inf")  # the rank of a pair that is not in the merge list


def bytes_to_unicode() -> dict[int, str]:
    """Map every byte 0-255 to the printable character that stands for it in the vocab files."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:  # unprintable: take the next character from 256 upwards
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {char: byte for byte, char in BYTE_TO_CHAR.items()}


class _EntryError(RefGPTError):
    """A fault in one vocab token or one merge; ``from_files`` adds the file and line."""

    def __init__(self, message: str, *, token: str | None = None, merge: int | None = None):
        super().__init__(message)
        self.token, self.merge = token, merge


class Tokenizer:
    """GPT-2's byte-level BPE: ``encode`` text to token ids and ``decode`` them back.

    ``encoder`` maps token strings (bytes written with :func:`bytes_to_unicode`) to ids
    0..n-1; ``merges`` is the ranked list of symbol pairs. ``special_tokens`` names the tokens
    that stand for themselves rather than for bytes; by default every vocab entry of the form
    ``<|...|>``. The vocabulary must contain all 256 single-byte tokens.

    The per-word cache is bounded: it holds up to ``cache_size`` words (100 000 by default,
    roughly 20 MB when full) and forgets the oldest word first, so a long stream of unique
    strings cannot grow memory without limit. ``cache_size=0`` disables it.
    """

    def __init__(self, encoder: Mapping[str, int], merges: Iterable[tuple[str, str]],
                 special_tokens: Iterable[str] | None = None, *, cache_size: int = 100_000):
        self.encoder = dict(encoder)
        self.vocab_size = len(self.encoder)
        self._check_ids()
        if special_tokens is None:
            special_tokens = [t for t in self.encoder if t.startswith("<|") and t.endswith("|>")]
        special_tokens = list(special_tokens)
        if missing := [name for name in special_tokens if name not in self.encoder]:
            raise RefGPTError(f"special tokens {missing} are not in the vocabulary")
        self.special_tokens = {name: self.encoder[name] for name in special_tokens}
        self.eot_token = self.bos_token_id = self.special_tokens.get(ENDOFTEXT)
        # HF's GPT2TokenizerFast as TransformerLens sets it up: <|endoftext|> is BOS, EOS and pad;
        # batches are padded on the right unless a caller says otherwise.
        self.eos_token_id = self.pad_token_id = self.eot_token
        self.bos_token = self.eos_token = self.pad_token = ENDOFTEXT if self.eot_token is not None else None
        self.padding_side = "right"
        self._id_to_bytes = self._build_decoder()
        self._ranks = self._rank_merges(merges)  # (first, second) -> rank
        self._merges = list(self._ranks)  # rank -> (first, second)
        self._pattern = regex.compile(GPT2_PATTERN)
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_size = cache_size

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_path: str | Path, merges_path: str | Path, **kwargs) -> Tokenizer:
        """Load ``vocab.json``/``encoder.json`` and ``merges.txt``/``vocab.bpe``."""
        vocab_path, merges_path = Path(vocab_path), Path(merges_path)
        vocab_text = _read_text(vocab_path)
        encoder = _parse_vocab(vocab_text, vocab_path)
        merges, merge_lines = _parse_merges(_read_text(merges_path), merges_path)
        try:
            return cls(encoder, merges, **kwargs)
        except _EntryError as err:
            if err.merge is not None:
                where = f"{merges_path}, line {merge_lines[err.merge]}"
            else:
                where = f"{vocab_path}{_line_of(vocab_text, err.token)}"
            raise RefGPTError(f"{where}: {err}") from None

    @classmethod
    def from_dir(cls, directory: str | Path, **kwargs) -> Tokenizer:
        """Load Hugging Face's vocab.json + merges.txt or OpenAI's encoder.json + vocab.bpe."""
        directory = Path(directory)
        for vocab, merges in [("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")]:
            if (directory / vocab).exists() or (directory / merges).exists():
                return cls.from_files(directory / vocab, directory / merges, **kwargs)
        raise RefGPTError(f"{directory}: no tokenizer files found; expected vocab.json + "
                          "merges.txt (Hugging Face) or encoder.json + vocab.bpe (OpenAI)")

    def _check_ids(self) -> None:
        """Ids must be the integers 0..n-1, each used once, so they can index an embedding."""
        owner: dict[int, str] = {}
        for token, i in self.encoder.items():
            if not isinstance(token, str) or not isinstance(i, int) or isinstance(i, bool):
                raise _EntryError(f"entry {token!r}: {i!r} must map a string to an integer id",
                                  token=str(token))
            if not 0 <= i < self.vocab_size:
                raise _EntryError(f"token {token!r} has id {i}, but a vocabulary of "
                                  f"{self.vocab_size} tokens must use ids 0..{self.vocab_size - 1}",
                                  token=token)
            if i in owner:
                raise _EntryError(f"duplicate id {i}: used by both {owner[i]!r} and {token!r}",
                                  token=token)
            owner[i] = token

    def _build_decoder(self) -> list[bytes]:
        """id -> bytes. Special tokens are their own UTF-8 text; the rest are byte strings."""
        if missing := [b for b, char in BYTE_TO_CHAR.items() if char not in self.encoder]:
            raise _EntryError(f"the vocabulary lacks single-byte tokens for {len(missing)} "
                              f"bytes (e.g. byte {missing[0]} = {BYTE_TO_CHAR[missing[0]]!r}); "
                              "byte-level BPE needs all 256")
        decoder = [b""] * self.vocab_size
        for token, i in self.encoder.items():
            if token in self.special_tokens:
                decoder[i] = token.encode("utf-8")
            else:
                decoder[i] = _symbol_bytes(token, f"token {token!r}", token=token)
        return decoder

    def _rank_merges(self, merges: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """pair -> rank (its position in the list); the merged symbol must be in the vocab."""
        ranks: dict[tuple[str, str], int] = {}
        for rank, pair in enumerate(merges):
            if not isinstance(pair, tuple | list) or len(pair) != 2 or not all(
                    isinstance(symbol, str) and symbol for symbol in pair):
                raise _EntryError(f"merge {pair!r} is not a pair of two symbols", merge=rank)
            first, second = pair
            _symbol_bytes(first + second, f"merge {first} {second}", merge=rank)
            if first + second not in self.encoder:
                raise _EntryError(f"merge {first} {second}: the merged token {first + second!r} "
                                  "is not in the vocabulary", merge=rank)
            if (first, second) in ranks:
                raise _EntryError(f"merge {first} {second} is listed twice", merge=rank)
            ranks[first, second] = rank
        return ranks

    # ---- encoding -----------------------------------------------------------------------

    def encode(self, text: str, allowed_special: str | Iterable[str] = ()) -> list[int]:
        """Token ids of ``text``. Special-token text (``<|endoftext|>``) is ordinary text unless
        named in ``allowed_special`` (a set of names, or ``"all"``)."""
        if not isinstance(text, str):
            raise RefGPTTypeError(f"encode: text must be a str, found {type(text).__name__}")
        if isinstance(allowed_special, str):
            allowed_special = self.special_tokens if allowed_special == "all" else [allowed_special]
        try:
            allowed = set(allowed_special)
        except TypeError:
            raise RefGPTTypeError(f"allowed_special must be 'all', a name or names, found {allowed_special!r:.40}") from None
        if unknown := allowed - self.special_tokens.keys():
            raise RefGPTError(f"allowed_special names unknown special tokens {sorted(unknown)}; "
                              f"this vocabulary has {sorted(self.special_tokens)}")
        if not allowed:
            return self.encode_ordinary(text)
        # Longest names first, so that a special token is never cut short by one it starts with.
        splitter = "|".join(regex.escape(s) for s in sorted(allowed, key=len, reverse=True))
        ids, start = [], 0
        for match in regex.finditer(splitter, text):
            ids += self.encode_ordinary(text[start:match.start()])
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        return ids + self.encode_ordinary(text[start:])

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of ``text``, treating everything (even ``<|endoftext|>``) as plain text."""
        ids: list[int] = []
        try:
            for word in self._pattern.findall(text):
                ids.extend(self._encode_word(word))
        except UnicodeEncodeError:
            pos = regex.search(r"[\ud800-\udfff]", text).start()
            raise RefGPTError(f"text has a lone surrogate {text[pos]!r} at index {pos}; "
                              "it is not valid Unicode and has no UTF-8 bytes") from None
        return ids

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            symbols = [BYTE_TO_CHAR[b] for b in word.encode("utf-8")]
            ids = tuple(self.encoder[s] for s in self._bpe(symbols))
            if self._cache_size > 0:
                if len(self._cache) >= self._cache_size:
                    del self._cache[next(iter(self._cache))]  # dicts keep insertion order
                self._cache[word] = ids
        return ids

    def _bpe(self, symbols: list[str]) -> list[str]:
        """Merge the lowest-ranked adjacent pair, everywhere, until no pair can merge."""
        rank_of = self._ranks.get
        while len(symbols) > 1:
            # The rank of each adjacent pair (_NEVER if it is not a merge); map() keeps it fast.
            best = min(map(rank_of, zip(symbols, symbols[1:]), repeat(_NEVER)))
            if best == _NEVER:
                break
            symbols = merge_pair(symbols, self._merges[best])
        return symbols

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The merges in rank order (what ``merges.txt`` lists)."""
        return list(self._merges)

    def clear_cache(self) -> None:
        """Forget the per-word cache (e.g. to time encoding from cold)."""
        self._cache.clear()

    # ---- decoding -----------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes the ids stand for (may end inside a multi-byte character)."""
        if isinstance(ids, (str, bytes)):
            raise RefGPTTypeError(f"token ids must be integers, found the {type(ids).__name__} {ids!r:.40}")
        if getattr(ids, "ndim", 1) != 1:  # an array [batch, pos] is several texts: decode one row at a time
            raise RefGPTError(f"token ids must be one sequence [pos], found an array of shape {list(ids.shape)}")
        try:
            ids, table = list(ids), self._id_to_bytes
        except TypeError:
            raise RefGPTTypeError(f"token ids must be a sequence of integers, found {shown(ids)}") from None
        kind = next(((pos, i) for pos, i in enumerate(ids) if isinstance(i, bool) or not isinstance(i, Integral)), None)
        if kind is not None:  # True is not token 1, 305.7 is not token 305
            raise RefGPTTypeError(f"token id {shown(kind[1], 40)} at position {kind[0]} is not an integer")
        try:
            if ids and min(ids) < 0:  # a negative index would silently count from the end
                raise IndexError
            return b"".join([table[i] for i in ids])
        except IndexError:
            pos, bad = next((pos, i) for pos, i in enumerate(ids) if not 0 <= i < len(table))
            raise RefGPTError(f"token id {bad!r} at position {pos} is out of range for a "
                              f"vocabulary of {len(table)} tokens (ids 0..{len(table) - 1})"
                              ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text the ids stand for; invalid UTF-8 (a cut character) becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self._ranks)}, "
                f"special_tokens={self.special_tokens})")


def merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    """Replace every adjacent occurrence of ``pair``, scanning left to right."""
    first, second = pair
    merged, i, n = [], 0, len(symbols)
    while i < n:
        if i + 1 < n and symbols[i] == first and symbols[i + 1] == second:
            merged.append(first + second)
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def _symbol_bytes(symbol: str, what: str, **where) -> bytes:
    """The bytes a vocab symbol stands for, or an error if it uses a non-byte character."""
    try:
        return bytes([CHAR_TO_BYTE[char] for char in symbol])
    except KeyError as err:
        raise _EntryError(f"{what} contains {err.args[0]!r}, which is not one of the 256 "
                          "byte characters (see bytes_to_unicode)", **where) from None


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise RefGPTError(f"{path}: tokenizer file not found")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RefGPTError(f"{path}: cannot read tokenizer file ({err})") from None


def _parse_vocab(text: str, path: Path) -> dict:
    """Parse a JSON object strictly (refgpt/strict_json.py: ``json`` would silently keep the last
    of two equal tokens), naming a repeated token and its line."""
    vocab = strict_json.loads(text, str(path),
                              duplicate=lambda key: f"{path}{_line_of(text, key, 2)}: token {key!r} appears twice")
    if not isinstance(vocab, dict):
        raise RefGPTError(f"{path}, line 1: expected a JSON object mapping token strings to "
                          f"ids, got {type(vocab).__name__}")
    return vocab


def _parse_merges(text: str, path: Path) -> tuple[list[tuple[str, str]], list[int]]:
    """The merge pairs, and the 1-based line each came from. A ``#version`` first line and
    trailing blank lines are allowed; every other line must be two symbols and one space."""
    merges, lines = [], []
    text = text.rstrip("\r\n")
    for lineno, line in enumerate(text.split("\n") if text else [], start=1):
        line = line.removesuffix("\r")
        if lineno == 1 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise RefGPTError(f"{path}, line {lineno}: expected two symbols separated by one "
                              f"space, got {line!r}")
        merges.append((parts[0], parts[1]))
        lines.append(lineno)
    return merges, lines


def _line_of(text: str, token: str | None, nth: int = 1) -> str:
    """', line N' where ``token`` appears as a JSON string in ``text`` for the nth time."""
    quoted = {json.dumps(token), json.dumps(token, ensure_ascii=False)} if token else set()
    starts = sorted(m.start() for q in quoted for m in regex.finditer(regex.escape(q), text))
    return f", line {text.count(chr(10), 0, starts[nth - 1]) + 1}" if len(starts) >= nth else ""
