"""The warm-up of ``%load_ext meta_widget`` (``meta_widget.warm``), in fresh interpreters: it
runs in the background, prints nothing, the first analysis waits for it, and a failing one is
logged and ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LOAD_EXT = """
import json, sys, threading
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
before = set(sys.modules)
ip.run_line_magic("load_ext", "meta_widget")
from meta_widget import warm
started = warm._thread is not None and warm._thread.daemon
import torch
import meta_widget as mw
a = mw.analyze(torch.nn.Linear(4, 5), input_size=(2, 4))
print(json.dumps({
    "started": started,
    "done": warm._done.is_set(),
    "seconds": warm.seconds,
    "params": a.total_params,
    "dynamo": "torch._dynamo" in sys.modules,
    "transformers": "transformers.models.llama.modeling_llama" in sys.modules,
}))
"""

FAILING = """
import json, logging, io
from meta_widget import warm
stream = io.StringIO()
logging.getLogger("meta_widget.warm").addHandler(logging.StreamHandler(stream))
def job():
    raise RuntimeError("no luck")
assert warm.start(job) and not warm.start(job)  # once per process
waited = warm.wait()
import torch, meta_widget as mw
a = mw.analyze(torch.nn.Linear(4, 5), input_size=(2, 4))
print(json.dumps({"log": stream.getvalue(), "params": a.total_params, "running": warm.running()}))
"""


def run(code: str, **env: str) -> tuple[dict[str, object], str, str]:
    """``code`` run by this interpreter in a child process: its last line of output (JSON),
    its whole output and its stderr. The child's environment is this process's less
    ``VIRTUAL_ENV``: a shell that activated another virtual environment than this
    interpreter's makes IPython warn "Attempting to work in a virtualenv" on stderr."""
    inherited = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
        check=True,
    )
    *_, last = done.stdout.strip().splitlines()
    return json.loads(last), done.stdout, done.stderr


def test_load_ext_warms_up_in_the_background_and_the_first_analysis_waits_for_it() -> None:
    out, stdout, stderr = run(LOAD_EXT)
    assert out["started"] is True
    assert out["done"] is True  # the analysis waited: the warm-up was over when it ran
    assert isinstance(out["seconds"], float) and out["seconds"] > 0
    assert out["params"] == 4 * 5 + 5
    assert out["dynamo"] is True  # PyTorch's first meta forward loaded it
    assert out["transformers"] is True  # what a Llama config's first analysis would import
    assert stdout.strip().splitlines() == [stdout.strip().splitlines()[-1]]  # nothing printed
    # nor logged: from a background thread it would land under the user's running cell (the
    # import of transformers' models logged torchao's "Failed to load" lines there)
    assert stderr == "", stderr


def test_warm_up_can_be_turned_off() -> None:
    out, _, _ = run(LOAD_EXT, META_WIDGET_WARMUP="0")
    assert out["started"] is False and out["seconds"] is None


def test_a_failing_warm_up_is_logged_and_ignored() -> None:
    out, _, _ = run(FAILING)
    assert "warm-up failed" in str(out["log"]) and "no luck" in str(out["log"])
    assert out["params"] == 25 and out["running"] is False


QUIET = """
import io, json, logging, threading
from meta_widget.heavy import quiet_logs
stream = io.StringIO()
logging.getLogger("lib").addHandler(logging.StreamHandler(stream))
shown = []
def other():
    logging.getLogger("lib").warning("from the user's thread")
def warm_up():
    with quiet_logs() as cover:
        logging.getLogger("lib").warning("from the warm-up")  # dropped
        logging.getLogger("elsewhere").warning("through lastResort")  # dropped
        logging.getLogger("late").addHandler(logging.StreamHandler(stream))
        cover()
        logging.getLogger("late").warning("by a handler made meanwhile")  # dropped
        t = threading.Thread(target=other); t.start(); t.join()
t = threading.Thread(target=warm_up); t.start(); t.join()
logging.getLogger("lib").warning("after")
logging.getLogger("elsewhere").warning("through lastResort, after")
handlers = [logging.lastResort, *logging.getLogger("lib").handlers]
print(json.dumps({"lines": stream.getvalue().splitlines(),
                  "filters": sum(len(h.filters) for h in handlers)}))
"""


def test_the_warm_up_drops_its_own_log_records_only_while_it_runs() -> None:
    out, _, stderr = run(QUIET)
    assert out["lines"] == ["from the user's thread", "after"]
    assert out["filters"] == 0  # every handler as it was
    assert stderr == "through lastResort, after\n"  # lastResort: only the record after


NOISY = """
import json, importlib
importlib.import_module("transformers.modeling_utils")  # what a plain import of the model base says
print(json.dumps({}))
"""

BUILT = """
import json, warnings
import transformers
import meta_widget as mw
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=64, architectures=["LlamaForCausalLM"])
a = mw.analyze(cfg, (1, 8), mode="training")
import logging
logging.getLogger("torchao").warning("a record after the import")
print(json.dumps({"params": a.total_params}))
"""


def test_building_a_model_from_a_config_says_nothing_of_the_kernels_it_cannot_load() -> None:
    """transformers' model base imports torchao, which logs on stderr that it cannot load its
    GPU kernels here (and torch's pytree, deprecations): a model built from a config imports
    it with those records of its thread dropped; records after it pass."""
    _, _, noisy = run(NOISY, META_WIDGET_WARMUP="0")
    if "Failed to load" not in noisy and "_pytree" not in noisy:
        pytest.skip("transformers' model base imports quietly here: nothing to drop")
    out, _, stderr = run(BUILT, META_WIDGET_WARMUP="0")
    assert out["params"] > 0
    assert "Failed to load" not in stderr and "_pytree" not in stderr, stderr
    assert "a record after the import" in stderr


USER_HOOK = """
import json, threading
import torch
from torch.nn.modules.module import register_module_forward_hook
from meta_widget import warm, warmstart
seen = []
handle = register_module_forward_hook(lambda m, i, o: seen.append(threading.current_thread().name))
assert warmstart.global_module_hooks()
assert warmstart.start()
warm.wait()
handle.remove()
hooked = list(seen)
assert not warmstart.global_module_hooks()
warmstart.run_tiny_decoder()  # with no hook: runs here, leaves no mode on this thread
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
print(json.dumps({"seen": hooked, "modes": len(_get_current_dispatch_mode_stack()),
                  "seconds": warm.seconds}))
"""


def test_the_warm_up_runs_no_module_while_the_user_has_a_global_module_hook() -> None:
    # its tiny decoder's module calls would reach the user's hook from the warm-up's thread
    out, _, stderr = run(USER_HOOK)
    assert out["seen"] == [] and out["modes"] == 0
    assert isinstance(out["seconds"], float)
    assert stderr == "", stderr


ONE_IMPORTER = """
import json, sys, threading
import meta_widget as mw
from meta_widget import warm
held, release, asked = threading.Event(), threading.Event(), threading.Event()
class Watched:  # warm.imports, telling when a thread but the warm-up's asks for it
    def __init__(self, lock):
        self.lock = lock
    def __enter__(self):
        if threading.current_thread() is not warm._thread:
            asked.set()
        return self.lock.__enter__()
    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)
warm.imports = Watched(warm.imports)
def warm_up():  # a warm-up held while it imports the package's modules
    with warm.imports:
        held.set()
        release.wait()
assert warm.start(warm_up)
held.wait()
got = []
user = threading.Thread(target=lambda: got.append(mw.Analysis))  # a first cell's mw.Analysis
user.start()
while not asked.is_set() and user.is_alive():
    asked.wait(0.05)
imported_meanwhile = "meta_widget.analysis" in sys.modules
release.set()
user.join()
print(json.dumps({"asked": asked.is_set(), "imported_meanwhile": imported_meanwhile,
                  "got": [c.__name__ for c in got]}))
"""


def test_a_lazy_name_is_not_imported_while_the_warm_up_imports_the_package() -> None:
    # the package's modules import each other in circles: a first cell's mw.Analysis imported
    # analysis -> materialize -> sources while the warm-up imported pipeline -> sources, and
    # Python stopped the cell with _DeadlockError (CI, notebook 06)
    out, _, stderr = run(ONE_IMPORTER)
    assert out == {"asked": True, "imported_meanwhile": False, "got": ["Analysis"]}
    assert stderr == "", stderr


FORKED = """
import json, os, select, sys, threading
import meta_widget as mw
from meta_widget import warm
held, release = threading.Event(), threading.Event()
def warm_up():  # a warm-up still importing the package's modules when the user's code forks
    with warm.imports:
        held.set()
        release.wait()
assert warm.start(warm_up)
held.wait()
read, write = os.pipe()
pid = os.fork()  # multiprocessing's default start method on Linux
if pid == 0:  # the child: no warm-up thread runs here, so nothing to wait for
    waited = warm.wait()
    name = mw.Analysis.__name__
    answer = {"waited": waited, "name": name, "running": warm.running()}
    os.write(write, json.dumps(answer).encode())
    os._exit(0)
answered = select.select([read], [], [], 120)[0]  # a guard: a hung child never answers
if not answered:
    os.kill(pid, 9)
os.waitpid(pid, 0)
release.set()
warm.wait()
print(json.dumps({"child": json.loads(os.read(read, 4096)) if answered else "hung"}))
"""


def test_a_child_forked_while_the_warm_up_runs_waits_for_nothing() -> None:
    # the child has no warm-up thread: it would wait forever for one (warm.wait, and the
    # import lock the parent's warm-up held), e.g. mw.analyze in a fork-started Pool's worker
    out, _, _ = run(FORKED)
    assert out["child"] == {"waited": 0.0, "name": "Analysis", "running": False}
