"""Every graph tensor llama.cpp computes for one sequence, through llama-cpp-python's low-level API
and its eval callback (``cb_eval``): what a llama.cpp user reads to see inside the graph.

Only float32 tensors in host memory are copied (the CPU backend's); each is read through its own
strides (``nb``), so views come out as the values they show. ggml's ``ne`` lists the fastest
dimension first: an activation [pos, width] has ne = [width, pos]."""

from __future__ import annotations

import ctypes

import numpy as np

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64


class GGMLTensor(ctypes.Structure):
    """ggml.h's ``struct ggml_tensor``, as far as its name and data."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
                ("nb", ctypes.c_size_t * GGML_MAX_DIMS), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * GGML_MAX_NAME), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


def capture(path, tokens, threads: int = 1) -> dict[str, np.ndarray]:
    """{graph tensor name: float32 array in NumPy order} of llama.cpp's forward pass over ``tokens``."""
    import llama_cpp as lc

    captured: dict[str, np.ndarray] = {}

    @lc.ggml_backend_sched_eval_callback
    def callback(t, ask, user_data):
        if ask:
            return True  # every tensor
        tensor = ctypes.cast(t, ctypes.POINTER(GGMLTensor)).contents
        if tensor.type != 0 or not tensor.data:  # GGML_TYPE_F32, in host memory
            return True
        ne, nb = list(tensor.ne), list(tensor.nb)
        span = sum((n - 1) * stride for n, stride in zip(ne, nb)) + 4
        flat = np.frombuffer((ctypes.c_char * span).from_address(tensor.data), dtype=np.float32)
        view = np.lib.stride_tricks.as_strided(flat, shape=ne[::-1], strides=nb[::-1])
        captured[tensor.name.decode()] = np.array(view).reshape([n for n in ne[::-1] if n != 1] or [1])
        return True

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    params = lc.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = max(16, len(tokens))
    params.n_threads = params.n_threads_batch = threads
    params.cb_eval = callback
    context = lc.llama_init_from_model(model, params)
    batch = lc.llama_batch_init(len(tokens), 0, 1)
    try:
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(token), i, 1, True
            batch.seq_id[i][0] = 0
        assert lc.llama_decode(context, batch) == 0
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(context)
        lc.llama_model_free(model)
    return captured


def capture_in_process(path, tokens, out, lib_path=None) -> dict[str, np.ndarray]:
    """``capture`` in a fresh interpreter (with ``lib_path``: llama-cpp-python loading the libllama
    and libggml* there, through its ``LLAMA_CPP_LIB_PATH``), its tensors passed back in ``out`` (.npz)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    if lib_path is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib_path)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    script = ("import sys, numpy as np; from llama_cpp_capture import capture; "
              "np.savez(sys.argv[2], **capture(sys.argv[1], [int(t) for t in sys.argv[3:]]))")
    run = subprocess.run([sys.executable, "-c", script, str(path), str(out), *map(str, tokens)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(out) as npz:
        return {name: npz[name] for name in npz.files}
