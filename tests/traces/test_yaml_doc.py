"""The one YAML reader (kvroute.traces.yaml_doc): unique keys, lines, errors naming file and line."""

import pytest

from kvroute.traces.inputs import DuplicateKeyError, InputError
from kvroute.traces.yaml_doc import LineList, LineMap, parse_yaml, read_yaml


def test_lines_are_remembered_when_asked():
    doc = parse_yaml("a: 1\nb:\n  - x: 2\n  - 3\n", "f.yaml", track_lines=True)
    assert type(doc) is LineMap and doc == {"a": 1, "b": [{"x": 2}, 3]}
    assert doc.line == 1 and doc.key_lines == {"a": 1, "b": 2}
    assert type(doc["b"]) is LineList and doc["b"].lines == [3, 4]
    assert doc["b"][0].key_lines == {"x": 3}
    plain = parse_yaml("a: {b: [1]}\n", "f.yaml")
    assert type(plain) is dict and type(plain["a"]) is dict and type(plain["a"]["b"]) is list


@pytest.mark.parametrize("track_lines", [False, True])
def test_a_key_given_twice_names_file_line_and_key_and_a_merge_key_may_be_overridden(track_lines):
    with pytest.raises(DuplicateKeyError) as exc:
        parse_yaml("a: 1\nb: 2\na: 3\n", "f.md", line_offset=10, track_lines=track_lines)
    assert (exc.value.where, exc.value.line, exc.value.field) == ("f.md", 13, "a")
    doc = parse_yaml("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "f.yaml", track_lines=track_lines)
    assert doc["c"] == {"x": 3, "y": 2}


def test_invalid_yaml_and_deep_nesting_name_the_file(tmp_path):
    with pytest.raises(InputError) as exc:
        parse_yaml("a: [1\n", "f.yaml", line_offset=4)
    assert exc.value.where == "f.yaml" and exc.value.line == 6 and "not valid YAML" in exc.value.reason
    with pytest.raises(InputError, match="nested too deep"):
        parse_yaml("[" * 100_000, "deep.yaml")
    with pytest.raises(InputError, match="not a regular file"):
        read_yaml(tmp_path)
    with pytest.raises(InputError) as exc:
        read_yaml(tmp_path / "missing.yaml")
    assert exc.value.where == str(tmp_path / "missing.yaml")
