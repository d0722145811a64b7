"""The fused LM head in the learner (``fused_head``): through the RLModule users build, its log-probs and every
parameter's gradient equal today's chunked head's (float32, within 1e-5) on the tiny models, packed or in buckets,
with kept sets, and at Qwen's vocabulary (151,936) where "auto" takes it by itself; and each case it cannot serve is
refused with its reason ("on") or left to today's path ("auto"): a head that is not a plain ``nn.Linear``, entropies,
logits the model scales or soft-caps otherwise than ``cap·tanh(x / cap)``. Which head ran is seen by counting the
calls of `fused_token_logprobs`, so a setting that silently fell back would fail here."""

import pytest
import torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

import rllib_p3o.learner.compute as compute
from rllib_p3o.core.columns import KEPT_OVERFLOW, Columns
from rllib_p3o.core.settings import DEFAULT_FUSED_HEAD, P3OSettings
from rllib_p3o.learner.compute import ENTROPY_REFUSAL, TOKEN_LOGP, TokenLogprobs
from rllib_p3o.learner.rl_module import HFCausalLMRLModule
from rllib_p3o.runner.env import TextEnv

ATOL = 1e-5
QWEN_VOCAB = 151_936


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times the learner called the fused head."""
    calls = []
    real = compute.fused_token_logprobs

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(compute, "fused_token_logprobs", counted)
    return calls


@pytest.fixture(scope="module")
def qwen_vocab_model(tmp_path_factory):
    """A one-layer Qwen2 with Qwen's vocabulary and a small hidden size (its embedding: 19 MB), tied as Qwen2.5."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    path = str(tmp_path_factory.mktemp("models") / "qwen_vocab")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _module(path, **extra):
    spec = RLModuleSpec(
        module_class=HFCausalLMRLModule,
        observation_space=TextEnv.observation_space_default(),
        action_space=TextEnv.action_space_default(),
        model_config={"model": path, "logprob_chunk_size": 2, **extra},
    )
    return spec.build()


def _batch(vocab, rows=5, width=11, kept_width=0, seed=0):
    """Right-padded rows of different lengths; with ``kept_width``, kept sets of every kind (full, padded, none,
    overflowed, a target outside its set)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, width), generator=g)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    batch = {"input_ids": ids, "attention_mask": mask}
    if kept_width:
        kept = torch.randint(0, vocab, (rows, width - 1, kept_width), generator=g)
        kept[..., 0] = ids[:, 1:]
        kept[:, 1::4, 2:] = -1
        kept[:, 2::4] = -1
        kept[:, 3::4, 0] = KEPT_OVERFLOW
        kept[:, 3::4, 1:] = -1
        kept[1, :, 0] = (ids[1, 1:] + 1) % vocab
        batch[Columns.KEPT_IDS] = kept
    return batch, mask[:, 1:].bool()


def _logp_and_grads(module, batch, valid):
    """Log-probs on real targets and every parameter's gradient of a weighted token mean of them (as a loss is)."""
    module.lm.zero_grad(set_to_none=True)
    logp = module.forward_train(batch)[TOKEN_LOGP]
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1)) * valid / valid.sum()
    (logp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.lm.named_parameters() if p.grad is not None}
    return logp.detach()[valid], grads


def _assert_equal(got, want):
    (logp_a, grads_a), (logp_b, grads_b) = got, want
    torch.testing.assert_close(logp_a, logp_b, atol=ATOL, rtol=0)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, grad in grads_b.items():
        torch.testing.assert_close(grads_a[name], grad, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("model", ["tiny_model", "tiny_untied_model"])
@pytest.mark.parametrize("packed", [False, True], ids=["buckets", "packed"])
@pytest.mark.parametrize("kept_width", [0, 4], ids=["full", "kept_sets"])
def test_on_gives_the_chunked_heads_log_probs_and_gradients_through_the_module(
    request, fused_calls, model, packed, kept_width
):
    path = request.getfixturevalue(model)
    runs = {}
    for fused_head in ("off", "on"):
        module = _module(path, fused_head=fused_head, pack_sequences=packed, length_buckets=4)
        module.head_chunking_min_bytes = 0  # today's head in checkpointed chunks (of 2 sequences), as on big batches
        module.core.fused_chunk_tokens = 7  # token chunks that split rows
        batch, valid = _batch(module.lm.config.vocab_size, kept_width=kept_width)
        runs[fused_head] = _logp_and_grads(module, batch, valid)
        assert module.core.packing is packed
    assert fused_calls  # "on" ran the fused head ("off" never does)
    _assert_equal(runs["on"], runs["off"])


def test_auto_takes_the_fused_head_at_qwens_vocabulary_and_equals_the_chunked_head(qwen_vocab_model, fused_calls):
    """3 rows of 40 tokens: 117 targets × 151,936 float32 logits = 71 MB, past the 64 MiB where today's head chunks;
    "auto" (the default) takes the fused head there, and its log-probs and gradients equal the chunked head's."""
    batch, valid = _batch(QWEN_VOCAB, rows=3, width=40)
    default = _module(qwen_vocab_model)
    assert default.core.fused_head == DEFAULT_FUSED_HEAD == "auto"
    assert default.core.uses_fused_head(int(valid.numel()))
    fused = _logp_and_grads(default, batch, valid)
    assert len(fused_calls) == 1
    chunked = _logp_and_grads(_module(qwen_vocab_model, fused_head="off"), batch, valid)
    assert len(fused_calls) == 1
    assert fused[0].mean() < -11.0  # near log(1/151,936): the whole vocabulary is in the normalizer
    _assert_equal(fused, chunked)


def test_auto_below_the_chunking_threshold_is_todays_path_bit_for_bit(tiny_model, fused_calls):
    auto, off = _module(tiny_model), _module(tiny_model, fused_head="off")
    batch, valid = _batch(auto.lm.config.vocab_size)
    logp_auto, grads_auto = _logp_and_grads(auto, batch, valid)
    logp_off, grads_off = _logp_and_grads(off, batch, valid)
    assert not fused_calls
    assert torch.equal(logp_auto, logp_off)
    assert all(torch.equal(grads_auto[n], g) for n, g in grads_off.items())


def test_entropies_are_refused_by_on_and_take_the_chunked_head_under_auto(tiny_model, fused_calls):
    with pytest.raises(ValueError, match="computes log-probs only, and an entropy bonus needs"):
        _module(tiny_model, fused_head="on", compute_entropy=True)
    module = _module(tiny_model, fused_head="auto", compute_entropy=True)
    module.head_chunking_min_bytes = 0  # "auto" would take the fused head but for the entropies
    batch, _ = _batch(module.lm.config.vocab_size)
    assert compute.TOKEN_ENTROPY in module.forward_train(batch) and not fused_calls
    core = TokenLogprobs(module.lm, fused_head="on")
    with pytest.raises(ValueError, match="fused_head='on' computes log-probs only"):
        core.token_logprobs(batch["input_ids"], batch["attention_mask"], with_entropy=True)


class _ScaledHead(torch.nn.Linear):
    """A head that is an ``nn.Linear`` subclass doing more than its weight: the fused head would skip the scale."""

    def forward(self, x):
        return 0.5 * super().forward(x)


def _lora_head(lm):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(lm, LoraConfig(r=2, lora_alpha=4, target_modules=["lm_head"], init_lora_weights=False))


def _scaled_head(lm):
    head = lm.lm_head
    scaled = _ScaledHead(head.in_features, head.out_features, bias=False)
    scaled.weight = head.weight
    lm.lm_head = scaled
    return lm


def _hooked_head(lm):
    lm.lm_head.register_forward_hook(lambda module, args, out: out * 0.5)
    return lm


def _declared_softcap(lm):
    lm.config.final_logit_softcapping = 3.0  # declared, but Qwen2's forward applies no soft-cap
    return lm


def _logit_scale(_tiny):
    """A Cohere model: its forward multiplies the logits by ``logit_scale`` (a scale the fused head does not apply)."""
    config = AutoConfig.for_model(
        "cohere",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        logit_scale=0.25,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
@pytest.mark.parametrize(
    "variant,reason",
    [
        (_lora_head, r"its LM head is a peft\.tuners\.lora\.[\w.]*Linear, not a plain torch\.nn\.Linear"),
        (_scaled_head, r"its LM head is a [\w.]*_ScaledHead, not a plain torch\.nn\.Linear"),
        (_hooked_head, "its LM head has forward hooks"),
        (_declared_softcap, r"its logits are not lm_head\(last hidden state\), soft-capped as cap·tanh"),
        (_logit_scale, r"its logits are not lm_head\(last hidden state\)"),
    ],
    ids=["lora_on_the_head", "linear_subclass", "forward_hook", "softcap_the_forward_does_not_apply", "logit_scale"],
)
def test_a_head_the_fused_head_cannot_serve_is_refused_by_on_and_left_to_todays_path_by_auto(
    tiny_model, fused_calls, variant, reason
):
    lm = variant(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    with pytest.raises(ValueError, match=rf"fused_head='on' cannot serve tiny: {reason}"):
        TokenLogprobs(lm, fused_head="on", name="tiny")
    batch, valid = _batch(lm.config.vocab_size)
    out = {}
    for mode in ("auto", "off"):
        core = TokenLogprobs(lm, fused_head=mode, length_buckets=False, pack_sequences=False)
        core.head_chunking_min_bytes = 0  # "auto" would take the fused head on a plain head
        assert core.fused_head_refusal and not core.uses_fused_head(10**9)
        out[mode] = core.token_logprobs(batch["input_ids"], batch["attention_mask"])[TOKEN_LOGP].detach()[valid]
    assert not fused_calls
    assert torch.equal(out["auto"], out["off"])
    # ...and today's path is the model's own log-probs (the refusal did not hide a wrong head).
    with torch.no_grad():
        logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    own = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0][valid]
    torch.testing.assert_close(out["off"], own, atol=ATOL, rtol=0)


def test_a_soft_cap_the_model_applies_is_covered(fused_calls):
    """Gemma2 soft-caps its logits as ``cap·tanh(x / cap)``: the fused head serves it, equal to the chunked head."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gemma2",
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=2.0,
    )
    lm = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    batch, valid = _batch(97, kept_width=3)
    runs = {}
    for mode in ("on", "off"):
        core = TokenLogprobs(lm, fused_head=mode, length_buckets=False, pack_sequences=False)
        core.head_chunking_min_bytes = 0
        assert core.fused_head_refusal is None
        lm.zero_grad(set_to_none=True)
        logp = core.token_logprobs(batch["input_ids"], batch["attention_mask"], kept_ids=batch[Columns.KEPT_IDS])
        (logp[TOKEN_LOGP] * valid).sum().div(valid.sum()).backward()
        runs[mode] = (logp[TOKEN_LOGP].detach()[valid], {n: p.grad.clone() for n, p in lm.named_parameters()})
    assert len(fused_calls) == 1
    _assert_equal(runs["on"], runs["off"])


def test_the_setting_reaches_the_module_and_is_validated_with_the_config(tiny_model):
    from rllib_p3o import P3OConfig

    assert P3OSettings().fused_head == DEFAULT_FUSED_HEAD
    config = P3OConfig().environment(env_config={"dataset": [{"prompt": "1+1="}]}).training(model=tiny_model)
    assert config.lm_model_config()["fused_head"] == "auto"
    config.copy(copy_frozen=False).training(fused_head="on").validate()
    off = config.copy(copy_frozen=False).training(fused_head="off")
    assert off.lm_model_config()["fused_head"] == "off"
    with pytest.raises(ValueError, match="fused_head must be one of auto, on, off, got 'yes'"):
        config.copy(copy_frozen=False).training(fused_head="yes").validate()
    with pytest.raises(ValueError, match="entropy_coeff=0.01: fused_head='on' computes log-probs only"):
        config.copy(copy_frozen=False).training(fused_head="on", entropy_coeff=0.01).validate()
    with pytest.raises(ValueError, match="entropy_coeff=0.01: fused_head='on' computes log-probs only"):
        config.copy(copy_frozen=False).training(entropy_coeff=0.01).rl_module(
            model_config={"fused_head": "on"}
        ).validate()
    with pytest.raises(ValueError, match="rl_module model_config: fused_head must be one of 'auto', 'on', 'off'"):
        config.copy(copy_frozen=False).rl_module(model_config={"fused_head": True}).validate()
    config.copy(copy_frozen=False).training(fused_head="auto", entropy_coeff=0.01).validate()  # auto: chunked head
    assert ENTROPY_REFUSAL.startswith("fused_head='on'")
