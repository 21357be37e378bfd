"""Which files of a checkpoint directory belong together: the manifest ``refgpt.save`` writes last.

``refgpt.save`` switches a checkpoint directory as one unit (refgpt/files/atomic_write.py), so no
kill mixes two saves. A directory can still be mixed by other hands — a ``config.json`` copied in
from another model, a copy that stopped halfway, transformers' ``save_pretrained`` over part of a
refgpt directory — and a mix loads silently (another eps, another activation: other logits). So the
save records, in ``refgpt-manifest.json``, what it wrote::

    {"format": "refgpt-checkpoint", "format_version": "1", "save": "<32 hex digits>",
     "files": {"model.safetensors": {"bytes": 8809784, "sha256": "…"},
               "vocab.json": {…}, "merges.txt": {…}, "config.json": {…}}}

and ``refgpt.load`` checks, once it has read and checked every file on its own terms (so a broken
file is still named for what is wrong with it): every file the manifest lists is there with its
size; each one but the weights hashes to its sha256 (they are small); the weights carry the same
save id in their safetensors metadata (``refgpt_save``: the first 32 hex digits of the sha256 of
everything the save wrote, so saving one model twice writes the same bytes, and no save of
another model carries it). The weights' sha256 is recorded for a full check by hand (``sha256sum``)
but not recomputed on every load: hashing GPT-2 XL's 6 GB would cost seconds each time, and the
save id already tells one save's weights from another's.

Files the manifest does not list are not its business: a tokenizer added beside weights saved
without one loads, as it always did. A directory without a manifest is an ordinary HF checkpoint
(written by transformers, by hand, or by refgpt before 0.3) and loads as before. A deliberate
change of a saved file (an edited config.json) is refused as a mix until the manifest is deleted;
the error says so.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .. import strict_json
from ..errors import RefGPTError
from .whole_file import read_bytes

MANIFEST = "refgpt-manifest.json"
FORMAT = "refgpt-checkpoint"
FORMAT_VERSION = "1"
WEIGHTS = "model.safetensors"
_SAVE_ID = re.compile(r"[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REMEDY = f"if the change is deliberate, delete {MANIFEST}"


def file_entry(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest} of a file, as the manifest records it."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def manifest_text(save_id: str, files: dict[str, dict]) -> str:
    """The manifest's JSON for a save of these files (name → ``file_entry``)."""
    return json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "save": save_id,
                       "files": files}, indent=1) + "\n"


def check(directory: Path) -> None:
    """Refuse a directory whose manifest does not match its files (see the module docstring).
    Nothing without a manifest."""
    path = directory / MANIFEST
    if not path.is_file():
        return
    save_id, files = _read(path)
    for name, entry in files.items():
        file = directory / name
        if not file.is_file():
            raise RefGPTError(f"{directory}: {MANIFEST} records {name}, which is missing: the directory does "
                              f"not hold the whole save it records (an interrupted copy?); {_REMEDY}")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise RefGPTError(f"{file}: {size} bytes, but {MANIFEST} records {entry['bytes']}: the file is not the "
                              f"one this save wrote; the directory mixes files of different origins; {_REMEDY}")
        if name == WEIGHTS:
            found = _weights_save_id(file)
            if found != save_id:
                raise RefGPTError(f"{file}: written by another save ({'save ' + found if found else 'no refgpt save id'}) "
                                  f"than the rest of the directory ({MANIFEST}: save {save_id}): the directory "
                                  f"mixes files of different origins; {_REMEDY}")
        elif file_entry(file)["sha256"] != entry["sha256"]:
            raise RefGPTError(f"{file}: its sha256 is not the one {MANIFEST} records: the file is not the one this "
                              f"save wrote; the directory mixes files of different origins; {_REMEDY}")


def _read(path: Path) -> tuple[str, dict[str, dict]]:
    doc = strict_json.loads(read_bytes(path, MANIFEST), f"{path}: not a valid {MANIFEST}")
    bad = f"{path}: not a valid {MANIFEST}"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RefGPTError(f"{bad}: 'format' must be {FORMAT!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise RefGPTError(f"{bad}: format_version {doc.get('format_version')!r}; this refgpt reads {FORMAT_VERSION!r}")
    save_id, files = doc.get("save"), doc.get("files")
    if not isinstance(save_id, str) or not _SAVE_ID.fullmatch(save_id):
        raise RefGPTError(f"{bad}: 'save' must be 32 hex digits, found {save_id!r:.60}")
    if not isinstance(files, dict) or not files:
        raise RefGPTError(f"{bad}: 'files' must be a non-empty object of file name → entry")
    for name, entry in files.items():
        if not name or Path(name).name != name or name in (".", ".."):
            raise RefGPTError(f"{bad}: {name!r:.60} is not a file name in the directory")
        if (not isinstance(entry, dict) or type(entry.get("bytes")) is not int or entry["bytes"] < 0
                or not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"])):
            raise RefGPTError(f"{bad}: the entry of {name!r} must be {{\"bytes\": size, \"sha256\": 64 hex digits}}, "
                              f"found {entry!r:.80}")
    return save_id, files


def _weights_save_id(path: Path) -> str | None:
    """The ``refgpt_save`` id in a safetensors file's metadata, or None (none, or no readable header)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > 100_000_000:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    found = metadata.get("refgpt_save") if isinstance(metadata, dict) else None
    return found if isinstance(found, str) else None
