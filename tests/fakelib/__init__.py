"""A stand-in for a library whose models share check helpers (see ``utils/import_utils.py``)."""
