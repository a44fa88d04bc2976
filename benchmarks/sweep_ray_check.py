"""``make sweep-ray-check``: a sweep through Ray tasks gives the local executor's CSV.

Starts a local Ray cluster (a head node with ``--cpus`` CPUs, each a worker slot),
runs one small sweep with ``--executor ray:auto`` (the tasks run in the cluster's
worker processes), the same sweep with the default process pool, stops the cluster
(always, also after a failure), and compares the two CSVs cell by cell, all columns
but ``wall_s`` (the simulations' wall time, the one figure that differs between runs).
Prints each phase's time. Exit 0 when the CSVs agree; 1 when they differ; 2 when
ray is not installed or the cluster does not start.

Needs ``ray`` in this interpreter's environment (the make target installs it) and
pagedkv importable by the cluster's workers (the make target exports ``PYTHONPATH``,
which ``ray start`` hands to the workers it starts).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The sweep both executors run: six points of a small preset without KV tensors.
SWEEP = (
    "--preset",
    "chat",
    "--num-requests",
    "60",
    "--kv-backing",
    "none",
    "--slo",
    "ttft=20,tpot=2",
    "--vary",
    "gpu_blocks=32:192:32",
)
IGNORED = ("wall_s",)


def compare_csv(a: Path, b: Path, ignored: tuple[str, ...] = IGNORED) -> list[str]:
    """The differences between two sweep CSVs, all columns but ``ignored``: a
    different header or row count, or ``row N, column: x != y``. Complexity: O(cells)."""
    with open(a, encoding="utf-8", newline="") as fa, open(b, encoding="utf-8", newline="") as fb:
        rows_a, rows_b = list(csv.DictReader(fa)), list(csv.DictReader(fb))
    head_a = list(rows_a[0]) if rows_a else []
    head_b = list(rows_b[0]) if rows_b else []
    if head_a != head_b:
        return [f"headers differ: {head_a} != {head_b}"]
    if len(rows_a) != len(rows_b):
        return [f"{len(rows_a)} rows != {len(rows_b)} rows"]
    return [
        f"row {i}, {column}: {row_a[column]} != {row_b[column]}"
        for i, (row_a, row_b) in enumerate(zip(rows_a, rows_b, strict=True), 1)
        for column in head_a
        if column not in ignored and row_a[column] != row_b[column]
    ]


def _sweep(executor: str, out: Path) -> float:
    start = time.perf_counter()
    command = [sys.executable, "-m", "pagedkv", "sweep", *SWEEP, "--executor", executor]
    subprocess.run([*command, "--jobs", "2", "--out", str(out)], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=2, help="worker slots of the cluster")
    args = parser.parse_args(argv)
    ray = Path(sys.executable).parent / "ray"
    if not ray.exists():
        print(f"sweep-ray-check: no {ray}; pip install 'pagedkv[ray]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        ray_csv, local_csv = Path(tmp) / "ray.csv", Path(tmp) / "local.csv"
        start = time.perf_counter()
        up = subprocess.run(
            [str(ray), "start", "--head", f"--num-cpus={args.cpus}", "--include-dashboard=false"],
            capture_output=True,
            text=True,
            check=False,
        )
        if up.returncode != 0:
            print(f"sweep-ray-check: ray start failed:\n{up.stdout}{up.stderr}", file=sys.stderr)
            subprocess.run([str(ray), "stop", "--force"], capture_output=True, check=False)
            return 2
        print(f"ray start: {time.perf_counter() - start:.1f} s ({args.cpus} worker CPUs)")
        try:
            print(f"sweep on ray:auto: {_sweep('ray:auto', ray_csv):.1f} s")
        finally:
            stop = time.perf_counter()
            subprocess.run([str(ray), "stop"], capture_output=True, check=False)
            print(f"ray stop: {time.perf_counter() - stop:.1f} s")
        print(f"sweep on local processes: {_sweep('process', local_csv):.1f} s")
        differences = compare_csv(ray_csv, local_csv)
        rows = len(ray_csv.read_text(encoding="utf-8").splitlines()) - 1
    if differences:
        print("sweep-ray-check: the CSVs differ:\n  " + "\n  ".join(differences[:20]))
        return 1
    print(f"sweep-ray-check: the {rows} rows agree (all columns but {', '.join(IGNORED)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
