"""The asyncio engine that runs a search through a proposer and an evaluator."""
