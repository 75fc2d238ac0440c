"""Evaluation: compile, verify and time candidates (GPU work runs in worker processes)."""
