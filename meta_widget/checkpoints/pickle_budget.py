"""What reading one ``torch.save`` pickle may spend: steps and bytes, counted, never timed.

A pickle has no loops: the machine runs each opcode once, and every step whose work is not a
constant (hashing a key, building a set, checking a shape, walking a container's children) is
charged as many steps as its work. So the steps bound the time on any machine, loaded or not,
and the answer never depends on the machine's load: a file is read or refused the same way
everywhere. Bytes are charged *before* what they pay for is built (an upper bound of CPython's
sizes), so a refusal comes before the memory is taken.

The allowance grows with the pickle's size, so that a small file costs little: a legitimate
``state_dict`` takes about 31 steps and 2.7 KB of charged bytes per tensor, for ~125 bytes of
pickle (measured: 620,052 steps and 53.6 MB for 20,000 tensors); the allowance is twice that
and more, up to a ceiling that a 100,000-tensor state dict stays well within.
"""

from __future__ import annotations

from .entries import CheckpointError

#: steps any pickle may take, and one more per byte of pickle ...
BASE_STEPS = 1_000_000
#: ... up to this ceiling (a 100,000-tensor state dict takes ~3.6 million)
MAX_STEPS = 8_000_000
#: bytes any pickle may build, and :data:`BYTES_PER_BYTE` more per byte of pickle ...
BASE_BYTES = 64 * 2**20
BYTES_PER_BYTE = 64
#: ... up to this ceiling (a 100,000-tensor state dict takes ~270 MiB)
MAX_BYTES = 512 * 2**20
#: a record stored compressed counts as at most this many times its compressed size (a real
#: pickle deflates ~5x; a bomb a thousand times)
MAX_RATIO = 8


def allowance(pickle_bytes: int) -> tuple[int, int]:
    """``(steps, bytes)`` a pickle of ``pickle_bytes`` bytes may take (see the module's text)."""
    steps = min(MAX_STEPS, BASE_STEPS + pickle_bytes)
    nbytes = min(MAX_BYTES, BASE_BYTES + BYTES_PER_BYTE * pickle_bytes)
    return steps, nbytes


class Budget:
    """What reading one file may spend: steps and bytes; refused as soon as either is spent.

    ``shown`` names the file in the refusal. The same budget is charged by the pickle machine
    and by the listing of names that follows. ``max_steps`` and ``max_bytes`` default to the
    allowance of a pickle of ``pickle_bytes`` bytes.
    """

    def __init__(
        self,
        shown: str,
        pickle_bytes: int = 0,
        *,
        max_steps: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.shown = shown
        self.steps = 0
        self.bytes = 0
        steps, nbytes = allowance(pickle_bytes)
        self.max_steps = steps if max_steps is None else max_steps
        self.max_bytes = nbytes if max_bytes is None else max_bytes

    def charge(self, nbytes: int, steps: int = 1) -> None:
        """Count ``steps`` steps building ``nbytes``; refuse when either total would pass its
        limit (before the objects are built: the refusal says what was spent until then)."""
        if self.bytes + nbytes > self.max_bytes:
            raise self.refuse(f"would take more than {self.max_bytes / 2**20:.0f} MiB to list")
        if self.steps + steps > self.max_steps:
            raise self.refuse(f"takes more than {self.max_steps:,} steps to read and list")
        self.steps += steps
        self.bytes += nbytes

    def refuse(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self.shown!r}: its pickle {what}; refused after {self.steps:,} steps "
            f"({self.bytes / 2**20:.0f} MiB). A model checkpoint of its size takes far less; "
            "this one is damaged or built to exhaust memory or time. If you wrote it, save the "
            "model's state_dict() instead."
        )
