"""Run one notebook headless with chosen parameters, e.g.

    python notebooks/run.py notebooks/03_long_histories.ipynb /tmp/03.ipynb SESSIONS=8 WORKERS=2

Each ``NAME=VALUE`` sets one name of the notebook's ``parameters`` cell (papermill's convention: the
cell tagged ``parameters``; the values go in a cell inserted after it, tagged
``injected-parameters``, as papermill and ``tests/test_notebooks.py`` do). VALUE is a Python
literal: ``ROUNDS=2``, ``HISTORY=(8000,12000)``, ``POLICIES=['round_robin','kv_aware']``,
``EXECUTOR='sequential'``. The notebook runs top to bottom in a fresh ``python3`` kernel, from OUT's
folder, with no time limit, and is written to OUT with its outputs (also when a cell fails: the
outputs up to the error). Needs nbclient, nbformat and ipykernel: ``pip install -e ".[notebooks]"``.

Exit status: 0 when every cell ran; 1 when a cell raised (its error printed); 2 for a bad argument
(a name the parameters cell does not set, a VALUE that is no Python literal, a notebook without a
parameters cell).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

USAGE = "usage: python notebooks/run.py NOTEBOOK.ipynb OUT.ipynb [NAME=VALUE ...]"


def parameter_names(source: str) -> list[str]:
    """The names a parameters cell assigns at its top level, in order."""
    names = []
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def parameters_cell(book, overrides: list[str]):
    """The cell that sets ``overrides`` (``NAME=VALUE`` texts) after ``book``'s parameters cell,
    and its index there.

    Raises:
        ValueError: no cell is tagged ``parameters``; an override is not ``NAME=VALUE``, names no
            parameter (the valid names listed) or its VALUE is no Python literal.
    """
    import nbformat

    index = next((i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", [])), None)
    if index is None:
        raise ValueError("the notebook has no cell tagged 'parameters'")
    valid = parameter_names(book.cells[index].source)
    lines = []
    for text in overrides:
        name, sep, value = text.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise ValueError(f"{text!r} is not NAME=VALUE")
        if name not in valid:
            raise ValueError(f"{name!r} is not set by the parameters cell; valid names: {', '.join(valid)}")
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"{name}={value}: VALUE must be a Python literal (quote text: {name}='text')") from None
        lines.append(f"{name} = {value}")
    cell = nbformat.v4.new_code_cell("# Parameters given on the command line\n" + "\n".join(lines),
                                     metadata={"tags": ["injected-parameters"]})
    return cell, index + 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    import nbclient
    import nbformat

    source, out, overrides = Path(argv[0]), Path(argv[1]), argv[2:]
    book = nbformat.read(source, as_version=4)
    try:
        cell, index = parameters_cell(book, overrides)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if overrides:
        book.cells.insert(index, cell)
    out.parent.mkdir(parents=True, exist_ok=True)
    client = nbclient.NotebookClient(book, timeout=None, kernel_name="python3",
                                     resources={"metadata": {"path": str(out.parent.resolve())}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        nbformat.write(book, out)
        print(f"{source}: a cell failed; {out} holds the outputs up to it\n{exc}", file=sys.stderr)
        return 1
    nbformat.write(book, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
