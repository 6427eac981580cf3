"""The checked-in stubs equal what grpcio-tools generates from the .proto files now."""

from __future__ import annotations

from proto.generate import proto_files, stale_stubs


def test_generated_stubs_are_fresh() -> None:
    assert {p.name for p in proto_files()} == {"admin.proto", "generate.proto"}
    assert stale_stubs() == [], "stubs are stale: run `python -m proto.generate`"
