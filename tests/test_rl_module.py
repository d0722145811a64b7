"""The HF causal-LM RLModule: token log-probs (chunked head) against the model's own forward, export."""

import numpy as np
import pytest
import torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from transformers import AutoModelForCausalLM

from rllib_p3o.learner.rl_module import HEAD_CHUNKING_MIN_BYTES, TOKEN_ENTROPY, TOKEN_LOGP, HFCausalLMRLModule
from rllib_p3o.runner.env import TextEnv


def _module(path, **extra):
    spec = RLModuleSpec(
        module_class=HFCausalLMRLModule,
        observation_space=TextEnv.observation_space_default(),
        action_space=TextEnv.action_space_default(),
        model_config={"model": path, "logprob_chunk_size": 2, **extra},
    )
    return spec.build()


def _padded_batch(vocab, b=5, t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 6:] = 0
    mask[3, 4:] = 0
    return ids, mask


def _reference(lm, ids, mask):
    logits = lm(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunked", [True, False], ids=["checkpointed-chunks", "small-logits-one-piece"])
def test_token_logprobs_match_full_forward_and_gradients(tiny_model, chunked):
    module = _module(tiny_model, compute_entropy=True)
    assert module._chunked_head_ok
    # The tiny model's logits are far below the chunking threshold: force chunks (of 2 sequences) for that case.
    module.head_chunking_min_bytes = 0 if chunked else HEAD_CHUNKING_MIN_BYTES
    ids, mask = _padded_batch(module.lm.config.vocab_size)
    out = module.forward_train({"input_ids": ids, "attention_mask": mask})
    ref_lp, ref_ent = _reference(module.lm, ids, mask)
    valid = mask[:, 1:].bool()
    torch.testing.assert_close(out[TOKEN_LOGP][valid], ref_lp[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[TOKEN_ENTROPY][valid], ref_ent[valid], atol=1e-5, rtol=1e-5)

    # Gradients through the (checkpointed) chunks equal those of the plain full-logits computation.
    w = torch.randn(out[TOKEN_LOGP].shape, generator=torch.Generator().manual_seed(1)) * valid
    (out[TOKEN_LOGP] * w).sum().backward()
    g_chunked = {n: p.grad.clone() for n, p in module.lm.named_parameters()}
    module.lm.zero_grad()
    ref_lp, _ = _reference(module.lm, ids, mask)
    (ref_lp * w).sum().backward()
    for n, p in module.lm.named_parameters():
        torch.testing.assert_close(g_chunked[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_a_batch_that_is_not_right_padded_keeps_its_attention_mask(tiny_model):
    """Right-padded batches run without a mask (causal attention never reaches the padding after the real tokens);
    any other padding must still be masked, or real tokens would attend to pad tokens."""
    module = _module(tiny_model)
    ids, right = _padded_batch(module.lm.config.vocab_size)
    left = right.flip(-1)  # rows 1 and 3 padded on the left
    with torch.no_grad():
        for mask in (right, left):
            out = module.forward_train({"input_ids": ids, "attention_mask": mask})[TOKEN_LOGP]
            ref_lp, _ = _reference(module.lm, ids, mask)
            valid = (mask[:, 1:] * mask[:, :-1]).bool()
            torch.testing.assert_close(out[valid], ref_lp[valid], atol=1e-5, rtol=1e-5)
        unmasked = module.forward_train({"input_ids": ids, "attention_mask": torch.ones_like(left)})[TOKEN_LOGP]
        assert not torch.allclose(unmasked[1][valid[1]], out[1][valid[1]], atol=1e-4)  # the mask mattered here


def test_state_is_torch_and_export_roundtrips(tiny_model, tmp_path):
    module = _module(tiny_model)
    state = module.get_state()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    with torch.no_grad():
        module.lm.model.embed_tokens.weight.add_(0.5)  # make the exported weights differ from the base model
    out_dir = module.save_pretrained(str(tmp_path / "export"))
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir)
    ids, mask = _padded_batch(module.lm.config.vocab_size)
    with torch.no_grad():
        mine = module.token_logprobs(ids, mask)[TOKEN_LOGP]
        theirs, _ = _reference(reloaded, ids, mask)
    valid = mask[:, 1:].bool()
    torch.testing.assert_close(mine[valid], theirs[valid], atol=1e-5, rtol=1e-5)
    assert (tmp_path / "export" / "tokenizer.json").exists()


def test_bfloat16_state_roundtrip(tiny_model):
    module = _module(tiny_model, dtype="bfloat16")
    state = module.get_state()
    assert next(iter(state.values())).dtype == torch.bfloat16
    other = _module(tiny_model, dtype="bfloat16")
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.set_state(state)
    for (n, a), b in zip(module.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), n
    assert np.isfinite(module.sequence_logprobs([3, 4, 5, 6])).all()


def test_gradient_checkpointing_recomputes_and_gives_the_same_logprobs_and_gradients(tiny_model):
    """``model_config={"gradient_checkpointing": True}`` (documented in the configuration reference) turns the model's
    activation checkpointing on; the log-probs and gradients are those of the model without it."""
    runs = {}
    for checkpointing in (False, True):
        module = _module(tiny_model, gradient_checkpointing=checkpointing)
        module.lm.train()
        assert module.lm.is_gradient_checkpointing is checkpointing
        ids, mask = _padded_batch(module.lm.config.vocab_size)
        module.lm.zero_grad(set_to_none=True)
        logp = module.forward_train({"input_ids": ids, "attention_mask": mask})[TOKEN_LOGP]
        (logp * mask[:, 1:]).sum().backward()
        runs[checkpointing] = (logp.detach(), {n: p.grad for n, p in module.lm.named_parameters()})
    (logp_a, grads_a), (logp_b, grads_b) = runs[False], runs[True]
    torch.testing.assert_close(logp_a, logp_b)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, msg=name)
