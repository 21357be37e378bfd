"""refgpt sweep on a Dask LocalCluster of 2 worker processes (refgpt.sweep.on_dask.local_cluster,
one per module: a cluster takes seconds to start): summary.json byte-identical to the serial run
and to 1 worker, each record equal to the serial one (test_sweep.py checks those against
refgpt.load), a worker SIGKILLed mid-sweep, resumption, failing prompts, Ctrl-C on the command,
and the user's process left as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow  # a Dask cluster takes seconds to start, each test seconds more

from conftest import TASK_OPTIONS, long_prompts, records  # noqa: E402
from refgpt.sweep import run_sweep  # noqa: E402
from refgpt.sweep.on_dask import MEMORY_SETTINGS, local_cluster  # noqa: E402
from refgpt.sweep.prompts import read_prompts  # noqa: E402
from refgpt.sweep.records import SweepDirectory  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = local_cluster(2, blas_threads=1)
    yield c
    c.close()


@pytest.fixture(scope="module")
def client(cluster):
    from distributed import Client

    with Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """16 prompts, most of 90–127 tokens (conftest.long_prompts), and their serial lens sweep."""
    tmp = tmp_path_factory.mktemp("long")
    path = long_prompts(tmp / "long.jsonl", n=16)
    run_sweep(path, "lens", tmp / "serial", workers=0)
    return path, tmp / "serial"


def without_threads(record):
    """A record without what may differ between runs that computed the same: the BLAS threads."""
    return {**record, "provenance": {**record["provenance"], "blas": {**(record["provenance"]["blas"] or {}),
                                                                      "threads": None}}, "record_sha256": None}


@pytest.mark.parametrize("name", sorted(TASK_OPTIONS))
def test_two_workers_write_the_serial_records_and_the_same_summary_bytes(name, serial, corpus, cluster, tmp_path):
    serial_out, serial_result = serial(name)
    out = tmp_path / "o"
    result = run_sweep(corpus, name.split("-")[0], out, options=TASK_OPTIONS[name], scheduler=cluster.scheduler_address,
                       batch_size=2)
    assert (out / "summary.json").read_bytes() == (serial_out / "summary.json").read_bytes()
    assert result.failed == serial_result.failed and len(result.workers) == 2
    mine, theirs = records(out), records(serial_out)
    assert {i: without_threads(r) for i, r in mine.items()} == {i: without_threads(r) for i, r in theirs.items()}
    assert {r["provenance"]["blas"]["threads"] for r in mine.values() if r["status"] == "ok"} == {1}
    assert (out / "manifest.jsonl").read_bytes() == (serial_out / "manifest.jsonl").read_bytes()
    if name == "golden":  # the golden files themselves: the same bytes whichever worker wrote them
        for path in (serial_out / "goldens").iterdir():
            assert (out / "goldens" / path.name).read_bytes() == path.read_bytes()


def test_one_worker_of_its_own_local_cluster_writes_the_same_summary_and_leaves_this_process_alone(serial, corpus,
                                                                                                    tmp_path):
    from threadpoolctl import threadpool_info

    environ, blas = dict(os.environ), threadpool_info()
    result = run_sweep(corpus, "lens", tmp_path / "o", workers=1)
    assert (tmp_path / "o" / "summary.json").read_bytes() == (serial("lens")[0] / "summary.json").read_bytes()
    assert "1 worker process × 2 BLAS threads" in result.where  # the machine's 2 cores, used once
    (worker,) = result.workers.values()
    assert worker["blas"]["threads"] == 2 and worker["pid"] != os.getpid()
    assert worker["environ"] == {**MEMORY_SETTINGS, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
                                 "MKL_NUM_THREADS": "2"}  # in the worker's environment from its start
    assert dict(os.environ) == environ and threadpool_info() == blas  # the user's process: unchanged


def test_a_worker_killed_mid_sweep_has_its_prompts_run_again_with_the_same_result(long_corpus, cluster, client,
                                                                                    tmp_path):
    path, serial_out = long_corpus
    killed = []

    def kill_a_busy_worker(prompt, record):
        if killed:
            return
        busy = [address for address, keys in client.processing().items() if keys]
        pids = client.run(os.getpid)
        address = busy[0]
        os.kill(pids[address], signal.SIGKILL)
        killed.append((address, client.processing()[address]))

    out = tmp_path / "o"
    result = run_sweep(path, "lens", out, scheduler=cluster.scheduler_address, batch_size=1,
                       on_record=kill_a_busy_worker)
    assert killed and killed[0][1], "the killed worker was running a batch"
    assert result.ran == 16 and not result.failed
    assert (out / "summary.json").read_bytes() == (serial_out / "summary.json").read_bytes()
    assert {i: without_threads(r) for i, r in records(out).items()} == \
        {i: without_threads(r) for i, r in records(serial_out).items()}
    client.wait_for_workers(2, timeout=60)  # the nanny has started a new worker in its place


def test_a_resumed_sweep_on_the_cluster_runs_only_the_missing_prompts(serial, corpus, cluster, tmp_path):
    import shutil

    serial_out, first = serial("loss")
    out = tmp_path / "o"
    shutil.copytree(serial_out, out, ignore=shutil.ignore_patterns(".lock"))
    ok = [p for p in read_prompts(corpus) if records(out)[p.id]["status"] == "ok"]
    for p in ok[:3]:
        (out / "records" / f"{p.stem}.json").unlink()
    (out / "summary.json").unlink()
    result = run_sweep(corpus, "loss", out, scheduler=cluster.scheduler_address)
    assert result.ran == 3 + len(first.failed) and result.skipped == len(ok) - 3  # failed prompts are tried again
    assert (out / "summary.json").read_bytes() == (serial_out / "summary.json").read_bytes()


def test_the_command_on_a_running_cluster_counts_the_failed_prompts(refgpt_cli, serial, corpus, cluster, tmp_path):
    r = refgpt_cli.in_process("sweep", corpus, "--task", "loss", "-o", tmp_path / "o",
                              "--scheduler", cluster.scheduler_address)
    assert r.returncode == 1 and r.stderr.startswith("refgpt: error: 4 of 11 prompts failed"), r.stderr
    assert "the Dask cluster at tcp://127.0.0.1:" in r.stdout
    assert (tmp_path / "o" / "summary.json").read_bytes() == (serial("loss")[0] / "summary.json").read_bytes()


def test_ctrl_c_on_the_command_leaves_complete_records_and_a_rerun_finishes_them(long_corpus, cluster, tmp_path):
    path, serial_out = long_corpus
    out = tmp_path / "o"
    command = [sys.executable, "-m", "refgpt", "sweep", str(path), "--task", "lens", "-o", str(out), "--workers", "2",
               "--batch-size", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its own process group, as a terminal's job
    deadline = time.monotonic() + 120
    while len(list((out / "records").glob("*.json"))) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the command and its workers
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    done = records(out)
    assert 2 <= len(done) < 16 and not (out / "summary.json").exists() and not list(out.rglob("*.tmp"))
    prompts = read_prompts(path)
    with SweepDirectory(out) as d:  # every record there is complete and verifies
        sha = done[next(iter(done))]["provenance"]["model_sha256"]
        assert all(d.verified(p, "lens", sha, "float64") for p in prompts if p.id in done)
    result = run_sweep(path, "lens", out, scheduler=cluster.scheduler_address)
    assert result.ran == 16 - len(done)
    assert (out / "summary.json").read_bytes() == (serial_out / "summary.json").read_bytes()
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert {m["status"] for m in manifest} == {"ok"}


def test_the_documented_cluster_dask_scheduler_and_dask_worker_runs_the_same_sweep(serial, corpus, tmp_path):
    """docs/sweep.md §4, steps 3, 4 and 6, as written (on 127.0.0.1, ports chosen by the system)."""
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "34359738368", "MALLOC_TRIM_THRESHOLD_": "68719476736",
           "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False", "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"}
    dask = [sys.executable, "-m", "dask"]
    started = []
    try:
        started.append(subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                         "--scheduler-file", str(scheduler_file)], env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        started.append(subprocess.Popen([*dask, "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "2",
                                         "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"], env=env,
                                        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        address = json.loads(scheduler_file.read_text())["address"]
        from distributed import Client

        with Client(address, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        result = run_sweep(corpus, "loss", tmp_path / "o", scheduler=address)
        assert (tmp_path / "o" / "summary.json").read_bytes() == (serial("loss")[0] / "summary.json").read_bytes()
        assert len(result.workers) == 2 and result.notes == []
        for worker in result.workers.values():  # exported before `dask worker`: in each worker from its start
            assert {k: worker["environ"][k] for k in MEMORY_SETTINGS} == MEMORY_SETTINGS
            assert worker["blas"]["threads"] == 1  # the nanny's default
    finally:
        for process in reversed(started):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def test_the_local_cluster_is_one_worker_per_core_as_memory_allows_each_core_used_once(monkeypatch, corpus):
    from types import SimpleNamespace

    import psutil

    from refgpt.sweep import on_dask
    from refgpt.sweep.worker import SweepSpec

    spec, prompts = SweepSpec("golden", "/nowhere"), read_prompts(corpus)
    longest = max(len(p.text.encode()) + 1 if p.text is not None else len(p.tokens) for p in prompts)
    need = on_dask.worker_memory(spec, longest)
    assert need > on_dask.worker_memory(SweepSpec("loss", "/nowhere"), longest)  # golden holds three passes
    monkeypatch.setattr(on_dask, "cores", lambda: 8)
    for available, workers, expected in [(100 * need, None, (8, 1)), (3 * need, None, (2, 4)),
                                         (need // 2, None, (1, 8)), (100 * need, 3, (3, 2))]:
        monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available))
        assert on_dask.local_size(spec, prompts, workers, None)[:2] == expected
