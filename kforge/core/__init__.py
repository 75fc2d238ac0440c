"""Pure core: data and decisions, no I/O."""
