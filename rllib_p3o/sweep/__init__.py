"""The claims sweep: P3O against GRPO (ε sweep) and P3O's ablations, across off-policy regimes, with seeds, as
resumable Ray Tune experiments on the built-in task (``rllib-p3o sweep``; `rllib_p3o.sweep.run`).

Modules: `grid` (methods, regimes, grids), `prep` (models and recording some regimes need), `run` (the Tune
experiments), `report` (curves, table, figures). Analyses of a sweep's files, each with its own command line:
`compare` (whether a rerun reproduced another run's trials, ``python -m rllib_p3o.sweep.compare``) and
`diagnostics` (the learner's per-iteration diagnostics per stage and method, ``python -m rllib_p3o.sweep.diagnostics``).
"""
