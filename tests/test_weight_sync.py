"""The driver's side of weight sync without Ray or engines (this test is about the push, so the learner group and
the runners are fakes): a runner that does not answer in time is named in an error, a dead one is left out."""

from types import SimpleNamespace

import pytest
import torch

from rllib_p3o.driver.weight_sync import WeightSync
from rllib_p3o.sync.payload import PackedTensors, hf_weights
from rllib_p3o.sync.probe import WeightSyncError


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
    monkeypatch.setattr("rllib_p3o.driver.weight_sync.ray.put", lambda x: x)


def test_a_hung_runner_is_named_never_waited_for_forever():
    sync = WeightSync(_Learners(), _Runners(hung=(2,)), probe_token_ids=None, timeout_s=0.5)
    with pytest.raises(
        WeightSyncError,
        match=r"EnvRunner 2 did not finish loading weights v1 within "
        r"weight_sync_timeout_s=0.5 s",
    ):
        sync.push()


def test_a_runner_that_dies_during_the_push_is_left_to_the_restart():
    runners = _Runners(hung=(), dead=(3,))
    stats = WeightSync(_Learners(), runners, probe_token_ids=None, timeout_s=0.5).push()
    assert stats["load_s"] == pytest.approx(0.2) and stats["bytes"] > 0 and runners.healthy_ids() == [1, 2]


def test_packed_tensors_come_back_bit_exact_in_every_dtype_and_shape():
    """The payload's transport form (byte arrays for the object store); a pickle round trip stands in for Ray's."""
    import pickle

    g = torch.Generator().manual_seed(0)
    state = {
        "lm.a.weight": torch.randn(4, 6, generator=g),
        "lm.b.weight": torch.randn(6, 4, generator=g).t(),  # not contiguous
        "lm.c.bias": torch.randn(5, generator=g).to(torch.bfloat16),  # numpy has no bfloat16
        "lm.d.scale": torch.tensor(0.5, dtype=torch.float16),  # 0-d
        "lm.lm_head.weight": torch.randn(3, 2, generator=g),
    }
    back = pickle.loads(pickle.dumps(PackedTensors(state))).unpack()
    assert set(back) == set(state)
    for k, t in state.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch.equal(back[k], t), k
    hf = hf_weights(PackedTensors(state), tied_embeddings=True)
    assert set(hf) == {"a.weight", "b.weight", "c.bias", "d.scale"}  # HF names; the tied head is vLLM's to re-tie


def test_learner_probes_check_what_runners_return_against_the_same_version():
    """The driver's side of riding-along checks (`rllib_p3o.driver.weight_sync.LearnerProbes`); the learner is a function here."""
    from rllib_p3o.driver.weight_sync import LearnerProbes
    from rllib_p3o.sync.probe import ProbeResult

    weights = {"v": 0.0}
    probes = LearnerProbes(lambda: [-1.0 - weights["v"], -2.0], tolerance=1e-3, keep=2)
    for version in (1, 2):
        probes.start(version)
        probes.settle()  # scored before the learner's weights change
        weights["v"] += 0.5
    assert probes.check(ProbeResult(3, 2, [-1.5, -2.0])) == 0.0
    probes.require_verified(3, 2)
    with pytest.raises(WeightSyncError, match=r"EnvRunner 4 returned samples of weights v2 without a probe check"):
        probes.require_verified(4, 2)
    with pytest.raises(
        WeightSyncError, match=r"EnvRunner 4: with weights v1 the engine's log-prob of probe token 1 differs .* 0\.5"
    ):
        probes.check(ProbeResult(4, 1, [-1.5, -2.0]))  # v2's log-probs reported as v1's
    probes.start(3)  # keep=2: v1 is dropped; its samples are too stale to be used
    assert probes.check(ProbeResult(4, 1, [0.0, 0.0])) is None
    probes.require_verified(4, 1)

    failing = LearnerProbes(lambda: 1 / 0, tolerance=1e-3, keep=2)
    failing.start(1)
    with pytest.raises(ZeroDivisionError):
        failing.settle()
    probes.close()


def test_the_learner_probe_thread_leaves_the_learners_openmp_threads_alone():
    """The background probe scores on one OpenMP thread of its own, and the learner's (main) thread keeps its count:
    a default-sized team on the probe thread makes libgomp stop spin-waiting, which slowed the learner's update."""
    from rllib_p3o.driver.weight_sync import LearnerProbes

    before = torch.get_num_threads()
    seen = []

    def score():
        seen.append(torch.get_num_threads())
        return [float(torch.ones(64, 64).matmul(torch.ones(64, 64)).sum())]

    probes = LearnerProbes(score, tolerance=1e-3, keep=2)
    probes.start(1)
    probes.settle()
    probes.close()
    assert seen == [1] and torch.get_num_threads() == before


class _SlowLoads:
    """Stands in for `EngineRunners` over runner 1 with RLlib's per-tag in-flight limit (this test is about the
    driver's pushes, not Ray): a started load comes back only after ``polls_per_load`` polls, and a call started
    while the limit is reached is skipped, as RLlib's actor manager skips it."""

    def __init__(self, limit, polls_per_load):
        self.limit, self.polls_per_load = limit, polls_per_load
        self.in_flight = []  # [polls left] per started load, oldest first
        self.loaded, self.skipped = [], 0

    def healthy_ids(self):
        return [1]

    def max_in_flight(self):
        return self.limit

    def start(self, fns, tag):
        assert tag == "sync"
        if len(self.in_flight) >= self.limit:
            self.skipped += 1
            return
        version = fns[1](SimpleNamespace(load_policy_weights=lambda payload: payload["weights_seq_no"]))
        self.in_flight.append([self.polls_per_load, version])

    def fetch_ready(self, tag, timeout_s):
        if not self.in_flight:
            return []
        self.in_flight[0][0] -= 1
        if self.in_flight[0][0] > 0:
            return []
        _, version = self.in_flight.pop(0)
        self.loaded.append(version)
        return [(1, {"load_s": 0.0})]


@pytest.mark.parametrize("limit", [1, 2])
def test_a_push_waits_for_the_runners_oldest_load_instead_of_being_skipped(monkeypatch, limit):
    """Non-blocking pushes to a runner still loading an earlier version: every version reaches it, in order (a
    skipped push would leave it on older weights for as long as timing decides)."""
    monkeypatch.setattr(WeightSync, "_payload", lambda self, check_at_load: {"weights_seq_no": self.weights_seq_no})
    runners = _SlowLoads(limit=limit, polls_per_load=3)
    sync = WeightSync(_Learners(), runners, probe_token_ids=None, push_async=True, timeout_s=5.0)
    for _ in range(6):
        sync.push()
    while runners.in_flight:
        runners.fetch_ready("sync", 0.0)
    assert runners.skipped == 0 and runners.loaded == [1, 2, 3, 4, 5, 6]
