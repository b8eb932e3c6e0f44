"""Bounds on how much of a text the views lay out; the full text stays in the model.

Qt lays out a line in time that grows faster than its length (a one-line 100 KB error took
seconds, 1 MB many minutes), so views show a cut copy and say how much they left out. What
is copied or saved is the full text.
"""

from __future__ import annotations

import re

LINE_LIMIT = 2_000
"""The most characters of one line a details view shows."""
TEXT_LIMIT = 20_000
"""The most characters of a whole text a details view shows."""
NAME_LIMIT = 200
"""The most characters of a name or one-line summary (a graph label, a list row)."""


def more_note(hidden: int) -> str:
    """What stands in for ``hidden`` characters left out."""
    return f"… ({hidden:,} more characters; Copy takes all)"


def cut_line(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` up to ``limit`` characters, then a note of how many more it has."""
    if len(text) <= limit:
        return text
    return text[:limit] + more_note(len(text) - limit)


def cut_middle(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` with its middle left out past ``2 * limit`` characters: what to hand Qt to elide,
    which measures all of a text (a 1 MB name took seconds) to show a few dozen characters."""
    if len(text) <= 2 * limit:
        return text
    return text[:limit] + "…" + text[-limit:]


def cut_text(text: str, line_limit: int = LINE_LIMIT, text_limit: int = TEXT_LIMIT) -> str:
    """``text`` with each line cut to ``line_limit`` and the whole to about ``text_limit`` characters.

    Only the part shown is scanned, so a 50 MB text costs what its first lines cost.
    """
    if len(text) <= line_limit and "\n" not in text:
        return text
    out: list[str] = []
    shown = pos = 0
    size = len(text)
    while pos < size:
        if shown >= text_limit:
            out.append(more_note(size - pos))
            break
        end = text.find("\n", pos, pos + line_limit + 1)
        if end < 0:  # the line is longer than the limit, or the text ends
            end = text.find("\n", pos)
            end = size if end < 0 else end
        length = end - pos
        if length > line_limit:
            out.append(text[pos:pos + line_limit] + more_note(length - line_limit))
            shown += line_limit + 1
        else:
            out.append(text[pos:end])
            shown += length + 1
        pos = end + 1
    return "\n".join(out)


# a long run of text between two tags (it starts where a tag ends), never a tag's own attributes
_RUN = re.compile(r"(?:(?<=>)|^)[^<]{%d,}" % (NAME_LIMIT * 5))
_PARTIAL_ENTITY = re.compile(r"&[#\w]*$")


def cut_markup(markup: str, line_limit: int = NAME_LIMIT * 5, text_limit: int = TEXT_LIMIT) -> str:
    """Rich text with each long run of text between tags cut as ``cut_text`` cuts it.

    A safety net for views that build HTML from many fields: a megabyte-long name anywhere in
    it is laid out as its first ``line_limit`` characters and a note.
    """
    if len(markup) < NAME_LIMIT * 5:
        return markup

    def cut(match: re.Match) -> str:
        run = match.group(0)
        shown = cut_text(run, line_limit, text_limit)
        if shown == run:
            return run
        lines = []
        for line in shown.split("\n"):
            head, note, rest = line.rpartition("… (")
            lines.append(_PARTIAL_ENTITY.sub("", head) + note + rest if note and rest.endswith("Copy takes all)")
                         else line)
        return "\n".join(lines)

    return _RUN.sub(cut, markup)
