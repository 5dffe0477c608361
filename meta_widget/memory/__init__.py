"""The memory model of one recorded pass: the report, and what each module owns."""
