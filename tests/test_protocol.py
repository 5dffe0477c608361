"""The wire format: the Python encoder against the recorded samples the JS tests decode too."""

from __future__ import annotations

import json
import os

from make_fixtures import FIXTURES, normalize, samples

from meta_widget import protocol


def _load(name: str) -> object:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def test_recorded_samples_are_what_the_encoder_produces_now() -> None:
    # If this fails after a deliberate protocol change: run `python tests/make_fixtures.py`,
    # update js/protocol.ts, and run `npm test` (it decodes the same files).
    for name, data in samples().items():
        assert normalize(json.loads(json.dumps(data))) == _load(name), name


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
