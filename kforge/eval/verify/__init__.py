"""The verification pipeline, run inside a worker: one candidate compiled, checked against eager on
captured, random and stress inputs, proof against the known cheats, and timed against eager and
torch.compile (``evaluate.evaluate_candidate``); one op card's baseline (``baseline``).

Below the process side (``kforge.eval.process``), above the device layer it measures with
(``kforge.runtime``). Importing this package imports nothing.
"""
