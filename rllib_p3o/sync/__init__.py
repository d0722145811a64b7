"""Weight sync from the learners to the runners' engines: the payload format (`payload`, both sides), the probe check
(`probe`, both sides) and the driver's push (`push`)."""
