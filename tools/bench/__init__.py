"""Benchmarks: each prints its own timings (`python -m tools.bench.<file> --help`)."""
