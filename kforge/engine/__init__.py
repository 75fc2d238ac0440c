"""The asyncio engine that runs a search through a proposer and an evaluator: the I/O around the
pure scheduling of ``kforge.core.schedule``. Layer: beside ``integrate``, above ``eval`` and
``propose``."""
