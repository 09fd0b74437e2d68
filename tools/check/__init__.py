"""Device checks: rollout backends and attention kernels compared on a real model (`python -m tools.check.<file>`)."""
