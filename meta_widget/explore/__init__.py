"""Exploration over many traces: sweeps, what fits a budget, and comparisons."""
