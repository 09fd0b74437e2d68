"""The lab's instruments, outside the library: benchmarks, GPU checks, run analysis and model conversion.
Each file runs as `python -m tools.<group>.<file>` from the repository root."""
