"""The time model: accelerators (``gpus``) and the time of a traced step on one (``model``)."""
