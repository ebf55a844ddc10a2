"""The dataclasses of the wire messages against docs/protocol.yaml: the same fields, the same required lists.

The repository's docs/protocol.yaml (or $HANDOFF_PROTOCOL_YAML) is read with
PyYAML (Debian's python3-yaml), a test-only dependency.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Type

import pytest

from handoff.protocol import DrainStatus, ErrorBody, Leadership, LeadershipAck, ReturnRequest, ReturnResult

yaml = pytest.importorskip("yaml", reason="PyYAML (apt-get install python3-yaml) reads docs/protocol.yaml")

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.environ.get("HANDOFF_PROTOCOL_YAML") or os.path.join(HERE, "..", "..", "..", "docs", "protocol.yaml")

MESSAGES: Dict[str, Type[Any]] = {
    "DrainStatus": DrainStatus,
    "ReturnRequest": ReturnRequest,
    "ReturnResult": ReturnResult,
    "Leadership": Leadership,
    "LeadershipAck": LeadershipAck,
    "Error": ErrorBody,
}


@pytest.fixture(scope="module")
def schemas() -> Dict[str, Any]:
    if not os.path.exists(SPEC):
        pytest.skip("no docs/protocol.yaml at %s (set HANDOFF_PROTOCOL_YAML)" % SPEC)
    with open(SPEC) as f:
        spec = yaml.safe_load(f)
    out: Dict[str, Any] = spec["components"]["schemas"]
    return out


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_fields_match_the_schema(schemas: Dict[str, Any], name: str) -> None:
    cls = MESSAGES[name]
    schema = schemas[name]
    ours = [wire for _, wire in cls.JSON_FIELDS]
    assert sorted(ours) == sorted(schema["properties"]), "%s: fields %s, protocol.yaml has %s" % (name, ours, sorted(schema["properties"]))
    assert sorted(cls.REQUIRED) == sorted(schema.get("required", [])), "%s: required %s, protocol.yaml has %s" % (
        name, cls.REQUIRED, schema.get("required"))


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_types_match_the_schema(schemas: Dict[str, Any], name: str) -> None:
    cls = MESSAGES[name]
    zero = cls()
    for attr, wire in cls.JSON_FIELDS:
        prop = schemas[name]["properties"][wire]
        v = getattr(zero, attr)
        want = {"boolean": bool, "integer": int, "string": (str, type(None))}[prop["type"]]
        assert isinstance(v, want), "%s.%s: zero value %r, protocol.yaml says %s" % (name, wire, v, prop["type"])
        if prop.get("format") == "date-time":
            assert wire == "until"


def test_the_paths_are_the_schemas(schemas: Dict[str, Any]) -> None:
    with open(SPEC) as f:
        paths = yaml.safe_load(f)["paths"]
    from handoff.protocol import DRAIN_PATH, LEASE_PATH_PREFIX, RETURN_PATH, STOP_CLAIMING_PATH

    assert set(paths[STOP_CLAIMING_PATH]) >= {"post"}
    assert set(paths[DRAIN_PATH]) >= {"get"}
    assert set(paths[RETURN_PATH]) >= {"post"}
    assert set(paths[LEASE_PATH_PREFIX + "{lease}"]) >= {"put"}
    ref = paths[DRAIN_PATH]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/DrainStatus"
