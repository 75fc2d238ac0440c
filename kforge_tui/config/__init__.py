"""The TUI's user settings: theme files and the key map, read from kforge's config directory."""
