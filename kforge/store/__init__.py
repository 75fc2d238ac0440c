"""The session store: one SQLite file per workspace."""
