"""Start-up of the orchestrator's CLI: wall time of ``python -m hcp_tune plan cp=8
seq=131072`` (a fresh process each run, output discarded), and how much of a fresh
process's time ``import hydra`` alone takes. Also checks that ``plan`` never imports torch.

Not a test: it prints numbers and writes them, stamped, to benchmarks/RESULTS-cli-startup.md.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cli_startup.py [--runs 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wall(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, env=ENV,
                   cwd=REPO)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-cli-startup.md"))
    args = ap.parse_args()
    n = args.runs
    plan = ["-m", "hcp_tune", "plan", "cp=8", "seq=131072"]
    wall(plan)  # warm the file cache once
    plans = sorted(wall(plan) for _ in range(n))
    bare = sorted(wall(["-c", "pass"]) for _ in range(n))
    hydra = sorted(wall(["-c", "import hydra"]) for _ in range(n))
    check = subprocess.run(
        [sys.executable, "-c", "import sys; from hcp_tune.cli import main; "
         "main(['plan', 'cp=8', 'seq=131072']); print('torch' in sys.modules)"],
        capture_output=True, text=True, env=ENV, cwd=REPO)
    lines = [
        f"plan cp=8 seq=131072: {plans[0]:.2f}-{plans[-1]:.2f} s wall over {n} runs "
        f"(median {plans[n // 2]:.2f})",
        f"import hydra: {hydra[n // 2] - bare[n // 2]:.2f} s (median, over a bare "
        f"interpreter's {bare[n // 2]:.2f} s)",
        f"torch imported by plan: {check.stdout.strip().splitlines()[-1]}"]
    print("\n".join(lines))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results

    write_results(args.out, "# CLI start-up (`plan`)\n\nA fresh process per run, output "
                  "discarded; `import hydra` timed against a bare interpreter.\n\n```\n"
                  + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
