"""A table of sample completions per iteration (TRL's ``log_completions``): what the policy wrote and what it got.

With ``log_completions=N`` (`P3OConfig.training`) the driver writes, after each iteration, ``N`` of its sampled
completions to ``<trial dir>/completions/iter_<iteration>.parquet``: under Tune the trial's directory in the
experiment's storage (beside ``progress.csv``; a remote ``storage_path`` through its pyarrow filesystem), else the
algorithm's ``logdir``. Columns:

    iteration   int      the training iteration (1-based, as Tune's ``training_iteration``)
    group_id    int      the prompt group (completions of one prompt share it)
    source      string   the data source that generated it ("policy", "behavior/<name>")
    prompt      string   the prompt as the engine saw it (a conversational prompt rendered by the chat template)
    completion  string   the completion's text
    reward      float    its reward: the weighted sum of the reward functions (NaN: no function scored it)
    advantage   float    its group-normalized advantage
    rewards/<function name>  float  each reward function's value (NaN where it returned None)

The rows are whole prompt groups, taken from the iteration's groups spread evenly over them, so each prompt's
completions can be compared side by side. Each file is written under a temporary name and renamed.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Sequence

from rllib_p3o.core.columns import Infos, Record

SUBDIR = "completions"
REWARDS_PREFIX = "rewards/"


def pick_samples(records: Sequence[Mapping[str, Any]], n: int) -> List[Mapping[str, Any]]:
    """``n`` records (or all, if fewer): whole prompt groups, the groups spread evenly over the iteration's."""
    if n <= 0 or not records:
        return []
    groups: Dict[int, List[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(int(r[Record.GROUP_ID]), []).append(r)
    ordered = [groups[g] for g in sorted(groups)]
    per_group = max(len(g) for g in ordered)
    k = max(1, min(len(ordered), -(-n // per_group)))  # groups needed to fill n rows
    step = len(ordered) / k
    picked = [r for i in range(k) for r in ordered[int(i * step)]]
    return picked[:n]


def samples_table(records: Sequence[Mapping[str, Any]], iteration: int):
    """The records as a pyarrow table in the layout of the module docstring."""
    import pyarrow as pa

    names: List[str] = []
    for r in records:
        for name in (r.get(Record.INFOS) or {}).get(Infos.REWARDS) or {}:
            if name not in names:
                names.append(name)
    columns: Dict[str, list] = {
        "iteration": [],
        "group_id": [],
        "source": [],
        "prompt": [],
        "completion": [],
        "reward": [],
        "advantage": [],
        **{REWARDS_PREFIX + name: [] for name in names},
    }
    for r in records:
        infos = r.get(Record.INFOS) or {}
        by_function = infos.get(Infos.REWARDS) or {}
        columns["iteration"].append(int(iteration))
        columns["group_id"].append(int(r[Record.GROUP_ID]))
        columns["source"].append(infos.get(Infos.SOURCE))
        columns["prompt"].append(infos.get(Infos.PROMPT))
        columns["completion"].append(infos.get(Infos.COMPLETION))
        columns["reward"].append(float(r[Record.REWARD]))
        advantage = r.get(Record.ADVANTAGE)
        columns["advantage"].append(float(advantage) if advantage is not None else None)
        for name in names:
            value = by_function.get(name)
            columns[REWARDS_PREFIX + name].append(float(value) if value is not None else None)
    types = {"iteration": pa.int64(), "group_id": pa.int64(), "source": pa.string(), "prompt": pa.string()}
    types["completion"] = pa.string()
    return pa.table({k: pa.array(v, type=types.get(k, pa.float64())) for k, v in columns.items()})


def write_samples(
    records: Sequence[Mapping[str, Any]], directory: str, iteration: int, n: int, filesystem: Any = None
) -> str:
    """Write ``n`` sample completions of an iteration (`pick_samples`) to ``directory/completions/`` (on a pyarrow
    ``filesystem``, local by default); returns the file's path, or "" when there was nothing to write."""
    import pyarrow.fs
    import pyarrow.parquet as pq

    picked = pick_samples(records, n)
    if not picked:
        return ""
    table = samples_table(picked, iteration)
    name = f"iter_{iteration:06d}.parquet"
    if filesystem is not None and not isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        out = f"{directory.rstrip('/')}/{SUBDIR}"
        filesystem.create_dir(out, recursive=True)
        pq.write_table(table, f"{out}/{name}", filesystem=filesystem)  # object stores write an object whole
        return f"{out}/{name}"
    out = os.path.join(directory, SUBDIR)
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f".{name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(out, name))
    return os.path.join(out, name)
