"""One pass on meta, recorded: the recorder and its parts (call stack, storage tracker,
assumption policy), the passes it runs, the kernels modelled as the real device runs them,
the op cache and replay that make it fast, and the undo that leaves the user's state as it was.
"""
