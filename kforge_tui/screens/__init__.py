"""The TUI's screens: the sessions list, one session's four panes, and the small dialogs."""
