"""The kforge command line."""
