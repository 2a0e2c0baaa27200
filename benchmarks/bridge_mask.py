"""What Megatron-Core's mock data costs on the host with its default
``create_attention_mask=True``: per sample, the time and memory of the S x S mask that
Bridge's step then drops (issue 30, item 1). Runs Megatron-Core's own per-sample function
(``datasets/gpt_dataset.py`` ``_get_ltor_masks_and_position_ids``, which ``GPTDataset``
calls for every sample) with the mask on and off, each (S, mask) in a fresh process so its
peak RSS is its own. CPU only; megatron-core as installed in the venv.

Not a test: it prints numbers and writes them, stamped, to benchmarks/RESULTS-bridge-mask.md.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bridge_mask.py [--seqs 2048,4096,8192,16384]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ONE = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
import megatron.core
seq, mask = int(sys.argv[1]), sys.argv[2] == "1"
tokens = torch.randint(0, 128256, (seq,))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = _get_ltor_masks_and_position_ids(tokens, 0, False, False, False, mask)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = out[0]
print(json.dumps({"seq": seq, "mask": mask, "s": dt, "peak_delta_kib": peak - before,
                  "mask_bytes": 0 if m is None else m.numel() * m.element_size(),
                  "mask_dtype": None if m is None else str(m.dtype),
                  "mcore": megatron.core.__version__}))
"""


def measure(seq: int, mask: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", ONE, str(seq), "1" if mask else "0"],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="2048,4096,8192,16384")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-bridge-mask.md"))
    args = ap.parse_args()
    rows = [measure(int(s), m) for s in args.seqs.split(",") for m in (True, False)]
    head = ("| S | create_attention_mask | seconds a sample | mask kept (MiB) | peak RSS "
            "growth (MiB) | S x S x 8 B (MiB) |\n|---|---|---|---|---|---|")
    lines = [f"| {r['seq']} | {r['mask']} | {r['s']:.3f} | {r['mask_bytes'] / 2**20:.0f} | "
             f"{r['peak_delta_kib'] / 1024:.0f} | {r['seq'] ** 2 * 8 / 2**20:.0f} |" for r in rows]
    text = (f"# Megatron-Core's mock-data attention mask on the host\n\n"
            f"megatron-core {rows[0]['mcore']}, one thread, one sample built by "
            "`_get_ltor_masks_and_position_ids` (what `GPTDataset` runs per sample), each in "
            "a fresh process. The mask is kept as bool (S x S bytes, 16 GiB at 128K); "
            "building it holds two float S x S tensors at once (`torch.ones` and its `tril`: "
            "8 bytes an entry, the measured peak RSS growth; 128 GiB at 128K). Bridge's step "
            "drops the mask; the Bridge runner sets `create_attention_mask=False`, so none "
            "of this is built.\n\n"
            + head + "\n" + "\n".join(lines) + "\n")
    print(text)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results

    write_results(args.out, text)


if __name__ == "__main__":
    main()
