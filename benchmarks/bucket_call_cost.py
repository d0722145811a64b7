"""What one more forward/backward call costs the learner, in token positions (the length buckets' ``call_cost``).

    python benchmarks/bucket_call_cost.py [--sizes 0.33M 2.44M 10M] [--out results/benchmarks/bucket_call_cost.json]

For each model size of `_spread_model`, times the learner's forward + backward (log-probs of every token, summed)
on batches of ``rows x width`` token positions, from a few positions to a few thousand, one thread, and fits

    seconds = overhead + per_position * rows * width

by least squares. ``overhead / per_position`` is the fixed cost of a call in token positions: splitting a batch into
one more bucket pays off when it saves more padding than that (`rllib_p3o.learner.length_buckets`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _report import write_report

SHAPES = [(1, 8), (2, 16), (4, 16), (8, 32), (16, 32), (16, 64), (32, 64), (32, 128), (64, 128)]


def time_call(lm, rows: int, width: int, repeats: int) -> float:
    import torch

    ids = torch.randint(3, lm.config.vocab_size, (rows, width))
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        lm.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logits = lm(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).sum()
        logp.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def measure(size: str, models_dir: str, repeats: int) -> dict:
    import numpy as np
    import torch
    from _spread_model import build_spread_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = build_spread_model(os.path.join(models_dir, f"{size}_call_cost"), size, 16)
    lm = AutoModelForCausalLM.from_pretrained(path).train()
    points = [(rows * width, time_call(lm, rows, width, repeats)) for rows, width in SHAPES]
    positions, seconds = np.array(points, dtype=float).T
    per_position, overhead = np.polyfit(positions, seconds, 1)
    return {
        "points": [{"positions": int(p), "seconds": s} for p, s in zip(positions, seconds)],
        "overhead_s": float(overhead),
        "per_position_s": float(per_position),
        "call_cost_positions": float(overhead / per_position),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["0.33M", "2.44M", "10M"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models-dir", default="runs/peer_trl")
    parser.add_argument("--out", default="results/benchmarks/bucket_call_cost.json")
    args = parser.parse_args()
    report = {"setting": "learner forward + backward, float32, 1 thread", "sizes": {}}
    for size in args.sizes:
        result = report["sizes"][size] = measure(size, args.models_dir, args.repeats)
        print(
            f"{size}: overhead {result['overhead_s'] * 1e3:.1f} ms per call, "
            f"{result['per_position_s'] * 1e6:.1f} us per token position -> "
            f"call cost {result['call_cost_positions']:.0f} positions",
            flush=True,
        )
    write_report(report, args.out)


if __name__ == "__main__":
    main()
