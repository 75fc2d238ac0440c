"""The TUI's user settings: theme files and the key map (the config file's ``[tui]`` and ``[keys]``
sections, read into ``kforge.core.settings``)."""
