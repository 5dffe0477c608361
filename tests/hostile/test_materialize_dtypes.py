"""Loading a checkpoint whose dtype torch cannot hold one value per element says so clearly."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import meta_widget as mw
from meta_widget.materialization import MaterializeError, load_state_dict_file


def test_a_sub_byte_safetensors_dtype_is_refused_with_a_message(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00\x00")
    info = mw.inspect_checkpoint(path)  # inspecting is fine: only the header is read
    assert info["w"].dtype == "float4_e2m1fn"
    with pytest.raises(MaterializeError, match=r"'w' .* float4_e2m1fn, which has no torch dtype"):
        load_state_dict_file(info)
