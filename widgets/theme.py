"""Colours and line widths for the light, dark and print themes, as plain hex strings.

Kinds of nodes differ by shape and line style as well as by colour, so the print theme
(greys only) stays readable; colour only reinforces what the shapes say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Theme:
    name: str
    background: str
    text: str
    muted_text: str
    op_fill: str  # backward op
    op_border: str
    leaf_fill: str  # AccumulateGrad
    leaf_border: str
    custom_fill: str  # autograd.Function
    custom_border: str
    other_fill: str
    other_border: str
    no_grad_fill: str
    no_grad_border: str
    group_fill: str  # a collapsed group
    group_border: str
    group_box_fill: str  # an expanded group's frame
    group_box_border: str
    group_text: str
    edge: str
    edge_active: str
    edge_text: str
    saved_fill: str
    saved_border: str
    error: str
    error_fill: str
    retained: str
    selection: str
    highlight: str  # search matches
    executed_fill: str
    executed_mark: str
    current: str
    frontier: str
    failed: str
    overlay_fill: str  # legend and minimap panels
    overlay_border: str
    minimap_view: str
    sharing: str = "#a0249b"  # same-storage links and view tags
    inplace: str = "#9c4f00"  # in-place op tags
    device: str = "#0b7285"  # device tags and device-change edges
    font_family: str = "DejaVu Sans"
    font_px: int = 11
    small_font_px: int = 9
    line_width: float = 1.3


LIGHT = Theme(
    name="light",
    background="#fbfbf8",
    text="#1f2328",
    muted_text="#5b636e",
    op_fill="#dde9f8",
    op_border="#3a6ea5",
    leaf_fill="#dcf0d5",
    leaf_border="#3f8a36",
    custom_fill="#efe3f7",
    custom_border="#7b4fa6",
    other_fill="#eeeeee",
    other_border="#6e6e6e",
    no_grad_fill="#f4f4f2",
    no_grad_border="#9a9a9a",
    group_fill="#f7ecd3",
    group_border="#a87b2c",
    group_box_fill="#f3efe6",
    group_box_border="#c8b999",
    group_text="#7a5a1e",
    edge="#6b7785",
    edge_active="#1f6feb",
    edge_text="#3d4650",
    saved_fill="#fff6dc",
    saved_border="#b58a1d",
    error="#c62828",
    error_fill="#fde4e2",
    retained="#d9730d",
    selection="#1f6feb",
    highlight="#f2c200",
    executed_fill="#e3e3e3",
    executed_mark="#2e7d32",
    current="#e8590c",
    frontier="#1971c2",
    failed="#c62828",
    overlay_fill="#ffffffe6",
    overlay_border="#c9ced6",
    minimap_view="#1f6feb",
)

DARK = Theme(
    name="dark",
    background="#1e1f22",
    text="#e6e6e6",
    muted_text="#a0a6ad",
    op_fill="#263a52",
    op_border="#79a8e0",
    leaf_fill="#243d27",
    leaf_border="#7cc46f",
    custom_fill="#3a2b4a",
    custom_border="#b894dc",
    other_fill="#333333",
    other_border="#9a9a9a",
    no_grad_fill="#2a2a2a",
    no_grad_border="#808080",
    group_fill="#45391f",
    group_border="#d4a948",
    group_box_fill="#26251f",
    group_box_border="#5f5a48",
    group_text="#d9bb75",
    edge="#8c96a3",
    edge_active="#58a6ff",
    edge_text="#c2c8cf",
    saved_fill="#3d3520",
    saved_border="#d4a948",
    error="#ff6b6b",
    error_fill="#4a2426",
    retained="#ffa94d",
    selection="#58a6ff",
    highlight="#ffd43b",
    executed_fill="#3a3a3a",
    executed_mark="#69db7c",
    current="#ff922b",
    frontier="#74c0fc",
    failed="#ff6b6b",
    overlay_fill="#2b2d31e6",
    overlay_border="#4a4e55",
    minimap_view="#58a6ff",
    sharing="#e599f7",
    inplace="#ffa94d",
    device="#66d9e8",
)

PRINT = Theme(
    name="print",
    background="#ffffff",
    text="#000000",
    muted_text="#444444",
    op_fill="#ffffff",
    op_border="#000000",
    leaf_fill="#e6e6e6",
    leaf_border="#000000",
    custom_fill="#ffffff",
    custom_border="#000000",
    other_fill="#f2f2f2",
    other_border="#000000",
    no_grad_fill="#ffffff",
    no_grad_border="#666666",
    group_fill="#d9d9d9",
    group_border="#000000",
    group_box_fill="#f7f7f7",
    group_box_border="#888888",
    group_text="#000000",
    edge="#333333",
    edge_active="#000000",
    edge_text="#000000",
    saved_fill="#ffffff",
    saved_border="#555555",
    error="#000000",
    error_fill="#bfbfbf",
    retained="#000000",
    selection="#000000",
    highlight="#999999",
    executed_fill="#d0d0d0",
    executed_mark="#000000",
    current="#000000",
    frontier="#444444",
    failed="#000000",
    overlay_fill="#ffffff",
    overlay_border="#000000",
    minimap_view="#000000",
    sharing="#000000",
    inplace="#000000",
    device="#000000",
    line_width=1.2,
)

THEMES: dict[str, Theme] = {"light": LIGHT, "dark": DARK, "print": PRINT}


def get_theme(name: str) -> Theme:
    """The theme called ``name``; unknown names fall back to light."""
    return THEMES.get(name, LIGHT)
