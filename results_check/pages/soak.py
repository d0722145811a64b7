"""docs/results/soak.md: memory over 1,000 iterations, from `soak.json` (`python benchmarks/soak.py`)."""

from __future__ import annotations

from typing import Any, Dict, List

from results_check.page import Page
from results_check.pages._fmt import load_json, num, pct, table
from results_check.pages._paths import BENCH_RESULTS

FILE = f"{BENCH_RESULTS}/soak.json"
KIB_PER_MIB = 1024


def _at(run: Dict[str, Any], iteration: int) -> Dict[str, Any]:
    return next(s for s in run["samples"] if s["iteration"] == iteration)


def quotes(root: str) -> List[str]:
    soak = load_json(root, FILE)
    warm, last = soak["warmup"], soak["iterations"]
    out = [
        f"**Version:** rllib-p3o {soak['version']}",
        f"({num(last)} iterations per mode, a sample every {soak['every']}",
        f"exits 1 if a process grew more than {pct(soak['max_growth'])} after warm-up",
    ]
    runs = {run["mode"]: run for run in soak["runs"]}
    assert soak["passed"] and not soak["failures"]
    processes = ("driver", "runner_1", "learner_1")
    worst = max(run["growth"][p] for run in runs.values() for p in processes)
    out.append(
        f"**No process grew by more than {pct(worst, 1)} between iteration {warm} (the end of warm-up) and iteration "
        f"{num(last)}**"
    )
    rows = []
    for mode, run in runs.items():
        a, b = _at(run, warm), _at(run, last)
        g = run["growth"]

        def rss(side: str, key: str) -> str:
            before = a[side]["rss_mib"] if side == "driver" else a[side][0]["rss_mib"]
            after = b[side]["rss_mib"] if side == "driver" else b[side][0]["rss_mib"]
            return f"{before:.1f} → {after:.1f} (+{pct(g[key], 1)})"

        rows.append(
            [
                mode,
                f"{run['wall_s'] / last:.2f}",
                rss("driver", "driver"),
                rss("runners", "runner_1"),
                rss("learners", "learner_1"),
                f"{g['object_store_mib_max_first_half']:.1f} / {g['object_store_mib_max_second_half']:.1f}",
            ]
        )
    out += table(
        [
            "mode",
            "s/iteration",
            "driver RSS, MiB",
            "runner RSS, MiB",
            "learner RSS, MiB",
            "object store, MiB (peak, 1st / 2nd half)",
        ],
        rows,
    )
    out.append(f"RSS at iteration {warm} → {num(last)} (growth)")
    sync, async_ = runs["sync"], runs["async"]
    first = sync["samples"][0]
    early = _at(sync, soak["every"])
    warm_sample = _at(sync, warm)
    out.append(
        f"The first samples (iteration {first['iteration']}) were {first['driver']['rss_mib']:.0f}, "
        f"{first['runners'][0]['rss_mib']:.0f} and {first['learners'][0]['rss_mib']:.0f} MiB (sync)"
    )
    out.append(
        f"the driver's RSS was {first['driver']['rss_mib']:.0f}, {early['driver']['rss_mib']:.0f} and "
        f"{warm_sample['driver']['rss_mib']:.0f} MiB at iterations {first['iteration']}, {soak['every']} and {warm}"
    )
    uss = max(_at(run, last)["runners"][0]["uss_mib"] for run in runs.values()) / KIB_PER_MIB
    out.append(f"(about {uss:.1f} GiB of its own pages)")
    gains = {m: _at(r, last)["runners"][0]["rss_mib"] - _at(r, warm)["runners"][0]["rss_mib"] for m, r in runs.items()}
    per_it = [g * KIB_PER_MIB / (last - warm) for g in gains.values()]
    out.append(
        f"over the {last - warm} iterations after warm-up it gained {gains['sync']:.0f} MiB in sync mode and "
        f"{gains['async']:.0f} MiB in async mode, {min(per_it):.0f}–{max(per_it):.0f} KiB per iteration"
    )
    # The store holds one small object throughout plus the weight payloads in flight.
    samples = [s for run in runs.values() for s in run["samples"]]
    kept = min(s["object_store_mib"] for s in samples)
    assert all(s["object_store_objects"] >= 1 for s in samples)
    payload = [
        (s["object_store_mib"] - kept) / (s["object_store_objects"] - 1)
        for s in samples
        if s["object_store_objects"] > 1
    ]
    in_flight = {m: int(max(s["object_store_objects"] for s in r["samples"])) - 1 for m, r in runs.items()}
    out.append(
        f"The object store holds the weight payloads in flight (about {sum(payload) / len(payload):.1f} MiB each "
        f"here), beside one {kept:.1f} MiB object kept throughout: up to {in_flight['sync']} of them in sync mode, up "
        f"to {in_flight['async']} in async mode"
    )
    g = async_["growth"]
    out.append(
        f"its peak in the second half after warm-up was no higher than in the first (sync "
        f"{sync['growth']['object_store_mib_max_first_half']:.1f} / {sync['growth']['object_store_mib_max_second_half']:.1f}"
        f" MiB, async {g['object_store_mib_max_first_half']:.1f} / {g['object_store_mib_max_second_half']:.1f} MiB)"
    )
    assert all(
        r["growth"]["object_store_mib_max_second_half"] <= r["growth"]["object_store_mib_max_first_half"]
        for r in runs.values()
    )
    a_warm, a_last = _at(async_, warm), _at(async_, last)
    out.append(
        f"async held {a_last['object_store_mib']:.2f} MiB at iteration {num(last)} ({int(a_last['object_store_objects'])} "
        f"objects) against {a_warm['object_store_mib']:.2f} MiB at iteration {warm} ({int(a_warm['object_store_objects'])})"
    )
    return out


PAGE = Page(
    path="docs/results/soak.md",
    quotes=quotes,
    settings=(
        "# Long runs: memory over 1,000 iterations",
        "4 prompts × 4 completions per iteration plus 2 completions per prompt",
        "at most 3 new tokens",
        "(1,000 files per mode)",
        "held-out evaluation every 25 iterations",
        "(`max_staleness=2`)",
        "Every 25 iterations the benchmark reads",
    ),
)
