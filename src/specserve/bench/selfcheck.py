"""Client capacity and timing-error check against a local mock server process.

    python -m specserve.bench.selfcheck --concurrency 200 --duration 10

Starts ``specserve.bench.mock_server`` in a subprocess with ``--stamp-send-time`` (each chunk
carries the server's ``perf_counter_ns`` just before the write; on Linux that clock is
CLOCK_MONOTONIC, shared by local processes), runs a closed-loop benchmark, and reports:
streams sustained (achieved concurrency), chunks received per second, and the client's
timing error = client-recorded arrival − server send stamp, per chunk (it includes loopback
and the client's own queueing, so it is an upper bound of the error the client adds).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import httpx
import numpy as np

from specserve.bench.inputs import BenchConfig, ClosedLoop, SamplingConfig, WorkloadConfig
from specserve.bench.results import BenchResult
from specserve.bench.runner import run_benchmark
from specserve.net import free_port


def start_mock(args: list[str], port: int) -> subprocess.Popen:
    """Start the mock server process on ``port`` and wait until it answers /health."""
    cmd = [sys.executable, "-m", "specserve.bench.mock_server", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("mock server did not start within 30 s")


def timing_errors_ms(result: BenchResult) -> list[float]:
    """Client arrival − server send stamp for every stamped chunk, in ms."""
    t0 = result.manifest.t0_perf_counter_ns
    assert t0 is not None
    errors = []
    for r in result.measured():
        for c in r.chunks:
            if c.text.startswith(" @"):
                stamp = int(c.text[2:].split(" ", 1)[0])
                errors.append((t0 + c.t_ns - stamp) / 1e6)
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--itl-ms", type=float, default=80.0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--output-tokens", type=int, default=60)
    a = p.parse_args(argv)
    port = free_port()
    mock = start_mock(
        [
            "--itl-ms",
            str(a.itl_ms),
            "--ttft-ms",
            str(a.ttft_ms),
            "--output-tokens",
            str(a.output_tokens),
            "--stamp-send-time",
        ],
        port,
    )
    try:
        spec = BenchConfig(
            base_url=f"http://127.0.0.1:{port}",
            model="mock-model",
            endpoint="completions",
            workload=WorkloadConfig(suites=("structured",)),
            load=ClosedLoop(concurrency=a.concurrency),
            sampling=SamplingConfig(max_tokens=a.output_tokens),
            duration_s=a.duration,
            warmup_requests=a.concurrency,
            metrics_url="none",
        )
        cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        result = run_benchmark(spec)
        cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    finally:
        mock.terminate()
        mock.wait(10)
    s = result.summary["*"]
    num_chunks = sum(len(r.chunks) for r in result.measured())
    err = np.asarray(timing_errors_ms(result))
    itl = s.itl_s
    print(f"target concurrency     {a.concurrency}")
    print(
        f"achieved concurrency   {result.load_check.achieved or 0:.1f} "
        f"(drift {100 * (result.load_check.drift or 0):+.1f} %, "
        f"flagged={result.load_check.flagged})"
    )
    print(f"requests               {s.num_requests} ({s.num_errors} errors)")
    print(
        f"chunks received        {num_chunks} in {result.window_s:.2f} s = "
        f"{num_chunks / result.window_s:.0f} chunks/s"
    )
    if err.size:
        print(
            f"timing error (ms)      p50 {np.percentile(err, 50):.3f}  p90 "
            f"{np.percentile(err, 90):.3f}  p99 {np.percentile(err, 99):.3f}  max {err.max():.3f}"
        )
    print(f"per-token ITL (ms)     p50 {1000 * (itl.p50 or 0):.2f} vs configured {a.itl_ms:.2f}")
    cpu_s = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    print(
        f"client CPU             {cpu_s:.1f} s over {wall1 - wall0:.1f} s wall = "
        f"{100 * cpu_s / (wall1 - wall0):.0f} % of one core (incl. warm-up and analysis)"
    )
    load1, _, _ = os.getloadavg()
    print(f"machine load average   {load1:.2f} (1 min) on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
