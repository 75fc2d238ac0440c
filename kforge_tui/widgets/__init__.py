"""The session screen's panes and the widgets the screens share."""
