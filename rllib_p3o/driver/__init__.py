"""Code that runs in the driver (or Tune's trial actor) beside `rllib_p3o.p3o.P3O`: online sampling (`sampler`), the
typed calls on the runners (`runner_calls`), the weight-sync push (`weight_sync`), the checks before a run starts
(`preflight`), Tune's actor reuse (`trial_reuse`) and the screen (`progress`).

Nothing in the EnvRunner or Learner actors imports these modules: `tests/test_layout.py` checks it."""
