"""The root of every error meta_widget raises on purpose.

``except meta_widget.MetaWidgetError`` catches any of them; each class also derives from the
builtin a caller would expect (``ValueError`` for a bad argument or file, ``TypeError`` for an
object that cannot be analyzed, ``MemoryError`` for a model that does not fit), so code written
against those keeps working. The classes themselves live beside the code that raises them and
are all exported from ``meta_widget``.
"""

from __future__ import annotations

__all__ = ["MetaWidgetError"]


class MetaWidgetError(Exception):
    """An error meta_widget raised on purpose: its message says what, where, and what to do."""
