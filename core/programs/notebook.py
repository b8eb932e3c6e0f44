"""Jupyter notebooks as one script: the code cells in order, with a map back to cell and line.

A notebook (``.ipynb``, JSON, format 4 or 3) is read with the standard library's ``json``:
nbformat would add a dependency for what is a list of cells with their source. Each code
cell becomes a block of the script headed by a ``# %% cell N`` line; IPython magics
(``%matplotlib``), shell lines (``!pip``), help lines (``torch.ones?``) and non-Python
cell magics (``%%bash``) are replaced by ``pass`` with a comment, so every other line keeps
its place and every error, node and Source line maps back to "cell N, line M". Cells are
numbered by their position in the notebook (markdown cells count), as notebook editors
show them. Outputs are ignored. Plain stdlib: the GUI and the worker both use it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# Cell magics whose body is Python: the body runs, the magic line is skipped.
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
_ASSIGNED_MAGIC = re.compile(r"^[\w\s,.\[\]()*]+=\s*[%!]")
_HELP = re.compile(r"^[\w.\[\]()]+\?{1,2}$|^\?{1,2}[\w.]+$")


class NotebookError(ValueError):
    """A file that is not a readable notebook; the message names the file and what is wrong."""


@dataclass
class NotebookScript:
    """The script made from a notebook and where each of its lines came from."""

    source: str
    # One entry per code cell: cell (1-based position in the notebook), first (script line of
    # the cell's header), lines (how many source lines the cell has). Drives "cell N, line M"
    # and the Source panel's gutter.
    cells: list[dict] = field(default_factory=list)
    # Lines that did not run: cell, line, text and why (a magic, a shell line, help).
    skipped: list[dict] = field(default_factory=list)

    def where(self, line: int | None) -> str:
        return where(self.cells, line)


def where(cells: list[dict], line: int | None) -> str:
    """``cell N, line M`` for a script line of a notebook; ``line L`` for a plain script."""
    located = locate(cells, line)
    if located is None:
        return f"line {line}" if line else ""
    cell, inner = located
    return f"cell {cell}" if inner == 0 else f"cell {cell}, line {inner}"


def locate(cells: list[dict], line: int | None) -> tuple[int, int] | None:
    """(cell, line in cell) for a 1-based script line; line 0 is the cell's header. None outside."""
    if not cells or not line:
        return None
    for entry in cells:
        first = int(entry["first"])
        if first <= line <= first + int(entry["lines"]):
            return int(entry["cell"]), line - first
    return None


def script_line(cells: list[dict], cell: int, line: int) -> int | None:
    """The script line of line ``line`` of cell ``cell`` (both as ``where`` writes them); None when the
    notebook has no such code cell or line."""
    for entry in cells:
        if int(entry["cell"]) == cell and 1 <= line <= int(entry["lines"]):
            return int(entry["first"]) + line
    return None


def gutter_labels(cells: list[dict]) -> dict[int, str]:
    """Script line -> gutter text: ``[N]`` on a cell's header, the line in the cell elsewhere."""
    labels: dict[int, str] = {}
    for entry in cells:
        first, count = int(entry["first"]), int(entry["lines"])
        labels[first] = f"[{entry['cell']}]"
        for i in range(1, count + 1):
            labels[first + i] = str(i)
    return labels


def read_cells(path: str | Path) -> list[tuple[int, str, str]]:
    """(position, cell type, source) of every cell; NotebookError names what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotebookError(f"cannot read {path}: {exc}") from None
    if not text.strip():
        raise NotebookError(f"{path}: not a notebook: the file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{path}: not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno} "
                            f"({exc.msg})") from None
    except RecursionError:  # the decoder recurses per level: "[" * 100_000 in a cell's outputs
        raise NotebookError(f"{path}: not a notebook: its JSON is too deeply nested to read") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise NotebookError(f"{path}: not a notebook: unreadable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise NotebookError(f"{path}: not a notebook: the top level is not a JSON object")
    if isinstance(doc.get("cells"), list):
        raw = doc["cells"]
        key = "source"
    elif isinstance(doc.get("worksheets"), list):  # format 3
        raw = [c for ws in doc["worksheets"] if isinstance(ws, dict) for c in ws.get("cells", [])]
        key = "input"
    else:
        raise NotebookError(f"{path}: not a notebook: no 'cells' list (format {doc.get('nbformat', '?')})")
    cells = []
    for i, cell in enumerate(raw, start=1):
        if not isinstance(cell, dict):
            raise NotebookError(f"{path}: cell {i} is not a JSON object")
        src = cell.get(key, cell.get("source", ""))
        if isinstance(src, list):
            src = "".join(str(s) for s in src)
        if not isinstance(src, str):
            raise NotebookError(f"{path}: cell {i}: 'source' is neither text nor a list of lines")
        cells.append((i, str(cell.get("cell_type", "code")), src))
    return cells


_PYTHON_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def python_lines(src: str) -> list[str]:
    """``src`` split where Python ends a line (\\n, \\r\\n, \\r) and nowhere else.

    ``str.splitlines`` also breaks at U+2028, U+2029, \\x0b, \\x0c, \\x1c-\\x1e and \\x85, which Python
    and Jupyter read as part of the line: a comment holding one would become code, and a string
    holding one a SyntaxError."""
    lines = _PYTHON_LINE_BREAK.split(src)
    if lines[-1] == "":
        lines.pop()
    return lines


def notebook_script(path: str | Path) -> NotebookScript:
    """The code cells of ``path`` as one script, with the line map and the skipped lines."""
    out: list[str] = [f"# {ascii(Path(path).name)}: the code cells of this notebook, run in order",
                      "display = print  # IPython's display(), for cells that call it without importing it"]
    cells: list[dict] = []
    skipped: list[dict] = []
    for position, kind, src in read_cells(path):
        if kind != "code":
            continue
        lines = python_lines(src)
        cells.append({"cell": position, "first": len(out) + 1, "lines": len(lines)})
        out.append(f"# %% cell {position}")
        cell_magic = None
        for n, text in enumerate(lines, start=1):
            stripped = text.strip()
            if n == 1 and stripped.startswith("%%"):
                cell_magic = stripped[2:].split()[0] if len(stripped) > 2 else ""
                why = f"cell magic %%{cell_magic}"
                if cell_magic not in PYTHON_CELL_MAGICS:
                    why += ": the cell did not run"
                skipped.append({"cell": position, "line": n, "text": stripped, "why": why})
                out.append(f"pass  # skipped: {stripped} ({why})")
                continue
            if cell_magic is not None and cell_magic not in PYTHON_CELL_MAGICS:
                out.append(f"# {text}" if text else "")
                continue
            why = _skip_reason(stripped)
            if why:
                indent = text[: len(text) - len(text.lstrip())]
                skipped.append({"cell": position, "line": n, "text": stripped, "why": why})
                out.append(f"{indent}pass  # skipped: {stripped} ({why})")
            else:
                out.append(text)
        out.append("")  # a blank line closes the cell, so an unclosed block cannot run into the next
    return NotebookScript(source="\n".join(out) + "\n", cells=cells, skipped=skipped)


def _skip_reason(stripped: str) -> str:
    if stripped.startswith("%"):
        return "IPython magic"
    if stripped.startswith("!"):
        return "shell command"
    if _ASSIGNED_MAGIC.match(stripped) and not stripped.startswith(("#", "'", '"')):
        return "IPython magic" if "%" in stripped.split("=", 1)[1][:2] else "shell command"
    if _HELP.match(stripped):
        return "IPython help"
    return ""


def skipped_notes(script: NotebookScript) -> list[str]:
    """One sentence per skipped line, for the run's output."""
    return [f"cell {s['cell']}, line {s['line']}: skipped {s['text']!r} ({s['why']})" for s in script.skipped]


def map_traceback(text: str, filename: str, cells: list[dict]) -> str:
    """Rewrite ``File "nb.ipynb", line 17`` in a traceback as ``cell 4, line 2``."""
    if not cells or not text:
        return text
    pattern = re.compile(r'(File "' + re.escape(filename) + r'", )line (\d+)')
    return pattern.sub(lambda m: m.group(1) + where(cells, int(m.group(2))), text)
