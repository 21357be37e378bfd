"""The writers the fault suite kills and starves (tests/faults/test_writer_kills.py,
test_two_writers.py, test_full_disk.py): each with an old and a new model to write, and a reader
that says what an output holds (raising RefGPTError when it is not a valid one)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import refgpt
from random_models import random_params
from refgpt import Config, Model, RefGPTError
from refgpt.analysis import lens
from refgpt.analysis.explorer import explore
from refgpt.files import lens_directory, safetensors_file, saving
from refgpt.files.atomic_write import refuse_temporary
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode
from refgpt.oracle import golden, llmc, llmc_dump

CFG_OLD = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=32, d_vocab=259, n_ctx=6)
CFG_NEW = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=32, d_vocab=259, n_ctx=6)  # smaller: llm.c holds both
TOKENS = np.array([[1, 2, 3, 4]])


def tokenizer(merges=(("a", "b"), ("c", "d"))):
    symbols = [bytes_to_unicode()[b] for b in range(256)]
    return Tokenizer({**{c: i for i, c in enumerate(symbols)}, **{a + b: 256 + i for i, (a, b) in enumerate(merges)},
                      "<|endoftext|>": 256 + len(merges)}, list(merges))


OTHER_TOKENIZER = tokenizer([("b", "a")])


def tied(cfg, seed, dtype="float64"):
    p = random_params(cfg, seed)
    p["unembed.W_U"] = p["embed.W_E"].T
    m = Model(cfg, p, dtype=dtype)
    m.tokenizer = tokenizer()
    return m


OLD, NEW = tied(CFG_OLD, 1), tied(CFG_NEW, 2)


def _debug_state(path):
    """The old model's debug state or the new one's (its gradients are counted against its config)."""
    try:
        return llmc.read_debug_state(path, CFG_OLD.d_vocab, CFG_OLD)
    except RefGPTError:
        return llmc.read_debug_state(path, CFG_NEW.d_vocab, CFG_NEW)
NEW_NO_TOKENIZER = Model(CFG_NEW, dict(NEW.params))


@dataclass
class Writer:
    """One writer: ``write(model, out)`` makes its output from a model; ``read(out)`` says what the
    output holds (hashable), raising RefGPTError if it is not a valid one."""

    name: str
    target: str
    write: Callable
    read: Callable
    old: object = None
    new: object = None
    fresh: bool = False  # no old output: the new one is written where nothing was
    extra: list[str] = field(default_factory=list)  # other files in the directory, carried over by a save
    headerless: bool = False  # llm.c's raw acts_memory dump: its size is all a reader has (see below)

    def prepare(self, scratch: Path) -> "Writer":
        """Learn ``old`` and ``new``: the old and the new result, as read back from uninterrupted writes."""
        if self.old is None:
            scratch.mkdir(parents=True, exist_ok=True)
            self.write(OLD, scratch / self.target)
            self.old = self.read(scratch / self.target)
            self.write(NEW, scratch / self.target)
            self.new = self.read(scratch / self.target)
            assert self.old != self.new, self.name
        return self


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def model_state(directory: Path):
    m = refgpt.load(directory)
    params = hashlib.sha256(b"".join(np.ascontiguousarray(m.params[k]).tobytes() for k in sorted(m.params)))
    return (json.dumps(m.cfg.to_hf(), sort_keys=True), params.hexdigest(), m.tokenizer is not None)


def read_png(path: Path):
    refuse_temporary(path)  # matplotlib reads any name; refgpt's own readers refuse temporaries themselves
    data = Path(path).read_bytes()
    if not (data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82")):
        raise RefGPTError(f"{path}: not a whole PNG")
    return hashlib.sha256(data).hexdigest()


def write_lens_of(model, out):
    """A tuned-lens directory (config.json, params.pt, training_log.json) for ``model``."""
    n, d = model.cfg.n_layers, model.cfg.d_model
    config = lens_directory.lens_config(d, n, f"faults-{n}", lens_directory.unembed_hash(model.params["unembed.W_U"]))
    lens_directory.write_lens(out, {L: (np.eye(d) * (L + 1), np.full(d, 0.5 * n)) for L in range(n)}, config,
                              training_log=f'{{"layers": {n}}}\n')


def read_lens_dir(path: Path):
    """A lens directory is whole when it reads (config and params agree) and its log is the same lens's."""
    files = lens_directory.read_lens(path)
    n = len(files.translators)
    try:
        log = json.loads((Path(path) / "training_log.json").read_text(encoding="utf-8"))
    except ValueError:
        raise RefGPTError(f"{path}: training_log.json is not whole") from None
    if log != {"layers": n}:
        raise RefGPTError(f"{path}: training_log.json is another lens's")
    return (n, digest(Path(path) / "params.pt"), digest(Path(path) / "config.json"))


def golden_of(model):
    return golden.make(model, TOKENS[:, :3], command=["faults"])


def plot(model, out):
    """A small figure through refgpt's figure writer (plots._finish, which every plot ends in)."""
    from matplotlib.figure import Figure

    from refgpt.analysis import plots

    fig = Figure(figsize=(1, 1), dpi=40)
    fig.add_subplot().plot(np.ravel(model.params["ln_final.w"]))
    plots._finish(fig, out)


WRITERS = [
    Writer("golden.write_streamed", "g.safetensors",
           lambda m, out: golden.write_streamed(out, m, TOKENS[:, :3], command=["faults"]),
           lambda out: (golden.read(out), digest(out))[1]),
    Writer("golden.write", "g.safetensors", lambda m, out: golden.write(out, golden_of(m)),
           lambda out: (golden.read(out), digest(out))[1]),
    Writer("refgpt.save", "ck", lambda m, out: refgpt.save(m, out), model_state, extra=["README.md", "runs/"]),
    Writer("refgpt.save fresh", "ck", lambda m, out: refgpt.save(m, out), model_state, fresh=True),
    Writer("refgpt.save without a tokenizer", "ck",
           lambda m, out: refgpt.save(NEW_NO_TOKENIZER if m is NEW else m, out), model_state),
    Writer("save_tokenizer", "tok", lambda m, out: saving.save_tokenizer(m.tokenizer if m is OLD else
                                                                                     OTHER_TOKENIZER, out),
           lambda out: (refuse_temporary(out), len(Tokenizer.from_dir(out).encoder), digest(out / "vocab.json"),
                        digest(out / "merges.txt"))),
    Writer("llmc.write_model", "m.bin", lambda m, out: llmc.write_model(out, m),
           lambda out: (llmc.read_model(out), digest(out))[1]),
    Writer("llmc.write_model bfloat16", "m.bin", lambda m, out: llmc.write_model(out, m, dtype="bfloat16"),
           lambda out: (llmc.read_model(out), digest(out))[1]),
    Writer("llmc.write_debug_state", "s.bin", lambda m, out: llmc.write_debug_state(out, m, TOKENS),
           lambda out: (_debug_state(out), digest(out))[1]),
    Writer("llmc.write_activations", "a.bin",
           lambda m, out: llmc.write_activations(out, golden_of(m).tensors, m.cfg),
           lambda out: (either(lambda cfg: llmc.read_activations(out, cfg, 1, 3)), digest(out))[1], headerless=True),
    Writer("llmc.write_tokenizer", "t.bin", lambda m, out: llmc.write_tokenizer(out, m.tokenizer if m is OLD else
                                                                                  OTHER_TOKENIZER),
           lambda out: (llmc.read_tokenizer(out), digest(out))[1]),
    Writer("llmc_dump.write_dump", "d.bin", lambda m, out: llmc_dump.write_dump(out, m.cfg, dump_tensors(m)),
           lambda out: (either(lambda cfg: llmc_dump.read_dump(out, cfg)), digest(out))[1]),
    Writer("lens.save_translators", "tl.safetensors",
           lambda m, out: lens.save_translators(out, {L: (np.eye(8) * (L + 1), np.zeros(8))
                                                                       for L in range(m.cfg.n_layers)}),
           lambda out: (safetensors_file.SafetensorsFile(out), digest(out))[1]),
    Writer("lens_directory.write_lens", "lens", lambda m, out: write_lens_of(m, out), lambda out: read_lens_dir(out),
           extra=["README.md"]),
    Writer("plots (png)", "fig.png", plot, read_png),
    Writer("explorer page", "page.html", lambda m, out: explore(m, TOKENS[0]).save(out), lambda out: read_page(out)),
]


def read_page(path: Path):
    """An explorer page is whole when its data document parses and the page ends as the template does."""
    import re

    refuse_temporary(path)  # a browser opens any name; refgpt's readers refuse temporaries themselves
    text = Path(path).read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="refgpt-data">(.*?)</script>', text, re.S)
    if not found or not text.rstrip().endswith("</html>"):
        raise RefGPTError(f"{path}: not a whole explorer page")
    json.loads(found.group(1))
    return hashlib.sha256(text.encode()).hexdigest()


def either(read):
    """``read(cfg)`` with the old model's config, else the new one's (llm.c's raw files do not say)."""
    try:
        return read(CFG_OLD)
    except RefGPTError as error:
        if "temporary" in str(error):
            raise
        return read(CFG_NEW)


_DUMPS: dict[int, dict] = {}


def dump_tensors(m):
    """A dump's tensors under llm.c's names for ``m`` (made once, before any fault is injected)."""
    if id(m) not in _DUMPS:
        import tempfile

        g = golden_of(m).tensors
        with tempfile.TemporaryDirectory() as d:
            acts = llmc.read_activations(llmc.write_activations(Path(d) / "a.bin", g, m.cfg), m.cfg, 1, 3)
            _DUMPS[id(m)] = {"tokens": g["tokens"], **{k: np.array(v) for k, v in acts.items()}}
    return _DUMPS[id(m)]
