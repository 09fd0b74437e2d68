"""Builders of the router's parquet files (FlashRAG QA sets, and the simulated world)."""
