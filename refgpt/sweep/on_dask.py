"""A sweep on Dask distributed: a LocalCluster sized to the machine, or a running cluster.

The only module of refgpt that imports Dask (the ``dask`` extra: ``pip install 'refgpt[dask]'``).

**The model, once per worker.** A worker plugin (``SweepPlugin``) is registered with the
scheduler; every worker runs its ``setup`` when it joins — at the start, and again when a worker
the nanny restarts (after a crash or a SIGKILL) comes back — and loads the model there, once:
``refgpt.load`` memory-maps weights stored in the compute dtype, so the workers of one machine
share those pages. The plugin also hashes the weight files and refuses to start if they are not
the sweep's. Tasks carry only a batch of prompts (ids and text or tokens) and return their
records: nothing big is in the task graph, and a golden file is written by the worker straight
into OUT (which must then be on a file system the workers share).

**Batches.** ``batch_size`` prompts per task (default: about four tasks per worker, at most 16
prompts each): few enough tasks for the scheduler, small enough that a killed worker's lost work is
a batch, and the progress line moves. Each prompt runs alone (no padding of prompts together), so
its record is what a pass over that prompt alone gives.

**A killed worker.** Its tasks are rescheduled by Dask on the workers left (and on the worker the
nanny restarts); the prompts run again from their text, so their records are the same. A batch
whose workers die ``distributed.scheduler.allowed-failures`` times (KilledWorker) is recorded as
failed, prompt by prompt; the next run tries those prompts again.

**The LocalCluster** (``workers=None`` or N): worker processes, one task at a time each
(threads_per_worker=1), on 127.0.0.1, no dashboard. Size: by default one worker per core
(dask.system.CPU_COUNT: affinity and cgroup quotas), fewer if the estimated memory of one worker
(the weights it cannot share, a full activation cache of the longest prompt, ×3 for golden and
compare) does not fit 80 % of the available memory that many times; BLAS threads per worker =
cores // workers, so each core is used once. The workers' environment is set before they start,
through the nanny's ``distributed.nanny.pre-spawn-environ`` (the only way to reach glibc's malloc,
which reads its settings when a process starts): OPENBLAS/OMP/MKL_NUM_THREADS, and the malloc
settings refgpt's README recommends for repeated ``run_with_cache``,
MALLOC_MMAP_THRESHOLD_=34359738368 and MALLOC_TRIM_THRESHOLD_=68719476736, in place of the
nanny's MALLOC_TRIM_THRESHOLD_=65536, which makes every pass fault in fresh pages (~2× the time;
README, benchmarks/RESULTS.md issue 17). A variable already set in the environment of the
process that starts the sweep wins (Dask's rule): export MALLOC_TRIM_THRESHOLD_=65536 to get
Dask's. The plugin then sets the BLAS threads inside each worker (threadpoolctl), whatever the
environment said. Because glibc keeps the freed memory, a worker's memory does not shrink between
prompts: the workers are told not to pause or spill (they hold no data; pausing would stall them
for good), while the nanny still ends a worker past 95 % of its memory limit. Dask's own logging is
silenced below CRITICAL in the cluster and its workers: what goes wrong with a prompt or a worker
comes back as a failed record or an error, and a Ctrl-C is not followed by the workers' complaints
that their scheduler went away.

The nanny writes its pre-spawn environment into ``os.environ`` of the process running it — here,
the user's — before each worker starts. This module puts the user's environment back as it was
after the cluster has started and again when it closes: the user's own BLAS threads and
environment are not changed by a sweep (tests/sweep/test_sweep_dask.py checks both).

**A running cluster** (``scheduler=ADDR``): the workers are whoever started them (docs/sweep.md:
``dask scheduler``, then ``dask worker ADDR`` on each machine, with the malloc settings exported
and ``--nthreads 1``). The plugin sets BLAS threads only when ``blas_threads`` is given; each
worker's malloc settings and BLAS threads are reported, and a note names the workers that run with
Dask's malloc default.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import uuid
from pathlib import Path

import dask
from dask.system import CPU_COUNT
from distributed import Client, LocalCluster, WorkerPlugin, as_completed, get_worker
from distributed.scheduler import KilledWorker

from ..errors import RefGPTError, one_line, size_shown
from .prompts import Prompt
from .worker import Sweeper, SweepSpec, blas_info, record

#: CONTRIBUTING.md's setting for a process that calls run_with_cache again and again: glibc keeps freed memory.
MEMORY_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**30), "MALLOC_TRIM_THRESHOLD_": str(64 * 2**30)}
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_BATCH = 16


class SweepPlugin(WorkerPlugin):
    """Loads the sweep's model once in each worker (module docstring)."""

    def __init__(self, spec: SweepSpec, expected_sha256: dict | None, blas_threads: int | None,
                 ignore_interrupt: bool = False):
        self.spec, self.expected, self.blas_threads = spec.to_json(), expected_sha256, blas_threads
        self.ignore_interrupt = ignore_interrupt  # workers of our own LocalCluster only
        self.sweeper = None

    def setup(self, worker):
        if self.ignore_interrupt and threading.current_thread() is threading.main_thread():
            # Ctrl-C at a terminal reaches every process of the job: the sweep's own process stops
            # the cluster; its workers need not each print a KeyboardInterrupt traceback.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.blas_threads:
            from threadpoolctl import threadpool_limits

            self._limits = threadpool_limits(self.blas_threads)  # this worker process's BLAS, not the user's
        self.sweeper = Sweeper(SweepSpec(**self.spec), self.expected)

    def teardown(self, worker):
        self.sweeper = None  # the model's maps go with it
        if getattr(self, "_limits", None) is not None:
            self._limits.restore_original_limits()  # a worker that goes on serving others


def run_batch(plugin_name: str, prompts: list[dict]) -> list[dict]:
    """A Dask task: the records of a batch of prompts, on the worker's loaded model."""
    sweeper = get_worker().plugins[plugin_name].sweeper
    return [sweeper.run(Prompt.from_json(p)) for p in prompts]


def worker_report(plugin_name: str, dask_worker=None) -> dict:
    """What a worker runs with: its process, the weights' sha256, BLAS, malloc settings."""
    sweeper = dask_worker.plugins[plugin_name].sweeper
    return {"pid": os.getpid(), "host": socket.gethostname(), "model_sha256": sweeper.model_sha256,
            "blas": blas_info(), "environ": _environ_at_start((*MEMORY_SETTINGS, *BLAS_VARIABLES))}


def _environ_at_start(keys) -> dict:
    """The variables as the process was started with them (/proc/self/environ on Linux: what glibc's
    malloc and the BLAS read), else as they are now."""
    try:
        raw = Path("/proc/self/environ").read_bytes().split(b"\0")
        found = dict(item.decode("utf-8", "replace").split("=", 1) for item in raw if b"=" in item)
    except OSError:
        found = dict(os.environ)
    return {k: found.get(k) for k in keys}


def cores() -> int:
    """The cores this process may use (affinity, cgroup quota)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    return max(1, min(affinity, CPU_COUNT))


def worker_memory(spec: SweepSpec, max_tokens: int) -> int:
    """An estimate of one worker's peak memory, in bytes (module docstring)."""
    from ..files.checkpoint import weight_files
    from ..files.safetensors_file import SafetensorsFile
    from ..gpt2.config import Config
    from ..gpt2.params import param_shapes

    directory = Path(spec.model_path())
    if not directory.is_dir():
        from ..files.hub import resolve

        directory = resolve(spec.model_path())
    cfg = Config.from_json(directory / "config.json")
    itemsize = 8 if spec.dtype == "float64" else 4
    stored = {SafetensorsFile(f).stored_dtype(n) for f in weight_files(directory) for n in SafetensorsFile(f).names[:1]}
    shared = stored == {"F64" if spec.dtype == "float64" else "F32"}  # mapped, not converted into a copy
    private = 0 if shared else sum(math.prod(s) for s in param_shapes(cfg).values()) * itemsize
    T, d, L = min(max_tokens, cfg.n_ctx), cfg.d_model, cfg.n_layers
    per_layer = 2 * cfg.n_heads * T * T + T * (11 * d + 2 * cfg.d_mlp)  # scores, pattern; q k v z, streams, LN, MLP
    cache = (L * per_layer + 2 * T * cfg.d_vocab) * itemsize  # + logits and log-probabilities
    return private + cache * (3 if spec.task in ("golden", "compare") else 1)


def local_size(spec: SweepSpec, prompts: list[Prompt], workers: int | None, blas_threads: int | None):
    """(workers, BLAS threads per worker, why) for a LocalCluster on this machine."""
    import psutil

    n_cores = cores()
    longest = max(len(p.tokens) if p.tokens is not None else len(p.text.encode("utf-8")) + 1 for p in prompts)
    need = worker_memory(spec, longest)
    available = psutil.virtual_memory().available
    fits = max(1, int(0.8 * available // max(need, 1)))
    chosen = workers if workers is not None else min(n_cores, fits)
    threads = blas_threads or max(1, n_cores // chosen)
    why = (f"{n_cores} core{'s' if n_cores != 1 else ''}, ~{size_shown(need)} per worker estimated, "
           f"{size_shown(available)} available")
    return chosen, threads, why


class SweepCluster(LocalCluster):
    """A LocalCluster that puts back, when it closes, the environment its nannies changed."""

    saved_environ: dict = {}

    def close(self, *args, **kwargs):
        try:
            return super().close(*args, **kwargs)
        finally:
            restore_environ(self.saved_environ)


def local_cluster(n_workers: int, blas_threads: int, malloc: dict | None = None) -> LocalCluster:
    """A LocalCluster of ``n_workers`` processes for sweeps (module docstring): one task at a time
    each, ``blas_threads`` BLAS threads, CONTRIBUTING.md's malloc settings (``malloc={}``: Dask's), no
    pausing or spilling, on 127.0.0.1 with no dashboard; this process's environment as it was, now
    and after ``close``."""
    env = {**(MEMORY_SETTINGS if malloc is None else malloc), **{v: str(blas_threads) for v in BLAS_VARIABLES}}
    pre_spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **env}
    saved = {k: os.environ.get(k) for k in (*pre_spawn, "PYTHONHASHSEED")}
    config = {"distributed.nanny.pre-spawn-environ": pre_spawn, "distributed.worker.memory.pause": False,
              "distributed.worker.memory.spill": False, "distributed.worker.memory.target": False}
    try:
        with dask.config.set(config):
            cluster = SweepCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   scheduler_port=0, dashboard_address=None, silence_logs=logging.CRITICAL,
                                   scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})  # its HTTP server: any port
    finally:
        restore_environ(saved)
    cluster.saved_environ = saved
    return cluster


def restore_environ(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class DaskExecutor:
    """Runs prompts on Dask: a LocalCluster (``scheduler`` None) or the cluster at ``scheduler``."""

    def __init__(self, spec: SweepSpec, expected_sha256, workers=None, scheduler=None, blas_threads=None):
        if workers is not None and workers < 1:
            raise RefGPTError(f"--workers must be ≥ 1 for a cluster (0 runs in this process), found {workers}")
        if blas_threads is not None and (isinstance(blas_threads, bool) or not isinstance(blas_threads, int)
                                         or blas_threads < 1):
            raise RefGPTError(f"--blas-threads must be a whole number ≥ 1, found {blas_threads!r}")
        self.spec, self.expected, self.workers, self.scheduler = spec, expected_sha256, workers, scheduler
        self.blas_threads = blas_threads
        self.cluster = self.client = None
        self.plugin_name = f"refgpt-sweep-{spec.key}"
        self.notes, self.where, self.model_sha256, self.reports = [], "", expected_sha256, {}

    # ---- starting --------------------------------------------------------------------------------

    def start(self, prompts: list[Prompt]) -> None:
        if self.scheduler is None:
            n, threads, why = local_size(self.spec, prompts, self.workers, self.blas_threads)
            self._start_local(n, threads)
            self.blas_threads = threads
            self.where = (f"LocalCluster: {n} worker process{'es' if n != 1 else ''} × {threads} BLAS "
                          f"thread{'s' if threads != 1 else ''} ({why})")
        else:
            try:
                self.client = Client(self.scheduler, timeout="10s", set_as_default=False)
            except (OSError, TimeoutError) as error:
                raise RefGPTError(f"--scheduler {self.scheduler}: cannot connect ({one_line(error)})") from None
            try:
                self.client.wait_for_workers(1, timeout=60)
            except TimeoutError:
                raise RefGPTError(f"--scheduler {self.scheduler}: no worker joined within 60 s "
                                  "(start them with: dask worker ADDR)") from None
        self._register()
        n = len(self.reports)
        if self.scheduler is not None:
            self.where = f"the Dask cluster at {self.scheduler}: {n} worker{'s' if n != 1 else ''}"
        hashes = {tuple(sorted(r["model_sha256"].items())) for r in self.reports.values()}
        if len(hashes) != 1:
            raise RefGPTError(f"the workers read different weights ({len(hashes)} different sha256 sets): every "
                              "worker must read the same model")
        self.model_sha256 = next(iter(self.reports.values()))["model_sha256"]
        for address, r in sorted(self.reports.items()):
            trim = r["environ"].get("MALLOC_TRIM_THRESHOLD_")
            if trim != MEMORY_SETTINGS["MALLOC_TRIM_THRESHOLD_"]:
                self.notes.append(f"worker {address} runs with MALLOC_TRIM_THRESHOLD_={trim} (not "
                                  f"{MEMORY_SETTINGS['MALLOC_TRIM_THRESHOLD_']}): each pass faults in fresh memory, "
                                  "up to ~2× slower (docs/sweep.md, worker memory)")

    def _start_local(self, n: int, threads: int) -> None:
        self.cluster = local_cluster(n, threads)
        self.client = Client(self.cluster, set_as_default=False)

    def _register(self) -> None:
        plugin = SweepPlugin(self.spec, self.expected, self.blas_threads, ignore_interrupt=self.scheduler is None)
        try:
            self.client.register_plugin(plugin, name=self.plugin_name)
        except RefGPTError:
            raise
        except Exception as error:  # e.g. refgpt or its dependencies missing on a worker
            raise RefGPTError(f"a worker could not start the sweep: {type(error).__name__}: {one_line(error)}") from None
        self.reports = self.client.run(worker_report, self.plugin_name)

    # ---- running ---------------------------------------------------------------------------------

    def run(self, prompts: list[Prompt], batch_size: int | None = None):
        """Yield (prompt, record) as batches finish, in whatever order they finish."""
        n_workers = max(1, len(self.client.scheduler_info(n_workers=-1)["workers"]))
        if batch_size is None:
            batch_size = max(1, min(MAX_BATCH, len(prompts) // (4 * n_workers)))
        run_id = uuid.uuid4().hex[:8]
        batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
        futures = {}
        try:
            for i, batch in enumerate(batches):
                future = self.client.submit(run_batch, self.plugin_name, [p.to_json() for p in batch],
                                            key=f"refgpt-sweep-{self.spec.task}-{run_id}-{i}", retries=0)
                futures[future] = batch
            for future in as_completed(futures, loop=self.client.loop):  # not the default client's loop
                batch = futures.pop(future)
                try:
                    records = future.result()
                except KilledWorker as error:
                    records = [self._failed(p, f"the workers running it died ({one_line(error)})") for p in batch]
                except Exception as error:
                    records = [self._failed(p, f"internal error (please report): {type(error).__name__}: "
                                               f"{one_line(error)}") for p in batch]
                future.release()
                yield from zip(batch, records)
        finally:
            if futures:
                self.client.cancel(list(futures))

    def _failed(self, prompt: Prompt, error: str) -> dict:
        provenance = {"model_sha256": self.model_sha256, "refgpt_version": None, "dtype": self.spec.dtype,
                      "numpy_version": None, "blas": None, "tokens": None}
        return record(prompt, self.spec.task, provenance, None, error)

    def close(self) -> None:
        try:
            if self.client is not None and self.cluster is None:
                try:  # a cluster that goes on: free the workers' models
                    self.client.unregister_worker_plugin(self.plugin_name)
                except Exception:
                    pass
            if self.client is not None:
                self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        finally:
            self.client = self.cluster = None
