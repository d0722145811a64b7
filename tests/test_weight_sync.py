"""The driver's side of weight sync without Ray or engines (this test is about the push, so the learner group and
the runners are fakes): a runner that does not answer in time is named in an error, a dead one is left out."""

from types import SimpleNamespace

import pytest
import torch

from rllib_p3o.weight_sync import WeightSync, WeightSyncError


class _Learners:
    """Stands in for a LearnerGroup: one tensor of module state."""

    def get_state(self, components, inference_only):
        return {"learner": {"rl_module": {"default_policy": {"lm.w": torch.zeros(2)}}}}


class _Runners:
    """Stands in for `EngineRunners`: runner 2 never answers (hung), runner 3 answers once, then dies."""

    def __init__(self, hung=(2,), dead=()):
        self.healthy, self.hung, self.dead = [1, 2, 3], set(hung), set(dead)

    def healthy_ids(self):
        return list(self.healthy)

    def call(self, fns, timeout_s=None):
        out = {}
        for i, fn in fns.items():
            if i in self.dead:
                self.healthy.remove(i)
            elif i not in self.hung:
                out[i] = fn(SimpleNamespace(load_policy_weights=lambda payload: {"load_s": 0.1 * i}))
        return out


@pytest.fixture(autouse=True)
def _no_object_store(monkeypatch):
    monkeypatch.setattr("rllib_p3o.weight_sync.ray.put", lambda x: x)


def test_a_hung_runner_is_named_never_waited_for_forever():
    sync = WeightSync(_Learners(), _Runners(hung=(2,)), probe_token_ids=None, timeout_s=0.5)
    with pytest.raises(WeightSyncError, match=r"EnvRunner 2 did not finish loading weights v1 within "
                                              r"weight_sync_timeout_s=0.5 s"):
        sync.push()


def test_a_runner_that_dies_during_the_push_is_left_to_the_restart():
    runners = _Runners(hung=(), dead=(3,))
    stats = WeightSync(_Learners(), runners, probe_token_ids=None, timeout_s=0.5).push()
    assert stats["load_s"] == pytest.approx(0.2) and stats["bytes"] > 0 and runners.healthy_ids() == [1, 2]
