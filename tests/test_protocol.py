"""The wire format: the Python encoder against the recorded samples the JS tests decode too.

The recorded samples are written by the encoder (``tests/make_fixtures.py``), so comparing the
encoder with them only shows that nothing changed. What makes the check independent: a payload
decoded by the documented rules and compared with values worked out by hand (a tiny model), and
the recorded GPT-2 sample compared with a real GPT-2 (names, types, parameters, FLOPs).
"""

from __future__ import annotations

import json
import os
from typing import Any

from make_fixtures import FIXTURES, normalize, samples

from meta_widget.choices import Precision
from meta_widget.views import protocol


def _load(name: str) -> object:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def test_recorded_samples_are_what_the_encoder_produces_now() -> None:
    # If this fails after a deliberate protocol change: run `python tests/make_fixtures.py`,
    # update js/protocol.ts, and run `npm test` (it decodes the same files).
    for name, data in samples().items():
        assert normalize(json.loads(json.dumps(data))) == _load(name), name


def test_the_precision_switch_has_what_if_arguments_for_each_choice() -> None:
    # choices.Precision is the switch the front end draws (js/choices.test.ts checks it)
    assert list(protocol.PRECISION_CHOICES) == list(Precision)
    payload = _load("gpt2-tiny.json")
    assert isinstance(payload, dict)
    assert list(payload["memory"]["what_if"]) == [p.value for p in Precision]


def test_payload_columns_follow_the_contract() -> None:
    payload = _load("gpt2-tiny.json")
    assert isinstance(payload, dict)
    assert payload["version"] == protocol.VERSION
    # all-zero optional columns are left out; the samples also leave out the timings
    optional = (*protocol.OPTIONAL_COLUMNS, "duration_us")
    assert tuple(payload["modules"]) == tuple(
        c for c in protocol.MODULE_COLUMNS if c in payload["modules"] or c not in optional
    )
    assert tuple(payload["calls"]) == tuple(
        c for c in protocol.CALL_COLUMNS if c in payload["calls"] or c not in optional
    )
    assert "error" not in payload["calls"] and "buffer_bytes" not in payload["modules"]
    n_modules, n_calls = len(payload["modules"]["name"]), len(payload["calls"]["module"])
    assert all(len(col) == n_modules for col in payload["modules"].values())
    assert all(len(col) == n_calls for col in payload["calls"].values())
    strings, shapes, tensors = payload["strings"], payload["shapes"], payload["tensors"]
    for shape, dtype, stride, rg in tensors:
        assert 0 <= shape < len(shapes) and 0 <= stride < len(shapes)
        assert strings[dtype] in ("float32", "int64", "bool") and rg in (0, 1)


def test_streamed_messages_rebuild_the_final_calls() -> None:
    messages = _load("gpt2-tiny.messages.json")
    assert isinstance(messages, list)
    assert messages[0]["type"] == "start"
    assert messages[-1]["type"] == "done"
    assert {m["type"] for m in messages} <= set(protocol.MESSAGE_TYPES_TO_JS)
    start = messages[0]["payload"]
    strings = list(start["strings"])
    rows: dict[int, tuple[int, str]] = {}
    for m in messages[1:-1]:
        strings.extend(m["strings"])
        calls = m["calls"]
        for i, index in enumerate(calls["index"]):
            rows[index] = (calls["flops"][i], strings[start["modules"]["type"][calls["module"][i]]])
    final = _load("gpt2-tiny.json")
    assert isinstance(final, dict)
    assert sorted(rows) == list(range(len(final["calls"]["module"])))
    assert [rows[i][0] for i in sorted(rows)] == final["calls"]["flops"]
    assert rows[0][1] == "GPT2LMHeadModel"


# ---------------------------------------------------------------------------------------------
# Independent of the encoder: a payload decoded by the rules of the module docstring, compared
# with values written by hand (tiny model) or measured by torch (the recorded GPT-2 sample).


def decode(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with every dictionary id resolved, as plain rows."""
    strings, shapes, tensors = payload["strings"], payload["shapes"], payload["tensors"]

    def tensor(tid: int) -> tuple[tuple[int, ...], str, tuple[int, ...], bool]:
        shape, dtype, stride, rg = tensors[tid]
        return tuple(shapes[shape]), strings[dtype], tuple(shapes[stride]), bool(rg)

    def named(pairs: list[list[int]]) -> dict[str, Any]:
        return {strings[name]: tensor(tid) for name, tid in pairs}

    mods, calls = payload["modules"], payload["calls"]
    modules = [
        {
            "name": strings[mods["name"][i]],
            "type": strings[mods["type"][i]],
            "parent": mods["parent"][i],
            "params": mods["params"][i],
            "param_bytes": mods["param_bytes"][i],
            "own_params": named(mods["own_params"][i]),
        }
        for i in range(len(mods["name"]))
    ]
    rows = [
        {
            "module": calls["module"][j],
            "parent": calls["parent"][j],
            "flops": calls["flops"][j],
            "self_flops": calls["self_flops"][j],
            "activation_bytes": calls["activation_bytes"][j],
            "inputs": named(calls["inputs"][j]),
            "outputs": named(calls["outputs"][j]),
            "ops": {strings[op]: f for op, f in calls["ops"][j]},
        }
        for j in range(len(calls["module"]))
    ]
    timeline = payload["timeline"]
    return {
        "modules": modules,
        "calls": rows,
        "timeline": list(
            zip(
                timeline["bytes"],
                timeline["call"],
                [strings[o] for o in timeline["op"]],
                strict=True,
            )
        ),
        "totals": payload["totals"],
        "categories": payload["memory"]["categories"],
        "peak": payload["peak"],
    }


F32 = "float32"
# Sequential(Linear(4, 8), ReLU(), Sequential(Linear(8, 2))) on a (3, 4) float32 input, by hand:
# Linear(i, o) holds i*o + o parameters; addmm of (n, i) x (i, o) is 2*n*i*o FLOPs; a float32
# (r, c) tensor is 4*r*c bytes; weights are stored (o, i) and transposed for addmm (stride (1, i)).
W1, B1, W2, B2 = 4 * 8, 8, 8 * 2, 2
PARAM_BYTES = 4 * (W1 + B1 + W2 + B2)  # 232
X, H, Y = 4 * 3 * 4, 4 * 3 * 8, 4 * 3 * 2  # input, hidden and output bytes: 48, 96, 24
X_T = ((3, 4), F32, (4, 1), False)
H_T = ((3, 8), F32, (8, 1), False)
Y_T = ((3, 2), F32, (2, 1), False)
TINY = {
    "modules": [
        {"name": "", "type": "Sequential", "parent": -1},
        {"name": "0", "type": "Linear", "parent": 0},
        {"name": "1", "type": "ReLU", "parent": 0},
        {"name": "2", "type": "Sequential", "parent": 0},
        {"name": "0", "type": "Linear", "parent": 3},
    ],
    "params": [W1 + B1 + W2 + B2, W1 + B1, 0, W2 + B2, W2 + B2],
    "own_params": [
        {},
        {"weight": ((8, 4), F32, (4, 1), True), "bias": ((8,), F32, (1,), True)},
        {},
        {},
        {"weight": ((2, 8), F32, (8, 1), True), "bias": ((2,), F32, (1,), True)},
    ],
    # calls in start order: the root, its three children, the inner Linear
    "calls": [
        {
            "module": 0,
            "parent": -1,
            "flops": 2 * 3 * 4 * 8 + 2 * 3 * 8 * 2,
            "self_flops": 0,
            "activation_bytes": Y,
            "inputs": {"args[0]": X_T},
            "outputs": {"output": Y_T},
            "ops": {},
        },
        {
            "module": 1,
            "parent": 0,
            "flops": 2 * 3 * 4 * 8,
            "self_flops": 2 * 3 * 4 * 8,
            "activation_bytes": H,
            "inputs": {"args[0]": X_T},
            "outputs": {"output": H_T},
            "ops": {"aten.addmm": 2 * 3 * 4 * 8},
        },
        {
            "module": 2,
            "parent": 0,
            "flops": 0,
            "self_flops": 0,
            "activation_bytes": H,
            "inputs": {"args[0]": H_T},
            "outputs": {"output": H_T},
            "ops": {},
        },
        {
            "module": 3,
            "parent": 0,
            "flops": 2 * 3 * 8 * 2,
            "self_flops": 0,
            "activation_bytes": Y,
            "inputs": {"args[0]": H_T},
            "outputs": {"output": Y_T},
            "ops": {},
        },
        {
            "module": 4,
            "parent": 3,
            "flops": 2 * 3 * 8 * 2,
            "self_flops": 2 * 3 * 8 * 2,
            "activation_bytes": Y,
            "inputs": {"args[0]": H_T},
            "outputs": {"output": Y_T},
            "ops": {"aten.addmm": 2 * 3 * 8 * 2},
        },
    ],
    # live bytes: weights and input, + the hidden, + its ReLU, - the hidden, + the output,
    # - the ReLU's output (the output stays)
    "timeline": [
        (PARAM_BYTES + X + H, 1, "aten.addmm"),
        (PARAM_BYTES + X + 2 * H, 2, "aten.relu"),
        (PARAM_BYTES + X + H, 0, "free"),
        (PARAM_BYTES + X + H + Y, 4, "aten.addmm"),
        (PARAM_BYTES + X + Y, 0, "free"),
    ],
}


def test_a_tiny_payload_decodes_to_the_values_worked_out_by_hand() -> None:
    import torch

    import meta_widget as mw

    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 2))
    )
    got = decode(json.loads(mw.analyze(model, input_size=(3, 4)).to_json()))
    modules = got["modules"]
    assert [{k: m[k] for k in ("name", "type", "parent")} for m in modules] == TINY["modules"]
    assert [m["params"] for m in modules] == TINY["params"]
    assert [m["param_bytes"] for m in modules] == [4 * n for n in TINY["params"]]
    assert [m["own_params"] for m in modules] == TINY["own_params"]
    assert got["calls"] == TINY["calls"]
    assert got["timeline"] == TINY["timeline"]
    flops = 2 * 3 * 4 * 8 + 2 * 3 * 8 * 2
    assert got["totals"] == {
        "params": W1 + B1 + W2 + B2,
        "trainable_params": W1 + B1 + W2 + B2,
        "flops": flops,
        "param_bytes": PARAM_BYTES,
        "buffer_bytes": 0,
        "input_bytes": X,
        "activation_bytes": H + H + Y,  # every forward allocation
        "peak_bytes": PARAM_BYTES + X + 2 * H,
    }
    assert got["peak"] == {
        "bytes": PARAM_BYTES + X + 2 * H,
        "call": 2,
        "module": "1",
        "op": "aten.relu",
    }
    # at the peak (the ReLU): weights, input, the Linear's output and the ReLU's
    assert got["categories"] == {
        "parameters": PARAM_BYTES,
        "buffers": 0,
        "inputs": X,
        "gradients": 0,
        "optimizer state": 0,
        "activations": 2 * H,
        "temporaries": 0,
    }


def test_the_recorded_gpt2_sample_agrees_with_torch() -> None:
    """The recorded sample (which the JS tests decode too) against a real GPT-2 and its run."""
    import torch
    import transformers
    from models import gpt2_config
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    payload = _load("gpt2-tiny.json")
    assert isinstance(payload, dict)
    got = decode(payload)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2_config()).eval()
    named = list(model.named_modules())
    assert [m["name"] for m in got["modules"]] == [p.rpartition(".")[2] for p, _ in named]
    assert [m["type"] for m in got["modules"]] == [type(m).__name__ for _, m in named]
    unique = [{id(p): p.numel() for p in m.parameters()} for _, m in named]
    assert [m["params"] for m in got["modules"]] == [sum(u.values()) for u in unique]
    ids = torch.zeros(1, 8, dtype=torch.long)
    # the math path: attention as two matmuls, the count of FlopCounterMode's sdpa formula
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        logits = model(ids).logits
    assert got["totals"]["flops"] == fc.get_total_flops()
    root = got["calls"][0]
    assert [t[:2] for t in root["inputs"].values()] == [((1, 8), "int64")]
    assert root["outputs"]["logits"][:2] == (tuple(logits.shape), "float32")


def test_the_time_on_a_gpu_is_sent_only_with_gpu_and_equals_the_analysis() -> None:
    from models import gpt2_config

    import meta_widget as mw

    a = mw.analyze(gpt2_config(), input_size=(1, 8), mode="training", gpu="H100")
    time = json.loads(json.dumps(a.to_payload()))["time"]
    assert time["gpu"] == "H100" and time["memory_bytes"] == 80 * 2**30  # H100 SXM: 80 GB HBM3
    assert time["step_s"] == a.time.step_s and time["mfu"] == a.time.mfu
    df = a.to_dataframe()
    assert time["modules"]["time_s"] == df["time_s"].tolist()
    assert time["modules"]["bound"] == [b if isinstance(b, str) else "" for b in df["bound"]]
    assert "time" not in mw.analyze(gpt2_config(), input_size=(1, 8)).to_payload()


def test_modules_carry_their_constructor_settings() -> None:
    """Each module's ``extra_repr`` (issue 28, item 10), as torch prints it for a real module
    built on the CPU: the Details panel shows it."""
    import torch

    import meta_widget as mw

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1),
        torch.nn.LayerNorm(8, eps=1e-6),
        torch.nn.Dropout(p=0.25),
    )
    payload = mw.analyze(model, input_size=(1, 3, 8, 8)).to_payload()
    strings = payload["strings"]
    settings = [strings[i] for i in payload["modules"]["extra_repr"]]
    assert settings == ["", *(m.extra_repr() for m in model)]
    assert "stride=(2, 2)" in settings[1] and "eps=1e-06" in settings[2] and "p=0.25" in settings[3]


def test_the_optimizers_implementation_is_a_badge_when_given() -> None:
    import torch

    import meta_widget as mw

    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    for foreach, label in ((False, "foreach off"), (True, "foreach on")):
        a = mw.analyze(model, (2, 8), mode="training", foreach=foreach)
        assert label in [b[0] for b in protocol.encode_settings(a.options)]
    a = mw.analyze(model, (2, 8), mode="training")
    labels = [b[0] for b in protocol.encode_settings(a.options)]
    assert not any(s.startswith("foreach") for s in labels)  # PyTorch's default: no badge
