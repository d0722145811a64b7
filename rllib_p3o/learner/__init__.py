"""Code that runs in the Learner actors: the P3O TorchLearner (batch -> loss) and the HF causal-LM RLModule."""
