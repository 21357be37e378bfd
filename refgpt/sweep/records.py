"""OUT, the directory a sweep writes: one record per prompt, a manifest and a summary.

    OUT/sweep.json               what was swept: task, options, model (and its weights' sha256),
                                 dtype, --bos, refgpt version. A re-run must match it: OUT never
                                 mixes results of two models, tasks or versions
    OUT/records/ID.HASH.json     one record per prompt (named as refgpt/sweep/prompts.py says)
    OUT/goldens/ID.HASH.safetensors   --task golden: the prompt's golden file
    OUT/manifest.jsonl           one line per prompt, in prompt-id order: id, content hash, status
                                 ("ok", "failed" or "missing"), record, error, files
    OUT/summary.json             the task's reductions over the corpus, in prompt-id order; written
                                 only when every prompt has a record (ok or failed)

A record (JSON): format, id, content_sha256, task, status ("ok"/"failed"), error (one line, or
null), provenance (the weights' sha256, refgpt version, dtype, NumPy, BLAS library, version, kernel
and threads, the tokens run), result (the task's), files (what the result vouches for: path,
sha256, bytes) and record_sha256, the sha256 of the record's canonical JSON without that key.

**Verified** (what lets a re-run skip a prompt): the record parses, its record_sha256 matches, it
is of this prompt (id and content hash), of this sweep (task, weights, refgpt version, dtype),
has status ok, and each file it names exists with its size and sha256. Anything else — no record,
a failed one, a damaged one — and the prompt runs again.

Every file is written by ``write_atomically`` (a temporary, then a rename), records by the one
process that runs the sweep: Ctrl-C, a full disk or a killed worker leave complete records or
none. A lock (OUT/.lock, flock) keeps a second sweep out of OUT while one runs; temporaries left by
a killed process are removed at the start of the next run and when the sweep ends.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from .. import strict_json
from ..errors import RefGPTError, as_path
from ..files.atomic_write import write_atomically
from ..version import __version__
from .prompts import Prompt
from .task_golden import GOLDEN_DIR, file_identity
from .worker import FORMAT_VERSION, RECORD_FORMAT

SWEEP_FORMAT = "refgpt-sweep"
SUMMARY_FORMAT = "refgpt-sweep-summary"
RECORDS = "records"


def canonical(value) -> str:
    return strict_json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sealed(record: dict) -> dict:
    """``record`` with its record_sha256."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return {**body, "record_sha256": hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()}


class SweepDirectory:
    """OUT (module docstring), locked for this sweep until ``close``."""

    def __init__(self, out):
        self.path = as_path(out, "-o OUT").absolute()
        if self.path.exists() and not self.path.is_dir():
            raise RefGPTError(f"-o {self.path}: exists and is not a directory")
        try:
            for d in (self.path, self.path / RECORDS, self.path / GOLDEN_DIR):
                d.mkdir(exist_ok=True, parents=d == self.path)
        except OSError as error:
            raise RefGPTError(f"-o {self.path}: cannot create ({error.strerror})") from None
        self._lock = open(self.path / ".lock", "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RefGPTError(f"-o {self.path}: another sweep is writing to it now") from None
        self.remove_temporaries()

    def close(self):
        self.remove_temporaries()
        self._lock.close()  # releases the flock

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # ---- the sweep itself ----------------------------------------------------------------------

    def check_spec(self, identity: dict, info: dict) -> None:
        """Refuse an OUT made by another sweep (``identity``: task, options, weights, dtype, --bos,
        refgpt version must all agree); a new OUT gets sweep.json (``info`` too: the model's path,
        which may move without changing the sweep)."""
        path = self.path / "sweep.json"
        identity = {"format": SWEEP_FORMAT, "format_version": FORMAT_VERSION, **identity}
        if path.exists():
            found = strict_json.loads(path.read_bytes(), str(path))
            if not isinstance(found, dict) or {k: found.get(k) for k in identity} != identity:
                found = found if isinstance(found, dict) else {}
                differ = sorted(k for k in identity if found.get(k) != identity[k])
                raise RefGPTError(f"-o {self.path}: holds a sweep with another {', '.join(differ)} "
                                  f"(see {path}); give a new -o, or delete it to start again")
            return
        if any((self.path / RECORDS).iterdir()):
            raise RefGPTError(f"-o {self.path}: has records but no sweep.json; give a new -o")
        self._write(path, strict_json.dumps({**identity, **info}, indent=1, sort_keys=True, ensure_ascii=False) + "\n")

    # ---- records ---------------------------------------------------------------------------------

    def record_path(self, prompt: Prompt) -> Path:
        return self.path / RECORDS / f"{prompt.stem}.json"

    def write_record(self, prompt: Prompt, record: dict) -> None:
        self._write(self.record_path(prompt), strict_json.dumps(sealed(record), ensure_ascii=False) + "\n")  # one line

    def read_record(self, prompt: Prompt) -> dict | None:
        """The prompt's record as written (ok or failed), or None if none is there or it is damaged."""
        path = self.record_path(prompt)
        try:
            record = strict_json.loads(path.read_bytes(), str(path))
        except (OSError, RefGPTError):
            return None
        if not isinstance(record, dict) or sealed(record).get("record_sha256") != record.get("record_sha256"):
            return None
        if (record.get("format"), record.get("id"), record.get("content_sha256")) != (RECORD_FORMAT, prompt.id,
                                                                                     prompt.content_sha256):
            return None
        return record

    def verified(self, prompt: Prompt, task: str, model_sha256: dict, dtype: str) -> dict | None:
        """The prompt's record if it is complete and of this sweep (module docstring), else None."""
        record = self.read_record(prompt)
        if record is None or record.get("status") != "ok" or record.get("task") != task:
            return None
        p = record.get("provenance") or {}
        if (p.get("model_sha256"), p.get("refgpt_version"), p.get("dtype")) != (model_sha256, __version__, dtype):
            return None
        for f in record.get("files") or []:
            try:
                path = Path(f["path"]) if Path(f["path"]).is_absolute() else self.path / f["path"]
                if path.stat().st_size != f["bytes"] or file_identity(path, f["path"]) != f:
                    return None
            except (OSError, KeyError, TypeError):
                return None
        return record

    # ---- manifest and summary --------------------------------------------------------------------

    def write_manifest(self, prompts: list[Prompt], records: dict) -> Path:
        """manifest.jsonl: one line per prompt in prompt-id order (``records``: id → record, or absent)."""
        lines = []
        for p in prompts:
            r = records.get(p.id)
            line = {"id": p.id, "content_sha256": p.content_sha256,
                    "status": "missing" if r is None else r["status"],
                    "record": f"{RECORDS}/{p.stem}.json" if r is not None else None}
            if r is not None and r["status"] == "failed":
                line["error"] = r["error"]
            if r is not None and r.get("files"):
                line["files"] = [f["path"] for f in r["files"]]
            if r is not None and r["provenance"].get("tokens") is not None:
                line["n_tokens"] = len(r["provenance"]["tokens"])
            lines.append(strict_json.dumps(line, ensure_ascii=False))
        return self._write(self.path / "manifest.jsonl", "".join(line + "\n" for line in lines))

    def write_summary(self, summary: dict) -> Path:
        return self._write(self.path / "summary.json", strict_json.dumps(summary, indent=1, ensure_ascii=False) + "\n")

    def remove_summary(self) -> None:
        (self.path / "summary.json").unlink(missing_ok=True)

    # ---- files -----------------------------------------------------------------------------------

    def _write(self, path: Path, text: str) -> Path:
        return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def remove_temporaries(self) -> None:
        """Delete the temporaries (.NAME.PID.XXXXXXXX.tmp, refgpt/files/atomic_write.py) a killed
        writer left in OUT, records/ and goldens/."""
        for d in (self.path, self.path / RECORDS, self.path / GOLDEN_DIR):
            for tmp in d.glob(".*.tmp"):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
