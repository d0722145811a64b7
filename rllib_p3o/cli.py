"""``rllib-p3o`` console command.

    rllib-p3o validate PATH [--model DIR] [--max-seq-len N] [--allow-missing-behavior]
    rllib-p3o sweep [--quick | --full] [--out DIR] ...        (`rllib_p3o.sweep.run`: its own --help)

``validate`` checks a trajectory Parquet file or directory against the schema (`rllib_p3o.data.trajectories`) and prints
every bad row with file, row and column. Exit status 0 when the data is valid, 1 when any row is bad, 2 on usage
errors. ``sweep`` runs the paper's comparisons on the built-in task as resumable Ray Tune experiments.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from rllib_p3o.data.trajectories import OfflineDataError, validate_trajectories


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sweep"]:
        from rllib_p3o.sweep.run import main as sweep_main

        return sweep_main(argv[1:])
    parser = argparse.ArgumentParser(prog="rllib-p3o", description="rllib-p3o tools")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check trajectory Parquet files against the schema")
    v.add_argument("path", nargs="+", help="Parquet file(s) or directory(ies)")
    v.add_argument("--model", help="policy model directory: its tokenizer checks token ids and tokenizes text rows")
    v.add_argument("--vocab-size", type=int, help="vocabulary size for the token-id check (without --model)")
    v.add_argument("--max-seq-len", type=int, help="longest allowed prompt + completion in tokens")
    v.add_argument(
        "--allow-missing-behavior",
        action="store_true",
        help="rows without behavior_logprobs are fine (they will be rescored by a model)",
    )
    v.add_argument("--limit", type=int, default=200, help="print at most this many problems")
    sub.add_parser("sweep", add_help=False, help="method × regime × seed comparison as Tune experiments (--help)")
    args = parser.parse_args(argv)

    tokenizer = None
    if args.model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
    try:
        report = validate_trajectories(
            args.path,
            tokenizer=tokenizer,
            vocab_size=args.vocab_size,
            require_behavior=not args.allow_missing_behavior,
            max_seq_len=args.max_seq_len,
        )
    except OfflineDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(report.summary(limit=args.limit))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
