"""``rllib-p3o validate PATH...``: check prompt datasets and trajectory files before a run uses them.

Which kind a path holds is detected (``--kind`` overrides): JSONL and JSON files are prompt datasets; a Parquet file
or directory is a trajectory file when it has a completion column (``completion`` or ``completion_ids``), else a
prompt dataset.

Prompt datasets (the rows `rllib_p3o.data.datasets.load_prompt_dataset` reads): every bad row is listed with its row
and column; the report gives the rows, columns and prompt kinds (text, chat messages). With ``--model``: whether
the tokenizer has the chat template chat prompts need, and the prompts' lengths in tokens. With ``--reward-fn``
(repeatable, ``module:function``; ``--reward-weights`` as for ``env_config``): the reward functions are called on
the first ``--rows`` rows, as a run calls them (TRL's conventions), with ``--completion`` texts (repeatable), the
values of a ``--completions-column``, or a dummy empty completion; what they return is checked (a list of one float
or None per completion, no NaN) and summarized.

Trajectory files: the schema check of `rllib_p3o.data.trajectories.validate_trajectories`; every bad row is listed
with file, row and column. Then whose data each file is (`rllib_p3o.data.provenance`): with ``--model`` (the policy
to be trained), the policy's own or another model's, and why, as a run reads it (``--offline-provenance`` as the
run's setting); without it, the models the files record.

Exit status 0 when everything is valid, 1 when anything is not, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional

import numpy as np

NAME = "validate"
KINDS = ("auto", "prompts", "trajectories")
COMPLETION_COLUMNS = ("completion", "completion_ids")


def add_parser(sub: Any) -> None:
    v = sub.add_parser(NAME, help="check prompt datasets (and a reward function) or trajectory Parquet files")
    v.add_argument("path", nargs="+", help="prompt dataset (.jsonl/.json/.parquet) or trajectory Parquet file/dir")
    v.add_argument("--kind", choices=KINDS, default="auto", help="what the paths hold (default: detected)")
    v.add_argument("--model", help="policy model directory: its tokenizer (chat template, token ids, lengths)")
    v.add_argument("--vocab-size", type=int, help="trajectories: vocabulary size for the token-id check")
    v.add_argument("--max-seq-len", type=int, help="trajectories: longest allowed prompt + completion in tokens")
    v.add_argument(
        "--allow-missing-behavior",
        action="store_true",
        help="trajectories: rows without behavior_logprobs are fine (they will be rescored by a model)",
    )
    v.add_argument(
        "--reward-fn",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="prompts: call this reward function on a few rows (repeat for several, as env_config's list)",
    )
    v.add_argument("--reward-weights", type=float, nargs="+", help="prompts: one weight per --reward-fn")
    v.add_argument("--rows", type=int, default=8, help="prompts: rows the reward functions are called on")
    v.add_argument("--completion", action="append", default=[], help="prompts: a completion text to score per row")
    v.add_argument("--completions-column", help="prompts: score this column's values as the completions")
    v.add_argument("--limit", type=int, default=200, help="print at most this many problems")
    v.add_argument(
        "--offline-provenance",
        choices=("auto", "policy", "other"),
        default="auto",
        help="trajectories: read the files as the run's offline_provenance setting would (default: from their "
        "recorded model_fingerprint against --model's lineage)",
    )


def run(args: argparse.Namespace) -> int:
    ok = True
    for path in args.path:
        kind = args.kind if args.kind != "auto" else detect_kind(path)
        if kind == "trajectories":
            ok &= _validate_trajectories(path, args)
        else:
            ok &= validate_prompts(path, args)
    return 0 if ok else 1


def detect_kind(path: str) -> str:
    """ "trajectories" for Parquet with a completion column, else "prompts" (JSONL, JSON, other Parquet)."""
    if path.endswith((".jsonl", ".json")) or not os.path.exists(path):
        return "prompts"
    try:
        import pyarrow.dataset as ds

        names = set(ds.dataset(path, format="parquet").schema.names)
    except Exception:  # not Parquet: the prompt reader says what is wrong with it
        return "prompts"
    return "trajectories" if names & set(COMPLETION_COLUMNS) else "prompts"


def _tokenizer(model: Optional[str]):
    if not model:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _validate_trajectories(path: str, args: argparse.Namespace) -> bool:
    from rllib_p3o.data.trajectories import OfflineDataError, validate_trajectories

    try:
        report = validate_trajectories(
            path,
            tokenizer=_tokenizer(args.model),
            vocab_size=args.vocab_size,
            require_behavior=not args.allow_missing_behavior,
            max_seq_len=args.max_seq_len,
        )
    except OfflineDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    print(report.summary(limit=args.limit))
    if report.locations:
        print(_provenance(report, path, args))
    return report.ok


def _provenance(report: Any, path: str, args: argparse.Namespace) -> str:
    """Whose data the files are, as a run training ``--model`` reads them (module docstring)."""
    from rllib_p3o.data import provenance

    readings = provenance.read_provenance(report.locations, args.model, args.offline_provenance, [path])
    if args.model or args.offline_provenance != "auto":
        return provenance.summary([r.reading for r in readings])
    recorded = sorted(
        {f"{name or 'unnamed'} ({fp})" for r in readings for fp, name in r.reading.recorders.items() if fp}
    )
    return (
        "provenance: "
        + (f"recorded by {', '.join(recorded)}" if recorded else "no model recorded (read as another model's data)")
        + "; give --model (the policy to train) to tell whether they are its own data"
    )


def validate_prompts(path: str, args: argparse.Namespace) -> bool:
    """Print a prompt dataset's report (module docstring); True when it has no problem."""
    from rllib_p3o.data import chat
    from rllib_p3o.data.datasets import DatasetError, prompt_row_problem, read_prompt_rows

    try:
        rows, where = read_prompt_rows(path)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    problems = [f"{where}: row {i} {p}" for i, r in enumerate(rows) if (p := prompt_row_problem(r))]
    good = [r for r in rows if prompt_row_problem(r) is None]
    columns = sorted({k for r in rows if isinstance(r, dict) for k in r})
    n_chat = sum(chat.is_conversational(r["prompt"]) for r in good)
    print(f"{where}: {len(rows)} prompt rows; columns: {', '.join(columns)}")
    print(f"  prompts: {len(good) - n_chat} text, {n_chat} chat messages")
    tokenizer = _tokenizer(args.model)
    if tokenizer is not None and good:
        if n_chat and not chat.has_chat_template(tokenizer):
            problems.append(
                f"{where}: {n_chat} rows are chat messages, but the tokenizer of {args.model} has no chat template"
            )
        else:
            lengths = [len(chat.prompt_token_ids(tokenizer, r["prompt"])) for r in good]
            template = "chat template ok; " if n_chat else ""
            print(
                f"  {args.model}: {template}prompt tokens min {min(lengths)}, mean {np.mean(lengths):.1f}, "
                f"max {max(lengths)}"
            )
    if args.reward_fn and good:
        problems += _check_reward(good[: max(1, args.rows)], args)
    for p in problems[: args.limit]:
        print(f"  problem: {p}")
    if len(problems) > args.limit:
        print(f"  ... and {len(problems) - args.limit} more")
    print(f"  {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return not problems


def _check_reward(rows: List[dict], args: argparse.Namespace) -> List[str]:
    """Call the reward functions on ``rows`` as a run would; the problems found (printed summary besides)."""
    from rllib_p3o.data.rewards import RewardFunction, RewardFunctionError

    try:
        reward = RewardFunction(args.reward_fn, args.reward_weights)
    except (ValueError, ImportError, AttributeError) as e:
        return [f"reward functions {', '.join(args.reward_fn)}: {type(e).__name__}: {e}"]
    if args.completions_column:
        missing = [i for i, r in enumerate(rows) if args.completions_column not in r]
        if missing:
            return [f"row {missing[0]} has no column {args.completions_column!r} (--completions-column)"]
        texts = [[str(r[args.completions_column])] for r in rows]
        given = f"the {args.completions_column!r} column"
    else:
        texts = [list(args.completion) or [""] for _ in rows]
        given = ", ".join(repr(c) for c in args.completion) if args.completion else "a dummy empty completion"
    prompts = [r["prompt"] for r, ts in zip(rows, texts) for _ in ts]
    scored_rows = [r for r, ts in zip(rows, texts) for _ in ts]
    completions = [t for ts in texts for t in ts]
    try:
        out = reward.score(prompts, completions, scored_rows)
    except RewardFunctionError as e:
        return [str(e)]
    print(f"  reward on {len(rows)} rows, completions: {given}")
    for k, name in enumerate(reward.names):
        values = out.by_function[:, k]
        scored = values[~np.isnan(values)]
        summary = f"min {scored.min():.3g}, mean {scored.mean():.3g}, max {scored.max():.3g}" if scored.size else ""
        nones = int(np.isnan(values).sum())
        print(f"    {name}: {summary}{'; ' if summary and nones else ''}{f'None for {nones}' if nones else ''}")
    unscorable = int(np.isnan(out.total).sum())
    if unscorable:
        print(f"    {unscorable} completions no function scored (reward NaN, advantage 0 in training)")
    return []
