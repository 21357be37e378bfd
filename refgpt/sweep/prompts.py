"""The prompts of a sweep: reading PROMPTS, and each prompt's id, content hash, order and name.

PROMPTS is one of

- a text file: one prompt per line, UTF-8. The line ending (``\\n``, or ``\\r\\n``) is not part of
  the prompt; empty lines are skipped. A prompt's id is its line number (1, 2, …), so ids stay the
  same when a line is edited or appended.
- a JSON Lines file (a name ending in ``.jsonl`` or ``.ndjson``, or ``format="jsonl"``): one JSON
  object per line, ``{"id": …, "text": "…"}`` or ``{"id": …, "tokens": [ids]}``. The id is a
  string or an integer, unique in the file (``7`` and ``"7"`` are the same id); other keys are
  ignored. ``tokens`` are run as given (``--bos`` puts <|endoftext|> before *text* only).

A malformed file (bad UTF-8, a line that is not a JSON object, no id, both or neither of text and
tokens, tokens that are not a list of integers, a repeated id) is refused before anything runs, as
a ``RefGPTError`` naming the file and line. Tokens out of the vocabulary, an empty prompt or one
longer than the context are found when the prompt runs: that prompt fails, the sweep goes on.

**Content hash**: the sha256 of the prompt's canonical JSON (``{"text": …}`` or
``{"tokens": […]}``, sorted keys, no spaces), so a record in OUT is known to belong to this
prompt's content, not only to its id. **Record name** (``Prompt.stem``): the id, escaped for a file
name (``%XX`` for every byte outside ``A-Za-z0-9_-``, so two ids never share a name; a long id is
cut and its own hash added), then ``.`` and the first 12 hex digits of the content hash.

**Order** (``Prompt.order``): prompt-id order, the order every reduction is computed in: ids that
are whole numbers by value (so line 10 comes after line 9), then the others as strings.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .. import strict_json
from ..errors import RefGPTError, as_path
from ..files.whole_file import read_bytes

FORMATS = ("text", "jsonl")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
_SAFE = re.compile(rb"[A-Za-z0-9_-]")
_WHOLE = re.compile(r"-?[0-9]+")
MAX_ID_IN_NAME = 80  # characters of the escaped id kept in a record's name


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``id`` (a string: a line number or the JSONL id), and ``text`` or ``tokens``."""

    id: str
    text: str | None = None
    tokens: tuple[int, ...] | None = None

    @property
    def content(self) -> dict:
        return {"text": self.text} if self.text is not None else {"tokens": list(self.tokens)}

    @property
    def content_sha256(self) -> str:
        canonical = json.dumps(self.content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def stem(self) -> str:
        """The name of this prompt's record (and golden file), without the extension."""
        return f"{escaped_id(self.id)}.{self.content_sha256[:12]}"

    @property
    def order(self) -> tuple:
        return order_key(self.id)

    def to_json(self) -> dict:
        """What a worker is sent for this prompt (small: an id and its text or tokens)."""
        return {"id": self.id, **self.content}

    @classmethod
    def from_json(cls, d: dict) -> Prompt:
        tokens = d.get("tokens")
        return cls(d["id"], d.get("text"), tuple(tokens) if tokens is not None else None)


def order_key(prompt_id: str) -> tuple:
    """Prompt-id order: whole-number ids by value, then the others as strings."""
    if _WHOLE.fullmatch(prompt_id):
        return (0, int(prompt_id), prompt_id)
    return (1, 0, prompt_id)


def escaped_id(prompt_id: str) -> str:
    """``prompt_id`` as a file-name part: %XX for each UTF-8 byte outside A-Za-z0-9_- (injective);
    an id whose escaped form is longer than MAX_ID_IN_NAME is cut and the sha256 of the whole id
    added, so names stay short and still differ."""
    raw = prompt_id.encode("utf-8")
    escaped = "".join(chr(b) if _SAFE.fullmatch(bytes([b])) else f"%{b:02X}" for b in raw)
    if len(escaped) > MAX_ID_IN_NAME:
        escaped = f"{escaped[:MAX_ID_IN_NAME - 17]}~{hashlib.sha256(raw).hexdigest()[:16]}"
    return escaped


def read_prompts(path, format: str | None = None) -> list[Prompt]:
    """The prompts of PROMPTS (module docstring), in prompt-id order."""
    path = as_path(path, "PROMPTS")
    if format is None:
        format = "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "text"
    if format not in FORMATS:
        raise RefGPTError(f"prompts format must be one of {list(FORMATS)}, found {format!r}")
    lines = _lines(path, read_bytes(path, "prompts file"))
    prompts = _jsonl(path, lines) if format == "jsonl" else _text(lines)
    if not prompts:
        raise RefGPTError(f"{path}: no prompts (every line is empty)")
    seen = {}
    for n, prompt in prompts:
        if prompt.id in seen:
            raise RefGPTError(f"{path}, line {n}: id {prompt.id!r} is already the id of line {seen[prompt.id]}")
        seen[prompt.id] = n
    return sorted((p for _, p in prompts), key=lambda p: p.order)


def _lines(path: Path, data: bytes) -> list[str]:
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RefGPTError(f"{path}, line {n}: not UTF-8 text (byte {error.start + 1} of the line)") from None
    text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not part of the first prompt
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start an empty one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _text(lines) -> list[tuple[int, Prompt]]:
    return [(n, Prompt(str(n), text=line)) for n, line in enumerate(lines, 1) if line != ""]


def _jsonl(path: Path, lines) -> list[tuple[int, Prompt]]:
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        item = strict_json.loads(line, where)
        if not isinstance(item, dict):
            raise RefGPTError(f"{where}: expected a JSON object {{\"id\": …, \"text\": …}}, found {type(item).__name__}")
        if "id" not in item:
            raise RefGPTError(f"{where}: no \"id\"")
        prompt_id = item["id"]
        if isinstance(prompt_id, bool) or not isinstance(prompt_id, (str, int)):
            raise RefGPTError(f"{where}: \"id\" must be a string or an integer, found {prompt_id!r:.40}")
        if isinstance(prompt_id, str) and prompt_id == "":
            raise RefGPTError(f"{where}: \"id\" is empty")
        has_text, has_tokens = "text" in item, "tokens" in item
        if has_text == has_tokens:
            raise RefGPTError(f"{where}: give \"text\" or \"tokens\", {'not both' if has_text else 'found neither'}")
        if has_text:
            if not isinstance(item["text"], str):
                raise RefGPTError(f"{where}: \"text\" must be a string, found {type(item['text']).__name__}")
            prompts.append((n, Prompt(str(prompt_id), text=item["text"])))
            continue
        tokens = item["tokens"]
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise RefGPTError(f"{where}: \"tokens\" must be a list of integer token ids, found {tokens!r:.60}")
        prompts.append((n, Prompt(str(prompt_id), tokens=tuple(tokens))))
    return prompts
