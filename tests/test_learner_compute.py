"""The learner's compute core (`rllib_p3o.learner.compute`): the bucket plan's call cost measured on the device (with
a fake clock: the test is about the plan, not this machine's speed), packing (log-probs, loss and gradients equal
the padded batch's on real tiny models), the compile option, and the options' validation."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

import rllib_p3o.learner.compute as compute
from rllib_p3o.core.losses.p3o import p3o_loss
from rllib_p3o.learner.compute import (
    DEFAULT_COMPILE,
    REAL_TOKENS,
    TOKEN_ENTROPY,
    TOKEN_LOGP,
    TOKEN_POSITIONS,
    TokenLogprobs,
    resolve_compile,
)
from rllib_p3o.learner.length_buckets import (
    DEFAULT_CALL_COST_TOKENS,
    MEASURE,
    measure_call_cost,
    plan_buckets,
    planned_call_cost,
)
from rllib_p3o.learner.packing import pack_capacity, pack_rows, plan_packing


class FakeDevice:
    """Time of a pass = ``(overhead + rows · width) · seconds_per_position``: a device whose forward pass costs
    ``overhead`` token positions of fixed cost. ``clock`` reads the time the passes so far took."""

    def __init__(self, overhead: float, seconds_per_position: float = 1e-6):
        self.overhead, self.unit, self.now, self.passes = overhead, seconds_per_position, 0.0, []

    def run_pass(self, rows: int, width: int) -> None:
        self.passes.append((rows, width))
        self.now += (self.overhead + rows * width) * self.unit

    def clock(self) -> float:
        return self.now


def _issue_batch(seed: int) -> np.ndarray:
    """16 rows of a 256-token prompt plus a completion of geometric length (mean 512, at most 1024)."""
    rng = np.random.default_rng(seed)
    return 256 + np.minimum(rng.geometric(1 / 512, 16), 1024)


@pytest.mark.parametrize("overhead", [0, 64, 2000, 50_000])
def test_the_measurement_recovers_a_devices_fixed_cost_per_pass(overhead):
    device = FakeDevice(overhead)
    assert measure_call_cost(device.run_pass, clock=device.clock) == pytest.approx(overhead, abs=1e-6)
    assert {w for _, w in device.passes} == {256, 1024}  # a pair of widths, warm-up then timed repeats


def test_a_wider_pass_that_is_not_slower_means_one_pass_and_the_budget_bounds_the_measurement():
    flat = FakeDevice(overhead=1000)
    assert measure_call_cost(flat.run_pass, clock=lambda: 0.0) == float("inf")
    slow = FakeDevice(overhead=0, seconds_per_position=1.0)  # each warm-up pass alone takes longer than the budget
    assert measure_call_cost(slow.run_pass, clock=slow.clock, budget_s=10.0) is None
    assert len(slow.passes) == 2  # only the warm-up ran


def test_a_high_call_cost_plans_one_bucket_and_a_low_one_many():
    lengths = _issue_batch(0)
    for overhead, expected in ((50_000, 1), (16, None)):
        device = FakeDevice(overhead)
        buckets = plan_buckets(lengths, planned_call_cost(measure_call_cost(device.run_pass, clock=device.clock)))
        assert len(buckets) == 1 if expected == 1 else len(buckets) >= 8


@pytest.mark.parametrize("seed", range(20))
def test_a_device_with_2000_positions_of_overhead_plans_at_most_two_passes_for_the_issue_batch(seed):
    device = FakeDevice(overhead=2000)
    cost = planned_call_cost(measure_call_cost(device.run_pass, clock=device.clock))
    assert len(plan_buckets(_issue_batch(seed), cost)) <= 2
    assert len(plan_buckets(_issue_batch(seed), DEFAULT_CALL_COST_TOKENS)) >= 6  # the CPU default planned 6-12


def _tiny_lm(kind: str = "qwen2", attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    sizes = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    config = (Qwen2Config if kind == "qwen2" else LlamaConfig)(num_key_value_heads=2, **sizes)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def test_the_core_measures_its_own_forward_passes_and_caches_the_result(monkeypatch):
    """Real forward/backward passes of a tiny model, timed by a fake clock that charges each pass as a device with a
    fixed cost per pass would: the plan follows the device's costs."""
    monkeypatch.setattr(compute, "_CALL_COST_CACHE", {})
    lm = _tiny_lm()
    lengths = _issue_batch(3)
    plans = {}
    for overhead in (2000, 16):
        compute._CALL_COST_CACHE.clear()
        device = FakeDevice(overhead)
        lm.model.register_forward_hook(
            lambda m, args, kw, out: device.run_pass(*kw["input_ids"].shape), with_kwargs=True
        )
        core = TokenLogprobs(lm, length_buckets=MEASURE, pack_sequences=False, clock=device.clock)
        core.prepare("cpu")
        lm.model._forward_hooks.clear()
        assert core.bucket_call_cost == pytest.approx(planned_call_cost(overhead), rel=1e-6)
        assert all(p.grad is None for p in lm.parameters())  # the measurement's gradients are not left behind
        plans[overhead] = len(plan_buckets(lengths, core.bucket_call_cost))
    assert plans[2000] <= 2 < 8 <= plans[16]
    other = TokenLogprobs(lm, length_buckets=MEASURE, pack_sequences=False, clock=lambda: 1 / 0)
    other.prepare("cpu")  # the same model on the same device: from the cache, nothing timed
    assert other.bucket_call_cost == pytest.approx(planned_call_cost(16), rel=1e-6)


def test_on_a_cpu_the_default_keeps_the_constant_call_cost_and_does_not_pack():
    core = TokenLogprobs(_tiny_lm(), clock=lambda: 1 / 0)  # nothing may be timed
    core.prepare("cpu")
    assert core.bucket_call_cost == DEFAULT_CALL_COST_TOKENS and not core.packing


def test_the_pack_plan_covers_every_row_once_within_its_capacity_and_restarts_positions():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 40, size=17)
    plan = plan_packing(lengths, pack_capacity(lengths, "sdpa"))
    assert plan.width <= lengths.max() and plan.num_packed < len(lengths)
    used = np.zeros((plan.num_packed, plan.width), dtype=int)
    for i, n in enumerate(lengths):
        used[plan.packed_row[i], plan.offset[i] : plan.offset[i] + n] += 1
    assert used.max() == 1 and used.sum() == lengths.sum()  # no overlap, every token placed
    ids = torch.as_tensor(rng.integers(0, 50, size=(17, 40)))
    packed, positions = pack_rows(ids, plan)
    for i, n in enumerate(lengths):
        b, o = plan.packed_row[i], plan.offset[i]
        assert torch.equal(packed[b, o : o + n], ids[i, :n])
        assert torch.equal(positions[b, o : o + n], torch.arange(n))
    assert plan_packing(lengths, pack_capacity(lengths, "flash_attention_2")).num_packed == 1  # varlen: one row


def _batch(vocab, rows=11, width=40, prompt=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt + 1, width + 1, (rows,), generator=g)
    lengths[3] = width
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    targets = torch.arange(width - 1)[None]
    completion = (targets >= prompt - 1) & (targets < lengths[:, None] - 1)
    behavior = -torch.rand(rows, width - 1, generator=g) * 3
    return ids, mask, completion, behavior, torch.randn(rows, generator=g)


@pytest.mark.parametrize("kind,attn", [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")])
def test_packed_rows_give_the_padded_log_probs_entropies_loss_and_gradients(kind, attn):
    lm = _tiny_lm(kind, attn)
    ids, mask, completion, behavior, advantages = _batch(lm.config.vocab_size)

    def run(**options):
        core = TokenLogprobs(lm, **options)
        core.prepare("cpu")
        lm.zero_grad()
        out = core.token_logprobs(ids, mask, with_entropy=True)
        loss, stats = p3o_loss(out[TOKEN_LOGP], behavior, advantages, completion)
        loss.backward()
        return core, out, loss.detach(), stats["ess"], {n: p.grad.clone() for n, p in lm.named_parameters()}

    _, padded, loss_p, ess_p, grads_p = run(length_buckets=False, pack_sequences=False)
    core, packed, loss_k, ess_k, grads_k = run(pack_sequences=True)
    assert core.packing
    assert packed[REAL_TOKENS] == float(mask.sum())
    assert packed[TOKEN_POSITIONS] < padded[TOKEN_POSITIONS] == ids.numel()
    for key in (TOKEN_LOGP, TOKEN_ENTROPY):
        torch.testing.assert_close(packed[key][completion], padded[key][completion], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_k, loss_p, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ess_k, ess_p, atol=1e-7, rtol=1e-6)
    for name, grad in grads_p.items():
        torch.testing.assert_close(grads_k[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_packing_is_refused_where_the_packed_forward_does_not_keep_sequences_apart(monkeypatch):
    """A backend that ignored the restarting position ids would let a row attend to the rows packed before it: the
    check on the model itself sees the log-probs change and keeps the bucket plan."""
    original = compute.pack_rows

    def positions_without_restarts(input_ids, plan):
        packed, positions = original(input_ids, plan)
        return packed, torch.arange(positions.shape[1]).expand_as(positions)

    monkeypatch.setattr(compute, "pack_rows", positions_without_restarts)
    core = TokenLogprobs(_tiny_lm(seed=1), pack_sequences=True)
    core.prepare("cpu")
    assert not core.packing and core.bucket_call_cost == DEFAULT_CALL_COST_TOKENS


def test_compile_compiles_each_decoder_layer_with_dynamic_shapes_and_can_be_undone():
    lm = _tiny_lm()
    core = TokenLogprobs(lm, compile=True)
    core.prepare("cpu")
    assert core._compiled == list(lm.model.layers)
    assert all(layer._compiled_call_impl is not None for layer in lm.model.layers)
    core.uncompile()
    assert all(layer._compiled_call_impl is None for layer in lm.model.layers)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"length_buckets": "yes"}, "length_buckets must be"),
        ({"pack_sequences": "always"}, "pack_sequences must be 'auto', True or False"),
        ({"pack_sequences": 1}, "pack_sequences must be"),
        ({"compile": "max-autotune"}, "compile must be 'auto', True or False"),
    ],
)
def test_the_options_are_validated_with_the_config(tiny_model, options, message):
    from rllib_p3o import P3OConfig

    config = P3OConfig().environment(env_config={"dataset": [{"prompt": "1+1="}]}).training(model=tiny_model)
    config.rl_module(model_config={"pack_sequences": True, "compile": False, "length_buckets": MEASURE}).validate()
    with pytest.raises(ValueError, match=message):
        config.copy(copy_frozen=False).rl_module(model_config=options).validate()


@pytest.mark.parametrize(
    "setting,device,adapter,compiled",
    [
        ("auto", "cuda", False, True),  # the GPU default: the fastest exact path measured on an H200
        ("auto", "cuda", True, False),  # a LoRA model's compiled step was not measured: eager
        ("auto", "cuda", "checkpointing", False),  # nor one under activation checkpointing
        ("auto", "cpu", False, False),  # the CPU paths were tuned eager
        (True, "cpu", True, True),
        (False, "cuda", False, False),
    ],
)
def test_compile_auto_compiles_a_full_weight_model_on_cuda_only(setting, device, adapter, compiled):
    checkpointing = adapter == "checkpointing"
    assert resolve_compile(setting, torch.device(device), adapter is True, checkpointing) is compiled


def test_the_default_core_on_a_cpu_stays_eager():
    lm = _tiny_lm()
    core = TokenLogprobs(lm)
    assert core.compile == DEFAULT_COMPILE == "auto"
    core.prepare("cpu")
    assert core._compiled == [] and all(layer._compiled_call_impl is None for layer in lm.model.layers)


def test_the_fused_head_auto_keeps_the_chunked_head_on_cuda():
    """On a GPU the chunked head was faster (the H200 session), so "auto" takes it there; on a CPU, past the chunking
    threshold, the fused head. The device is set by hand (CI has no GPU): this is about the routing alone."""
    core = TokenLogprobs(_tiny_lm(), fused_head="auto")
    core.head_chunking_min_bytes = 0  # every batch past the threshold
    core.prepare("cpu")
    assert core.uses_fused_head(100)
    core._prepared_for = torch.device("cuda", 0)
    assert not core.uses_fused_head(100)
    core.fused_head = "on"
    assert core.uses_fused_head(100)
