"""Plain data about a model: its module tree, what a trace records, tensor summaries,
and the one walk over a module tree they are built from.
"""
