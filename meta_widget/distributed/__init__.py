"""Past one device: one rank of FSDP2 / tensor parallelism traced, a user's own wrapping
read and traced as it stands, its collectives, and estimates computed from a report.
"""
