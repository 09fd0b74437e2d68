"""Evaluation: checkpoints and baselines on test sets through the real pool (test.sh), and reports."""
