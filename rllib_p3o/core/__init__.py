"""What every process shares: the objective's math, the loss registry, batch column names, data-source ids, metric
keys and the LoRA spec. Nothing here starts Ray actors or engines."""
