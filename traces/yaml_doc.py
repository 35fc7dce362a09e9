"""YAML documents as kvroute reads them: safe, a key given twice refused, errors naming file and line.

One loader serves every YAML input (``--config`` scenario files, inference-perf workload configs,
EndpointPickerConfig files): PyYAML's ``SafeLoader`` (no Python objects), whose mappings refuse a
key given twice (:class:`~kvroute.traces.inputs.DuplicateKeyError`; a ``<<`` merge key's values may
still be overridden, as YAML allows), and, on request, remember their lines (:class:`LineMap`,
:class:`LineList`) so that a reader can name the line of a field it rejects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvroute.traces.inputs import DuplicateKeyError, InputError, check_regular_file

MERGE_TAG = "tag:yaml.org,2002:merge"

FENCED_YAML = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.M | re.S)
"""A fenced YAML block of a Markdown file (```` ```yaml ```` or ```` ```yml ````); group 1 is its text."""

MARKDOWN_SUFFIXES = (".md", ".markdown")
"""Files read as Markdown reports (their fenced YAML blocks), compared in lower case."""


def markdown_yaml_blocks(text: str) -> list[tuple[str, int, str]]:
    """The fenced YAML blocks of a Markdown text (:data:`FENCED_YAML`), in order:
    ``(block text, lines before it, label)``, the label being the last non-blank line above the
    block without its Markdown marks (``**precise-scheduling**``, ``### Workload`` ->
    ``precise-scheduling``, ``Workload``), "" at the top of the file."""
    blocks = []
    for match in FENCED_YAML.finditer(text):
        above = text[:match.start()].rstrip().rpartition("\n")[2]
        blocks.append((match.group(1), text.count("\n", 0, match.start(1)), above.strip().strip("#*_` ").strip()))
    return blocks


@dataclass(frozen=True, slots=True)
class YamlSource:
    """Where a YAML document came from, for errors: its file (``where``) and the lines before the
    document in that file (``offset``: a block cut out of a Markdown report)."""

    where: str
    offset: int = 0

    def line(self, node: object, key: object = None) -> int | None:
        """The file line of ``node[key]`` (of ``node`` itself when ``key`` is None or absent), or
        None when ``node`` was not parsed with line tracking (:func:`line_of`)."""
        line = line_of(node, key)
        return None if line is None else line + self.offset

    def error(self, reason: str, node: object = None, key: object = None, field: str | None = None) -> InputError:
        """An :class:`InputError` at ``node[key]``'s file line, naming ``field``."""
        return InputError(reason, self.where, self.line(node, key), field)


class LineMap(dict):
    """A YAML mapping that remembers its line (1-based) and each key's line (``key_lines``)."""

    line: int = 0
    key_lines: dict


class LineList(list):
    """A YAML sequence that remembers each item's line (1-based, ``lines``)."""

    lines: list


def line_of(node: object, key: object = None) -> int | None:
    """The line (1-based) of ``node[key]`` in its file: a :class:`LineMap`'s key's line (the
    mapping's own when ``key`` is None or absent), a :class:`LineList`'s item's; None for a node
    read without line tracking."""
    if isinstance(node, LineMap):
        return node.key_lines.get(key, node.line) if key is not None else node.line
    if isinstance(node, LineList) and type(key) is int and 0 <= key < len(node.lines):
        return node.lines[key]
    return None


def yaml_loader(track_lines: bool = False):
    """A ``yaml.SafeLoader`` subclass whose mappings refuse a key given twice.

    Args:
        track_lines: build mappings as :class:`LineMap` and sequences as :class:`LineList`
            (else plain ``dict`` and ``list``).

    Raises (while loading):
        DuplicateKeyError: a mapping names a key twice (its ``line`` set; no file).
    """
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if not isinstance(node, yaml.MappingNode):
                return super().construct_mapping(node, deep=deep)  # SafeLoader's own error
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:  # an unhashable key: SafeLoader's own error below
                    continue
                if repeated:
                    raise DuplicateKeyError(key, None, key_node.start_mark.line + 1)
                seen.add(key)
            if not track_lines:
                return super().construct_mapping(node, deep=deep)
            self.flatten_mapping(node)  # ``<<`` merge keys first, so that the node's own keys win
            out = LineMap()
            out.line = node.start_mark.line + 1
            out.key_lines = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    out[key] = self.construct_object(value_node, deep=True)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, "found an unhashable key",
                        key_node.start_mark) from None
                out.key_lines[key] = key_node.start_mark.line + 1
            return out

    if track_lines:
        def construct_list(loader, node):
            out = LineList(loader.construct_object(child, deep=True) for child in node.value)
            out.lines = [child.start_mark.line + 1 for child in node.value]
            return out

        UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                        UniqueKeyLoader.construct_mapping)
        UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_list)
    return UniqueKeyLoader


def parse_yaml(text: str, where: str, line_offset: int = 0, track_lines: bool = False) -> object:
    """The YAML document in ``text`` (read from ``where``).

    Args:
        text: the document.
        where: the file it came from, named in errors.
        line_offset: lines before ``text`` in that file (a block cut out of a Markdown report).
        track_lines: as :func:`yaml_loader`.

    Raises:
        InputError: not valid YAML (with its line), a key given twice (with its line and the key as
            the field), or nested deeper than Python's recursion limit.
    """
    import yaml

    try:
        return yaml.load(text, yaml_loader(track_lines))
    except DuplicateKeyError as exc:
        raise DuplicateKeyError(exc.key, where, exc.line + line_offset) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 + line_offset if mark is not None else None
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise InputError(f"not valid YAML: {problem}", where, line) from None
    except RecursionError:  # nested deeper than Python's recursion limit
        raise InputError("nested too deep to read", where) from None


def read_text(path: str | Path) -> str:
    """A regular file's text (UTF-8).

    Raises:
        InputError: not a regular file (a FIFO would block, ``/dev/zero`` never ends), or it
            cannot be read or decoded; naming the file.
    """
    check_regular_file(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", str(path)) from None


def read_yaml(path: str | Path, track_lines: bool = False) -> object:
    """The YAML document in file ``path`` (:func:`read_text`, then :func:`parse_yaml`).

    Raises:
        InputError: as :func:`read_text` and :func:`parse_yaml`, naming the file.
    """
    return parse_yaml(read_text(path), str(path), track_lines=track_lines)
