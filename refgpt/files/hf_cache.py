"""The Hugging Face hub cache on disk: where it is, how a repository is laid out in it, and which
snapshot a name like ``gpt2`` or ``openai-community/gpt2@v1`` means.

refgpt reads and writes exactly the layout huggingface_hub writes (``file_download.py``:
``repo_folder_name``, ``_create_symlink``, ``_cache_commit_hash_for_specific_revision``,
``try_to_load_from_cache``), so a model that transformers or TransformerLens downloaded is found
here, and one that ``refgpt download`` fetched is found by them::

    $HF_HUB_CACHE/                                     default ~/.cache/huggingface/hub
      models--openai-community--gpt2/                  "models--" + repo id with "/" → "--"
        refs/main                                      the commit hash main points at (no newline)
        blobs/<etag>                                   each file's bytes, named by the hub's ETag:
                                                       sha256 for LFS files, git blob sha1 otherwise
        snapshots/<commit>/config.json → ../../blobs/<etag>    relative symlinks, one per file
        snapshots/<commit>/model.safetensors → ../../blobs/<etag>

Where the cache is, as ``huggingface_hub.constants`` decides it: ``HF_HUB_CACHE``, else the older
``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (``~`` and ``$VARS`` expanded). ``HF_HUB_OFFLINE=1`` (or
``TRANSFORMERS_OFFLINE=1``) means: never contact the hub.

The five GPT-2s OpenAI released moved from a bare name (``gpt2``) to an organisation
(``openai-community/gpt2``; ``distilgpt2`` to ``distilbert/distilgpt2``). The hub redirects the old
names, but a cache folder is named after the name that was *asked for*: transformers'
``from_pretrained("gpt2")`` and TransformerLens 3.9 write ``models--gpt2``, newer code
``models--openai-community--gpt2``. Either spelling finds either folder here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from pathlib import Path

from ..errors import RefGPTError
from .atomic_write import write_atomically

#: The bare names of GPT-2 checkpoints and the organisation repositories they moved to.
RENAMED = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}

# huggingface_hub's validate_repo_id: [namespace/]name of ASCII letters, digits, "-", "_", ".",
# neither starting nor ending with "-" or "." and at most 96 characters each; no "--" or "..".
_REPO_PART = r"(?=[A-Za-z0-9_])[\w.-]{1,96}(?<=[A-Za-z0-9_])"
_REPO_ID = re.compile(rf"{_REPO_PART}(/{_REPO_PART})?", re.ASCII)
COMMIT = re.compile(r"[0-9a-f]{40}")  # a full commit hash, as huggingface_hub's REGEX_COMMIT_HASH
# A relative path inside a folder: name characters in "/"-separated parts, none of them "." or "..".
# Branch and tag names (also "refs/pr/1") and shard file names must be one, since they become paths.
RELATIVE_NAME = re.compile(r"(?!(.*/)?\.\.?(/|$))[\w.\-]+(/[\w.\-]+)*", re.ASCII)

#: The file naming the weights when a checkpoint is split into shards.
SHARD_INDEX = "model.safetensors.index.json"


def is_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to 1/ON/YES/TRUE, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in {"1", "ON", "YES", "TRUE"}


def cache_dir() -> Path:
    """The hub cache directory, from the same environment variables and defaults as huggingface_hub."""
    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    xdg = os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    hf_home = expand(os.getenv("HF_HOME", os.path.join(xdg, "huggingface")))
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home, "hub"))
    return Path(expand(os.getenv("HF_HUB_CACHE", legacy)))


def parse_name(name: str) -> tuple[str, str] | None:
    """``owner/name@revision`` → (repo id, revision; "main" if none), or None if ``name`` is no hub id."""
    repo_id, _, revision = name.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        return None
    if "@" in name and not RELATIVE_NAME.fullmatch(revision):
        return None
    return repo_id, revision or "main"


def not_a_model_directory(path: Path) -> str:
    """Why a path that exists but is not a directory is no model (a path that exists is never
    looked up on the hub, so a file is refused, not taken for a repository name)."""
    hint = (f"; give the directory it sits in, {path.parent}" if path.name.endswith(".safetensors") or
            path.name == "config.json" else "")
    return (f"{path}: a file, not a model directory: a model is an HF GPT-2 directory (config.json and "
            f"model.safetensors), a GGUF file (*.gguf) or a hub name such as gpt2{hint}")


def check_revision(revision: str) -> str:
    """A branch, tag or commit name, refused if it could leave the cache folder as a path."""
    if not isinstance(revision, str) or not RELATIVE_NAME.fullmatch(revision):
        raise RefGPTError(f"revision {revision!r}: not a branch, tag or commit name "
                          "(letters, digits, '.', '_', '-', '/'; no '.' or '..' part)")
    return revision


def spellings(repo_id: str) -> list[str]:
    """The names a cache may hold this repository under: as given first, then its other spelling."""
    bare_of = {moved: bare for bare, moved in RENAMED.items()}
    other = RENAMED.get(repo_id) or bare_of.get(repo_id)
    return [repo_id] if other is None else [repo_id, other]


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    """``models--owner--name``: huggingface_hub's repo_folder_name for a model repository."""
    return (cache or cache_dir()) / "--".join(["models", *repo_id.split("/")])


def snapshot_of(folder: Path, revision: str) -> Path | None:
    """``snapshots/<commit>`` for a commit hash, or for the commit ``refs/<revision>`` names; None if unknown."""
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = folder / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="ascii", errors="replace").strip()
        if not COMMIT.fullmatch(commit):
            raise RefGPTError(f"{ref}: not a commit hash ({commit[:60]!r}): a damaged HF cache")
    return folder / "snapshots" / commit


def shard_names(index: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` lists, each a relative name that stays
    inside its snapshot (it becomes a path there, whether downloaded or read from the cache)."""
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise RefGPTError(f"{index}: not a valid shard index ({error!r})") from None
    for shard in shards:
        if not isinstance(shard, str) or not RELATIVE_NAME.fullmatch(shard):
            raise RefGPTError(f"{index}: shard name {shard!r} is not a relative file name")
    return sorted(shards)


def missing_files(snapshot: Path) -> list[str]:
    """What a snapshot lacks to be loaded: config.json, and model.safetensors or the index and its shards."""
    missing = [] if (snapshot / "config.json").is_file() else ["config.json"]
    index = snapshot / SHARD_INDEX
    if (snapshot / "model.safetensors").is_file():
        return missing
    if not index.is_file():
        return missing + ["model.safetensors"]
    return missing + [shard for shard in shard_names(index) if not (snapshot / shard).is_file()]


def find_snapshot(repo_id: str, revision: str, cache: Path | None = None) -> tuple[Path | None, list[str]]:
    """The cached snapshot of ``repo_id`` at ``revision`` under either spelling, and where it looked.

    Returns (snapshot directory or None, one note per place looked). A snapshot is found only if it
    holds config.json and the weights; one missing them is noted (e.g. an interrupted download, or
    a cache that holds only pytorch_model.bin, which refgpt does not read). A damaged ref or shard
    index is a RefGPTError naming the file, not a reason to look elsewhere.
    """
    notes = []
    for spelling in spellings(repo_id):
        folder = repo_folder(spelling, cache)
        snapshot = snapshot_of(folder, revision)
        if snapshot is None:
            notes.append(f"{folder} (no {revision!r})" if folder.is_dir() else f"{folder} (absent)")
        elif not snapshot.is_dir():
            notes.append(f"{snapshot} (absent)")
        elif missing := missing_files(snapshot):
            notes.append(f"{snapshot} (lacks {', '.join(missing)})")
        else:
            return snapshot, notes
    return None, notes


# ---- writing, as huggingface_hub writes ------------------------------------------------------

def link_into_snapshot(folder: Path, commit: str, filename: str, etag: str) -> Path:
    """``snapshots/<commit>/<filename>`` → the blob, a relative symlink made atomically (link, rename).
    Called with the blob's lock held (refgpt.files.hub.blob_lock), which every writer of this link
    holds too: a temporary link of the same name left by a killed writer is removed here."""
    pointer = folder / "snapshots" / commit / filename
    pointer.parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"\.{re.escape(pointer.name)}\.[0-9a-f]{{8}}\.tmp")
    for entry in os.scandir(pointer.parent):
        if stale.fullmatch(entry.name) and entry.is_symlink():
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    target = os.path.relpath(folder / "blobs" / etag, pointer.parent)
    temporary = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
    os.symlink(target, temporary)
    os.replace(temporary, pointer)
    return pointer


def write_ref(folder: Path, revision: str, commit: str) -> None:
    """``refs/<revision>`` ← the commit (no newline), atomically (refgpt.files.atomic_write); nothing
    for a commit-hash revision."""
    if revision == commit:
        return
    ref = folder / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(ref, lambda tmp: tmp.write_text(commit, encoding="ascii"))
