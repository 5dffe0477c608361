"""The exception hook of ``%load_ext meta_widget`` and ``mw.explain`` survive any exception object.

IPython unregisters a custom exception handler that raises ("Custom TB Handler failed,
unregistering"), which would turn explanations off for the rest of the session. Each hostile
exception below is raised in a real cell of a real ``InteractiveShell``; the handler must show it,
stay installed, and still explain the next meta error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import meta_widget as mw
from meta_widget import magics
from meta_widget.trace.explain import is_meta_error

DEFINITIONS = """
class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("str boom")

class BothRaise(Exception):
    def __str__(self):
        raise RuntimeError("str boom")
    def __repr__(self):
        raise RuntimeError("repr boom")

class StrNotText(Exception):
    def __str__(self):
        return 42

class Sneaky(str):
    def lower(self):
        raise RuntimeError("lower boom")
    def strip(self, *args):
        raise RuntimeError("strip boom")
    def splitlines(self, *args):
        raise RuntimeError("splitlines boom")

class StrSubclass(Exception):
    def __str__(self):
        return Sneaky("Cannot copy out of meta tensor; no data!")

class Unprintable:
    def __str__(self):
        raise RuntimeError("arg str boom")
    def __repr__(self):
        raise RuntimeError("arg repr boom")

class StrRaisesItself(Exception):
    def __str__(self):
        raise StrRaises()

def cycle():
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    a.__context__, b.__context__ = b, a
    return a

def meta_cycle():
    try:
        torch.ones(2, device="meta").tolist()
    except NotImplementedError as exc:
        other = RuntimeError("wrapper")
        exc.__cause__, other.__cause__ = other, exc
        return exc
"""

HOSTILE = {
    "str raises": "raise StrRaises('x')",
    "str and repr raise": "raise BothRaise('x')",
    "str returns an int": "raise StrNotText('x')",
    "str returns a str subclass": "raise StrSubclass('x')",
    "an arg that cannot be printed": "raise ValueError(Unprintable())",
    "args that cannot be printed": (
        "e = ValueError('x')\ne.args = (Unprintable(), Unprintable())\nraise e"
    ),
    "str raises a hostile exception": "raise StrRaisesItself()",
    "a cycle of causes": "raise cycle()",
    "a meta error in a cycle of causes": "raise meta_cycle()",
    "notes that are not text": "e = ValueError('x')\ne.__notes__ = [Unprintable()]\nraise e",
}

META_CELL = "x = torch.ones(2, device='meta')\nvalues = x.tolist()"


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")
    before = (shell.custom_exceptions, shell.CustomTB)
    shell.run_line_magic("load_ext", "meta_widget")
    shell.user_ns.update(torch=torch)
    shell.run_cell(DEFINITIONS)
    yield shell
    shell.run_line_magic("unload_ext", "meta_widget")
    assert (shell.custom_exceptions, shell.CustomTB) == before


def run(ip: InteractiveShell, cell: str) -> tuple[Any, Any]:
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap


def still_installed(ip: InteractiveShell) -> None:
    state = magics._STATE[id(ip)]
    assert ip.CustomTB is state.installed and ip.custom_exceptions == (Exception,)
    _, cap = run(ip, META_CELL)
    assert "meta_widget explains: Data was read from a meta tensor" in cap.stdout, cap.stdout


@pytest.mark.parametrize("cell", HOSTILE.values(), ids=list(HOSTILE))
def test_the_handler_survives_a_hostile_exception(ip: InteractiveShell, cell: str) -> None:
    result, cap = run(ip, cell)
    assert result.error_in_exec is not None
    assert "Custom TB Handler failed" not in cap.stdout + cap.stderr
    # the user's error is shown, with the cell's line
    shown = cap.stdout + cap.stderr
    assert type(result.error_in_exec).__name__ in shown
    assert "raise" in shown, shown
    still_installed(ip)


def test_a_meta_error_in_a_cycle_of_causes_is_explained(ip: InteractiveShell) -> None:
    result, cap = run(ip, HOSTILE["a meta error in a cycle of causes"])
    assert isinstance(result.error_in_exec, NotImplementedError)
    assert "meta_widget explains: Data was read from a meta tensor" in cap.stdout


@pytest.mark.parametrize("cell", HOSTILE.values(), ids=list(HOSTILE))
def test_explain_takes_any_exception_object(ip: InteractiveShell, cell: str) -> None:
    result, _ = run(ip, cell)
    exc = result.error_in_exec
    explanation = mw.explain(exc)
    assert explanation.type == type(exc).__name__
    assert isinstance(explanation.message, str) and type(explanation.message) is str
    assert isinstance(str(explanation), str) and explanation.to_dict()["type"] == explanation.type
    assert isinstance(is_meta_error(exc), bool)


def test_a_failing_str_is_named_not_raised(ip: InteractiveShell) -> None:
    result, _ = run(ip, HOSTILE["str raises"])
    explanation = mw.explain(result.error_in_exec)
    assert explanation.message == (
        "<exception str() failed: StrRaises.__str__ raised RuntimeError>"
    )
    # a str subclass keeps its text (and the explanation of that text), not its methods
    result, _ = run(ip, HOSTILE["str returns a str subclass"])
    explanation = mw.explain(result.error_in_exec)
    assert explanation.message == "Cannot copy out of meta tensor; no data!"
    assert explanation.title == "Data was read from a meta tensor"


def test_a_broken_matcher_is_named_and_the_handler_stays(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    explain_module = importlib.import_module("meta_widget.trace.known_errors")

    def broken(exc: BaseException, message: str) -> bool:
        raise KeyError("a bug in a user's matcher")

    with explain_module.EXPLANATIONS.scoped():
        explain_module.register_explanation(
            "broken", broken, title="t", explanation="e", fix="f", first=True
        )
        _, cap = run(ip, META_CELL)
    assert "Custom TB Handler failed" not in cap.stdout + cap.stderr
    assert "values = x.tolist()" in cap.stdout  # the traceback is shown
    assert "meta_widget could not explain this error: KeyError" in cap.stdout
    still_installed(ip)


KERNEL_SCRIPT = """
import json, sys
from IPython.utils.capture import capture_output
from ipykernel.inprocess.manager import InProcessKernelManager

definitions, hostile, meta_cell = json.loads(sys.argv[1])
manager = InProcessKernelManager()
manager.start_kernel()
client = manager.client()
client.start_channels()
shell = manager.kernel.shell
shell.run_line_magic("load_ext", "meta_widget")
installed = shell.CustomTB
with capture_output() as cap:
    shell.run_cell("import torch")
    shell.run_cell(definitions)
    hostile_result = shell.run_cell(hostile)
    meta_result = shell.run_cell(meta_cell)
sent = []
while not sent:  # the error messages the front end gets, until the meta error's arrives
    try:
        m = client.iopub_channel.get_msg(timeout=60)
    except Exception:  # queue.Empty: nothing more came
        break
    if m["msg_type"] == "error" and m["content"]["ename"] == "NotImplementedError":
        sent.append(m["content"]["traceback"][-1])
print(json.dumps({
    "hostile": type(hostile_result.error_in_exec).__name__,
    "meta": type(meta_result.error_in_exec).__name__,
    "unregistered": "Custom TB Handler failed" in cap.stdout + cap.stderr,
    "installed": shell.CustomTB is installed,
    "explained": any("meta_widget explains" in last for last in sent),
}))
"""


def test_in_a_real_kernel_the_handler_survives_a_failing_str() -> None:
    """ipykernel sends ``str(value)`` to the front end, which raises here: the handler shows the
    error another way and stays installed (an in-process kernel, the real ZMQ shell class, in a
    subprocess: a kernel's shell is a process-wide singleton)."""
    pytest.importorskip("ipykernel.inprocess.manager")
    payload = json.dumps([DEFINITIONS, HOSTILE["str raises"], META_CELL])
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_SCRIPT, payload],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "hostile": "StrRaises",
        "meta": "NotImplementedError",
        "unregistered": False,
        "installed": True,
        "explained": True,
    }
