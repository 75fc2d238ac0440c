"""Where evaluations run: worker processes on each GPU and the typed messages the engine speaks
with them (``pool``, ``protocol``, ``worker``), a Ray cluster's actors (``cluster``), the calling
process for tests and benchmarks (``local``), and compute-sanitizer's runs of a would-be best
(``sanitize``, with its torch-free child ``sanitize_child``).

Above the verification pipeline (``kforge.eval.verify``), which it runs. Importing this package
imports nothing.
"""
