"""Reward models served by Ray actors, both sides of it (as `rllib_p3o.sync` holds both ends of a weight sync):

    server   the specs (``env_config["reward_models"]``), the actor that scores (a classifier, or a vLLM judge) and
             the client the runners call it through
    actors   the driver's side: start the actors before the runners, stop them with the algorithm

The runners import `server` only; `actors` runs in the driver.
"""
