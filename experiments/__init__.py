"""Experiment scripts (paper Section 6); see experiments/README.md."""
