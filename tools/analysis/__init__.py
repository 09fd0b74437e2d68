"""Run analysis: evaluations, paired comparisons, tables and plots over finished runs."""
