"""Polygraphy's RunResults JSON, read and written: NVIDIA's comparison tool's file of a run's outputs.

    polygraphy run model.onnx --onnxrt --onnx-outputs mark all --load-inputs tokens.json --save-outputs run.json
    refgpt compare golden.safetensors run.json --map onnx --onnx model.onnx
    refgpt golden --tokens tokens.npy --format polygraphy --onnx model.onnx -o golden.json
    polygraphy run model.onnx --onnxrt --onnx-outputs mark all --load-inputs tokens.json --load-outputs golden.json

The file is JSON: ``{"lst": [[runner, [iteration, …]]], "polygraphy_class": "RunResults"}``, each
iteration ``{"outputs": {name: array}, "runner_name": …, "polygraphy_class": "IterationResult"}``,
each array ``{"values": {"array": base64 of an .npy file, "polygraphy_class": "ndarray"},
"polygraphy_class": "LazyArray"}`` (or the inner ``ndarray`` object alone, as older versions
write). Arrays are read with ``allow_pickle=False``: an object array is refused, never unpickled.
The tensor names are the ONNX graph's, so refgpt needs the graph to name them
(``onnx_model.tensor_names``); reading and writing need no Polygraphy.
"""

from __future__ import annotations

import base64
import binascii
import io
import json

import numpy as np

from .. import strict_json
from ..errors import RefGPTError, as_path

RUNNER = "refgpt-golden"


def _array(path, name, value) -> np.ndarray:
    if isinstance(value, dict) and value.get("polygraphy_class") == "LazyArray":
        value = value.get("values")
    if not (isinstance(value, dict) and value.get("polygraphy_class") == "ndarray" and isinstance(value.get("array"), str)):
        raise RefGPTError(f"{path}: output {name!r:.80} is not a Polygraphy array (LazyArray or ndarray)")
    try:
        data = base64.b64decode(value["array"].encode("ascii"), validate=True)
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (binascii.Error, UnicodeEncodeError, ValueError, EOFError, OSError) as error:
        raise RefGPTError(f"{path}: output {name!r:.80} is not a readable .npy array ({type(error).__name__})") from None


def read(path) -> dict[str, np.ndarray]:
    """The outputs of the one runner's one iteration in a RunResults JSON file: name → array."""
    path = as_path(path, "Polygraphy JSON")
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RefGPTError(f"{path}: cannot read ({type(error).__name__})") from None
    results = strict_json.loads(text, str(path))
    if not (isinstance(results, dict) and results.get("polygraphy_class") == "RunResults"
            and isinstance(results.get("lst"), list)):
        raise RefGPTError(f"{path}: not a Polygraphy RunResults file (polygraphy run --save-outputs writes one)")
    runners = results["lst"]
    if len(runners) != 1 or not (isinstance(runners[0], list) and len(runners[0]) == 2):
        names = [r[0] for r in runners if isinstance(r, list) and r][:4]
        raise RefGPTError(f"{path}: holds {len(runners)} runners {names}; refgpt judges one runner's run: save "
                          f"each runner's outputs on its own")
    iterations = runners[0][1]
    if not (isinstance(iterations, list) and len(iterations) == 1 and isinstance(iterations[0], dict)
            and isinstance(iterations[0].get("outputs"), dict)):
        raise RefGPTError(f"{path}: runner {runners[0][0]!r:.80} has {len(iterations) if isinstance(iterations, list) else 'no'} "
                          f"iterations; refgpt judges one (the golden's tokens, one feed)")
    return {name: _array(path, name, value) for name, value in iterations[0]["outputs"].items()}


def write(path, arrays: dict, runner: str = RUNNER):
    """Write ``arrays`` (name → array) as a RunResults file of one runner's one iteration, as
    ``polygraphy run --load-outputs`` reads it."""
    from ..files.atomic_write import write_atomically

    def encoded(a):
        out = io.BytesIO()
        np.save(out, np.ascontiguousarray(a), allow_pickle=False)
        return {"values": {"array": base64.b64encode(out.getvalue()).decode("ascii"), "polygraphy_class": "ndarray"},
                "polygraphy_class": "LazyArray"}

    results = {"lst": [[runner, [{"outputs": {k: encoded(v) for k, v in arrays.items()}, "runtime": 0.0,
                                   "runner_name": runner, "polygraphy_class": "IterationResult"}]]],
               "polygraphy_class": "RunResults"}
    text = json.dumps(results, indent=1)
    return write_atomically(as_path(path, "Polygraphy JSON"), lambda tmp: tmp.write_text(text, encoding="utf-8"))
