"""Run one of TransformerLens's demo notebooks (tests/tl_torch/notebooks/) cell by cell, in an IPython
shell of its own process, on refgpt's torch-facing model, on TransformerLens 3.9 or on TransformerLens
4's TransformerBridge (with tests/tl_torch/tl4.py's TransformerLens 4 first on the path), and record
what every cell did, for tests/tl_torch/test_notebooks.py to compare:

    python notebook_runner.py NOTEBOOK.ipynb … --backend refgpt|tl|bridge --checkpoints JSON --out DIR [--long]

The cells run as written. The one change is the loading line: ``TransformerBridge.boot_transformers(
"gpt2", …)`` or ``HookedTransformer.from_pretrained("gpt2-medium", …)`` loads from the random
checkpoint standing in for that name (``--checkpoints``: name → directory), with refgpt's class
(``refgpt.tl_torch``) or TransformerLens's, float64, from the same checkpoint, its own weight
processing kept in float64 (tests/peers.py: ``tl_from_checkpoint``, ``bridge_from_checkpoint``).
The rest of each cell is untouched; TransformerLens's ``utils``, ``patching``, ``ActivationCache``
… are the installed TransformerLens's (3.9 with refgpt, as a TransformerLens 3.9 user has them).

The shell is TransformerLens's CI setting: ``GITHUB_ACTIONS=true`` (the notebooks' ``IN_GITHUB``),
cells marked ``# NBVAL_SKIP`` skipped unless ``--long``, the hub offline, torch's and NumPy's
generators seeded before the first cell. ``%pip`` installs nothing. Display-only libraries
(plotly, circuitsvis, neel_plotly, pysvelte) are recording stand-ins (notebooks/stubs/): what a
figure would show is compared like any other value.

Each cell's record: status ("ok", "error" with its traceback, "skipped"), seconds, stdout, the
display calls, and a fingerprint of every notebook variable the cell created or changed (tensors
and arrays by value: up to 100,000 elements in full, larger ones by a fixed sample of 100,000 and
their largest magnitude; numbers, strings, lists, dicts, caches and FactoredMatrix factors by
value; functions, modules and models by type only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIMIT = 100_000  # elements kept of one tensor
LOADING = re.compile(r"\b(TransformerBridge\.boot_transformers|HookedTransformer\.from_pretrained)\(\s*\"([^\"]+)\"")


def code_cells(notebook: Path) -> list[str]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def rewrite_loading(source: str, checkpoints: dict, backend: str) -> str:
    """The loading line, pointed at the checkpoint and the backend's class; other lines unchanged."""
    def swap(m):
        name = m.group(2)
        if name not in checkpoints:
            return m.group(0)  # another model (attn-only-2l, …): left as written
        owner = "__refgpt__" if backend == "refgpt" else "__peer__"
        return f"{owner}.{m.group(1)}({json.dumps(checkpoints[name])}"
    return LOADING.sub(swap, source)


# ---- fingerprints ---------------------------------------------------------------------------------


def fingerprint(x, depth=0):
    """A comparable, picklable summary of a value (module docstring)."""
    import numpy as np
    import torch

    if depth > 6:
        return ("deep",)
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return _array_print(t.resolve_conj().resolve_neg().cpu().numpy(), str(t.dtype))
    if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
        return _array_print(x, str(x.dtype))
    if isinstance(x, (bool, int, float, complex, str, type(None), np.generic)):
        return ("scalar", x.item() if isinstance(x, np.generic) else x)
    if isinstance(x, (list, tuple)):
        items = list(x)
        if len(items) > 4096:
            items = items[:: len(items) // 4096 + 1]
        return (type(x).__name__ if type(x) in (list, tuple) else "tuple", [fingerprint(v, depth + 1) for v in items])
    if isinstance(x, dict):
        return ("dict", {str(k): fingerprint(v, depth + 1) for k, v in list(x.items())[:4096]})
    if hasattr(x, "cache_dict") and isinstance(getattr(x, "cache_dict"), dict):  # an ActivationCache
        return ("cache", {k: fingerprint(v, depth + 1) for k, v in x.cache_dict.items()})
    if hasattr(x, "ldim") and hasattr(x, "A") and hasattr(x, "B"):  # a FactoredMatrix
        return ("factored", fingerprint(x.A, depth + 1), fingerprint(x.B, depth + 1))
    return None  # not data: compared by nothing


def _array_print(a, dtype):
    import numpy as np

    shape = tuple(a.shape)
    flat = a.reshape(-1)
    if flat.size > LIMIT:
        peak = float(np.max(np.abs(flat))) if flat.dtype.kind in "fc" and flat.size else None
        flat = flat[np.linspace(0, flat.size - 1, LIMIT).astype(np.int64)]
        return ("array", dtype, shape, np.array(flat), peak)
    return ("array", dtype, shape, np.array(flat), None)


def _digest(fp) -> str:
    return hashlib.sha256(pickle.dumps(fp, protocol=4)).hexdigest()


def _is_variable(name, value) -> bool:
    if name.startswith("_") or name in ("In", "Out", "get_ipython", "exit", "quit", "open"):
        return False
    return not isinstance(value, (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType))


# ---- the backends' loaders ------------------------------------------------------------------------


def refgpt_loaders():
    import refgpt.tl_torch as tl_torch

    return types.SimpleNamespace(TransformerBridge=tl_torch.TransformerBridge,
                                 HookedTransformer=tl_torch.HookedTransformer)


def tl_loaders():
    """TransformerLens 3.9: a float64 HookedTransformer for either loading line (peers.tl_from_checkpoint)."""
    import peers

    class TransformerBridge:
        @staticmethod
        def boot_transformers(path, device=None, **kwargs):
            return peers.tl_from_checkpoint(path)

    class HookedTransformer:
        @staticmethod
        def from_pretrained(path, fold_ln=True, center_writing_weights=True, center_unembed=True,
                            fold_value_biases=True, refactor_factored_attn_matrices=False, device=None, **kwargs):
            return peers.tl_from_checkpoint(path, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                            center_unembed=center_unembed, fold_value_biases=fold_value_biases,
                                            refactor_factored_attn_matrices=refactor_factored_attn_matrices)

    return types.SimpleNamespace(TransformerBridge=TransformerBridge, HookedTransformer=HookedTransformer)


def bridge_loaders():
    """TransformerLens 4's TransformerBridge, float64 (peers.bridge_from_checkpoint); its stand-in for
    ``HookedTransformer.from_pretrained`` is ``boot_transformers`` + ``enable_compatibility_mode``."""
    import peers

    class TransformerBridge:
        @staticmethod
        def boot_transformers(path, device=None, **kwargs):
            return peers.bridge_from_checkpoint(path)

    class HookedTransformer:
        @staticmethod
        def from_pretrained(path, device=None, **flags):
            bridge = peers.bridge_from_checkpoint(path)
            bridge.enable_compatibility_mode(**flags)
            return bridge

    return types.SimpleNamespace(TransformerBridge=TransformerBridge, HookedTransformer=HookedTransformer)


def keeps_rng(loaders):
    """The loaders, each leaving torch's and NumPy's global generators as it found them: building an
    HF model draws random initial weights before loading the checkpoint over them, and the cells
    after the loading line (torch.randint …) must see the same random numbers in every backend."""
    import random

    import numpy as np
    import torch

    def wrap(fn):
        def load(*args, **kwargs):
            states = torch.get_rng_state(), np.random.get_state(), random.getstate()
            try:
                return fn(*args, **kwargs)
            finally:
                torch.set_rng_state(states[0])
                np.random.set_state(states[1])
                random.setstate(states[2])
        return load

    return types.SimpleNamespace(
        TransformerBridge=types.SimpleNamespace(boot_transformers=wrap(loaders.TransformerBridge.boot_transformers)),
        HookedTransformer=types.SimpleNamespace(from_pretrained=wrap(loaders.HookedTransformer.from_pretrained)))


LOADERS = {"refgpt": refgpt_loaders, "tl": tl_loaders, "bridge": bridge_loaders}


# ---- running -----------------------------------------------------------------------------------------


def run(notebooks: list[Path], backend: str, checkpoints: dict, long: bool, skip: dict, out: Path) -> None:
    os.environ.update(GITHUB_ACTIONS="true", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1")
    sys.path.insert(0, str(HERE / "notebooks" / "stubs"))
    sys.path.insert(0, str(HERE.parent))
    import warnings

    warnings.filterwarnings("ignore")
    import random

    import numpy as np
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    import display_record

    torch.set_num_threads(1)
    shell = InteractiveShell.instance()
    shell.register_magic_function(lambda line: None, "line", "pip")  # never install anything
    loaders = keeps_rng(LOADERS[backend]())
    owner = "__refgpt__" if backend == "refgpt" else "__peer__"
    for notebook in notebooks:
        shell.reset(new_session=True)
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        shell.user_ns[owner] = loaders
        records, seen = [], {}
        skipped = set(skip.get(notebook.stem, ()))
        for index, source in enumerate(code_cells(notebook)):
            record = {"index": index, "source": source, "stdout": "", "displays": [], "values": {}, "seconds": 0.0}
            if ("NBVAL_SKIP" in source and not long) or index in skipped:
                record["status"] = "skipped"
                records.append(record)
                continue
            code = rewrite_loading(source, checkpoints, backend)
            record["rewritten"] = code != source
            display_record.CALLS.clear()
            start = time.perf_counter()
            with capture_output(stdout=True, stderr=True, display=True) as captured:
                result = shell.run_cell(code, store_history=True)
            record["seconds"] = time.perf_counter() - start
            record["stdout"] = captured.stdout + "".join(o.data.get("text/plain", "") + "\n" for o in captured.outputs)
            error = result.error_in_exec or result.error_before_exec
            record["status"] = "ok" if error is None else "error"
            if error is not None:
                record["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
            record["displays"] = [(what, fingerprint(list(args)), fingerprint(kwargs))
                                  for what, args, kwargs in display_record.CALLS]
            for name, value in list(shell.user_ns.items()):
                if not _is_variable(name, value):
                    continue
                fp = fingerprint(value)
                if fp is None:
                    continue
                digest = _digest(fp)
                if seen.get(name) != digest:
                    seen[name] = digest
                    record["values"][name] = fp
            records.append(record)
        with open(out / f"{notebook.stem}.{backend}.pkl", "wb") as f:
            pickle.dump(records, f, protocol=4)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", type=Path, nargs="+")
    parser.add_argument("--backend", choices=sorted(LOADERS), required=True)
    parser.add_argument("--checkpoints", required=True, help="JSON: model name → checkpoint directory")
    parser.add_argument("--out", type=Path, required=True, help="directory for NOTEBOOK.BACKEND.pkl")
    parser.add_argument("--long", action="store_true", help="also the cells TransformerLens's CI skips (NBVAL_SKIP)")
    parser.add_argument("--skip", default="{}", help="JSON: notebook name → cell indices not to run")
    args = parser.parse_args(argv)
    run(args.notebooks, args.backend, json.loads(args.checkpoints), args.long, json.loads(args.skip), args.out)


if __name__ == "__main__":
    main()
