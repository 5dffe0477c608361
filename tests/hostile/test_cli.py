"""The ``meta-widget`` command, run for real in a subprocess: exit codes and one-line errors.

Every user mistake gives one line on stderr (``meta-widget: error: ...``) and a nonzero exit
(2: the command line; 1: anything else); ``--debug`` shows the traceback instead. The same
mistakes give the same message from ``analyze`` and ``%meta`` (the checks of
``meta_widget.options``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import meta_widget as mw
from meta_widget.options import OptionError

PREFIX = "meta-widget: error: "

MODELS = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x))

class NeedsArgs(torch.nn.Module):
    def __init__(self, width, depth=2):
        super().__init__()

class Fails(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).tolist()

net = Net()
not_a_model = 42
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A current folder holding the user's files, as a user would run the command in."""
    here = tmp_path_factory.mktemp("project")
    (here / "models.py").write_text(MODELS)
    (here / "raises.py").write_text("import torch\nvalue = 1 / 0\n")
    (here / "broken.py").write_text("def net(:\n    pass\n")
    (here / "imports_missing.py").write_text("import no_such_package_here\n")
    return here


def cli(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meta_widget.cli", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], status: int, words: str) -> str:
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(PREFIX) and words in lines[0], lines[0]
    return lines[0].removeprefix(PREFIX)


def test_a_module_in_the_current_folder_is_analyzed(folder: pathlib.Path) -> None:
    result = cli(folder, "models:net", "--input", "2,8", "--depth", "1")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    params = 8 * 16 + 16 + 16 * 4 + 4  # independent count of Net's parameters
    assert f"Parameters: {params} (trainable {params})" in result.stdout
    assert "[2, 4]" in result.stdout  # the output shape of fc2
    # the same by file path, and the report files
    html, data = folder / "report.html", folder / "report.json"
    result = cli(
        folder, "models.py:Net", "--input", "2x8", "--html", str(html), "--json", str(data)
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(data.read_text())["totals"]["params"] == params
    assert "meta-widget-data" in html.read_text()


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (
            ["models:net", "--input", "1,,8"],
            2,
            "cannot read the shape '1,,8': a dimension is missing",
        ),
        (["models:net", "--input", ",8"], 2, "a dimension is missing"),
        (["models:net", "--input", "1,a"], 2, "cannot read the shape '1,a'"),
        (["models:net", "--input", "1,-8"], 2, "the input shape (1, -8) has a negative dimension"),
        (["models:net", "--input", "99999999999,99999999999"], 2, "more than a tensor can hold"),
        (["models:net", "--input", "2305843009213693952,2"], 2, "more than a tensor can address"),
        (["models:net", "--depth", "-1"], 2, "depth must be 0 or more, not -1"),
        (["models:net", "--depth", "x"], 2, "invalid int value: 'x'"),
        (["models:net", "--mode", "fast"], 2, "invalid choice: 'fast'"),
        (["models:net", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["models:net", "--input", "1,8", "--dtype", "quarter"], 2, "unknown dtype 'quarter'"),
        (
            ["models:net", "--input", "1,8", "--dtype", "long", "--dtype", "half"],
            2,
            "2 dtypes (dtypes= / --dtype) for 1 input shapes",
        ),
        (["models"], 2, "is not of the form module:attr"),
        (["no_such_module_here:net"], 2, "cannot import 'no_such_module_here'"),
        (["models:missing"], 2, "'models' has no attribute 'missing'"),
        (["missing.py:net"], 2, "no file 'missing.py'"),
        (["models:not_a_model"], 1, "cannot analyze an object of type 'int'"),
        (["models:NeedsArgs"], 2, "the class NeedsArgs needs arguments to build the model (width)"),
        (
            ["raises.py:value"],
            1,
            "importing 'raises.py' raised ZeroDivisionError: division by zero",
        ),
        (["raises:value"], 1, "importing 'raises' raised ZeroDivisionError: division by zero"),
        (["broken.py:net"], 1, "importing 'broken.py' raised SyntaxError"),
        (
            ["imports_missing.py:net"],
            1,
            "raised ModuleNotFoundError: No module named 'no_such_package_here'",
        ),
        (["models:net", "--input", "1,8", "--html", "models.py/x.html"], 2, "does not exist"),
        (["models:net", "--input", "1,8", "--json", "."], 2, "is a folder"),
    ],
)
def test_every_mistake_is_one_line_and_a_nonzero_exit(
    folder: pathlib.Path, args: list[str], status: int, words: str
) -> None:
    one_line_error(cli(folder, *args), status, words)


def test_where_the_users_code_failed_is_named(folder: pathlib.Path) -> None:
    message = one_line_error(cli(folder, "raises.py:value"), 1, "raises.py")
    assert f"({folder / 'raises.py'}:2)" in message  # the line `value = 1 / 0`
    message = one_line_error(cli(folder, "broken.py:net"), 1, "SyntaxError")
    assert f"({folder / 'broken.py'}:1)" in message


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc")
def test_a_file_that_cannot_be_written_is_one_line(folder: pathlib.Path) -> None:
    # /proc/version passes every check made before the analysis (root may write anywhere) and
    # fails when written: the error at write time is one line too
    result = cli(folder, "models:net", "--input", "1,8", "--json", "/proc/version")
    one_line_error(result, 1, "cannot write --json '/proc/version'")


def test_a_failing_forward_pass_prints_the_summary_and_exits_1(folder: pathlib.Path) -> None:
    result = cli(folder, "models:Fails", "--input", "1,8")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Cannot copy out of meta tensor" in " ".join(result.stdout.split())  # wrapped at 100


def test_debug_shows_the_traceback(folder: pathlib.Path) -> None:
    result = cli(folder, "raises.py:value", "--debug")
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    result = cli(folder, "models:NeedsArgs", "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_the_same_mistake_gives_the_same_message_everywhere(folder: pathlib.Path) -> None:
    """``analyze``, ``%meta`` and the command share their checks: one message each."""
    # (under another name: `models` is also the test suite's own helper module)
    spec = importlib.util.spec_from_file_location("cli_project_models", folder / "models.py")
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "meta_widget")
    shell.user_ns.update(NeedsArgs=models.NeedsArgs, net=models.net)
    try:
        cases = [
            (
                lambda: mw.analyze(models.NeedsArgs),
                "%meta NeedsArgs",
                ["models:NeedsArgs"],
            ),
            (
                lambda: mw.analyze(models.net, depth=-1),
                "%meta net --depth -1",
                ["models:net", "--depth", "-1"],
            ),
            (
                lambda: mw.analyze(models.net, (1, 8), dtypes=[torch.long, torch.half]),
                "%meta net --input 1,8 --dtype long --dtype half",
                ["models:net", "--input", "1,8", "--dtype", "long", "--dtype", "half"],
            ),
            (
                lambda: mw.analyze(models.net, (2**61, 2)),
                "%meta net --input 2305843009213693952,2",
                ["models:net", "--input", "2305843009213693952,2"],
            ),
        ]
        for call, magic, args in cases:
            with pytest.raises(OptionError) as api:
                call()
            with capture_output():
                result = shell.run_cell(magic)
            assert isinstance(result.error_in_exec, UsageError), magic
            from_magic = str(result.error_in_exec).removeprefix("%meta: ")
            from_cli = one_line_error(cli(folder, *args), 2, "")
            assert from_magic == from_cli == str(api.value)
    finally:
        shell.run_line_magic("unload_ext", "meta_widget")


def test_python_dash_m_and_the_installed_script_agree(folder: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).parent / "meta-widget"
    if not script.exists():
        pytest.fail(f"{script} is missing: install the package (make setup)")
    result = subprocess.run(
        [str(script), "models:net", "--input", "1,,8"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.stderr == cli(folder, "models:net", "--input", "1,,8").stderr
    assert result.returncode == 2
    # and the script finds a module of the current folder, which Python does not put on its path
    result = subprocess.run(
        [str(script), "models:net", "--input", "1,8"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Net (module)" in result.stdout


# -- a file that exits on import; a reader of stdout that goes away (issue 23, item 13) ----------


@pytest.mark.parametrize(
    ("source", "spec", "code"),
    [
        ("import sys\nsys.exit(0)\n", "exits_zero.py:net", "0"),
        ("import sys\nsys.exit(0)\n", "exits_zero:net", "0"),
        ("import sys\nsys.exit()\n", "exits_bare.py:net", "None"),
        ("import sys\nsys.exit('usage: train.py DATA')\n", "exits_text.py:net", "'usage: "),
        ("raise SystemExit(3)\n", "exits_three.py:net", "3"),
    ],
)
def test_a_file_that_calls_sys_exit_on_import_is_an_error(
    folder: pathlib.Path, source: str, spec: str, code: str
) -> None:
    name = spec.partition(":")[0].removesuffix(".py")
    (folder / f"{name}.py").write_text(source)
    message = one_line_error(cli(folder, spec, "--input", "1,8"), 1, "called sys.exit(")
    target = spec.partition(":")[0]
    assert f"{target!r} called sys.exit({code}" in message
    assert "while being imported" in message and f"({folder / name}.py:" in message
    assert "if __name__ == '__main__':" in message


def _closed_early(
    folder: pathlib.Path, tmp_path: pathlib.Path, unbuffered: bool
) -> tuple[int, str]:
    """Run the command with its stdout a pipe whose read end is closed before anything is
    written: every write finds no reader, as after ``| head`` has exited."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meta_widget.cli", "models:net", "--input", "2,8"],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # the reader goes away before the command writes its summary
        status = proc.wait(timeout=300)
    return status, err.read_text()


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_a_reader_that_goes_away_ends_the_command_quietly(
    folder: pathlib.Path, tmp_path: pathlib.Path, unbuffered: bool
) -> None:
    status, stderr = _closed_early(folder, tmp_path, unbuffered)
    assert (status, stderr) == (141, ""), stderr


def test_piped_to_head_is_quiet(folder: pathlib.Path) -> None:
    """A real ``| head -n 1``: whether ``head`` has gone when the rest is written is up to the
    scheduler, so the status is 0 (all written in time) or 141; stderr is empty either way."""
    command = (
        f"set -o pipefail; {sys.executable} -m meta_widget.cli models:net --input 2,8 "
        "| head -n 1; echo status=${PIPESTATUS[0]}"
    )
    result = subprocess.run(
        ["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=300
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Net (module)") and lines[-1] in ("status=0", "status=141")
    assert result.stderr == ""
