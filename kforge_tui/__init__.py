"""kforge-tui: the terminal application that browses sessions and drives kforge's search over SSH.

It reads and commands sessions only through the store; anything that needs torch or a GPU runs in a
``python -m kforge`` subprocess, so the TUI starts fast and never imports torch.
"""
