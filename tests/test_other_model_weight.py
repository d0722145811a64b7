"""P3O's weight on the tokens another model wrote (``other_model_weight``), checked by hand on tiny tensors."""

import pytest
import torch

from rllib_p3o.core.losses.p3o import P3OLossSettings, other_model_weights, p3o_loss


def test_each_form_weights_ratios_as_its_formula_says():
    ratio = torch.tensor([[0.1, 1.0, 3.0, 6.0]])
    ess = torch.full_like(ratio, 0.25)  # 1/ESS = 4
    assert other_model_weights(ratio, ess, "ess_cap")[0].tolist() == pytest.approx([0.1, 0.25, 0.25, 0.25])
    assert other_model_weights(ratio, ess, "inverse_ess_cap")[0].tolist() == pytest.approx([0.1, 1.0, 3.0, 4.0])
    assert other_model_weights(ratio, ess, "inverse_ess_mask")[0].tolist() == pytest.approx([0.1, 1.0, 3.0, 0.0])
    assert other_model_weights(ratio, ess, "ess_scaled_mask")[0].tolist() == pytest.approx([0.025, 0.25, 0.75, 0.0])
    alone = other_model_weights(ratio, ess, "inverse_ess_cap_alone", alone=True)
    beside = other_model_weights(ratio, ess, "inverse_ess_cap_alone", alone=False)
    assert alone[0].tolist() == pytest.approx([0.1, 1.0, 3.0, 4.0])
    assert beside[0].tolist() == pytest.approx([0.1, 0.25, 0.25, 0.25])
    with pytest.raises(ValueError, match="other_model_weight must be one of"):
        other_model_weights(ratio, ess, "clip")
    with pytest.raises(ValueError, match="other_model_weight must be one of"):
        P3OLossSettings(other_model_weight="clip")


@pytest.mark.parametrize(
    "form", ["ess_cap", "inverse_ess_cap", "inverse_ess_mask", "ess_scaled_mask", "inverse_ess_cap_alone"]
)
def test_only_another_models_rows_change_and_their_gradient_is_the_forms_weight(form):
    # Row 0 another model's (ratios 0.5, 1, 2, 4), row 1 the policy's own (ratios 1); one ESS over the batch.
    behavior = -torch.log(torch.tensor([[0.5, 1.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]]))
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 4, dtype=torch.bool)
    logprobs = torch.zeros(2, 4, requires_grad=True)
    loss, metrics = p3o_loss(
        logprobs, behavior, advantages, mask, behavior_kl=False,
        other_model_rows=torch.tensor([True, False]), other_model_weight=form,
    )  # fmt: skip
    loss.backward()
    ratios = [0.5, 1.0, 2.0, 4.0] + [1.0] * 4
    ess = sum(ratios) ** 2 / (8 * sum(r * r for r in ratios))
    assert float(metrics["ess"]) == pytest.approx(ess)
    expected_other = {
        "ess_cap": [min(r, ess) for r in ratios[:4]],
        "inverse_ess_cap": [min(r, 1 / ess) for r in ratios[:4]],
        "inverse_ess_mask": [r if r <= 1 / ess else 0.0 for r in ratios[:4]],
        "ess_scaled_mask": [ess * r if r <= 1 / ess else 0.0 for r in ratios[:4]],
        # The policy's own row is beside another model's: the cap.
        "inverse_ess_cap_alone": [min(r, ess) for r in ratios[:4]],
    }[form]
    # d/dlogπ of -w·logπ·A / N with N = 8 valid tokens.
    assert (-8 * logprobs.grad[0]).tolist() == pytest.approx(expected_other)
    assert (8 * logprobs.grad[1]).tolist() == pytest.approx([min(1.0, ess)] * 4)  # the own row: the paper's cap
    assert 1.0 < 1 / ess < 2.0  # so the mask leaves out the ratios 2 and 4, and the caps differ on each token


def test_alone_another_models_tokens_get_the_truncation_and_beside_the_policys_own_the_cap():
    # Both rows another model's (a recording trained alone): min(r, 1/ESS); a padded own row changes nothing, a valid
    # one (one token) turns every other-model token to min(r, ESS).
    behavior = -torch.log(torch.tensor([[0.5, 1.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    advantages = torch.tensor([1.0, 1.0, 1.0])
    rows = torch.tensor([True, True, False])

    def grads(mask):
        logprobs = torch.zeros(3, 4, requires_grad=True)
        loss, metrics = p3o_loss(
            logprobs, behavior, advantages, mask, behavior_kl=False,
            other_model_rows=rows, other_model_weight="inverse_ess_cap_alone",
        )  # fmt: skip
        loss.backward()
        return -float(metrics["num_tokens"]) * logprobs.grad[0], float(metrics["ess"])

    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2] = False
    weights, ess = grads(mask)
    assert weights.tolist() == pytest.approx([min(r, 1 / ess) for r in (0.5, 1.0, 2.0, 4.0)])
    mask[2, 0] = True
    weights, ess = grads(mask)
    assert weights.tolist() == pytest.approx([min(r, ess) for r in (0.5, 1.0, 2.0, 4.0)])
    assert ess < 0.9  # so the two weights differ on every token above the cap
