"""What both ends of a weight sync share: the payload format (`payload`) and the probe check (`probe`). The driver's
push is `rllib_p3o.driver.weight_sync`; a runner loads a payload in `rllib_p3o.runner.env_runner`."""
