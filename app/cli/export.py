"""``main.py export``: run scripts in the worker and export one graph of each, without a window.

``export a.py b.py -o out/{name}.svg`` writes one file per script. The GUI side never
imports torch: scripts run in worker processes and only plain trace data comes back.
Each script's problems are reported with its name and the batch goes on; the exit status
is non-zero when any script failed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
from pathlib import Path

from app.cli.hosts import add_worker_args, worker_options
from app.cli.options import add_run_options, load_options
from core.protocol import messages as protocol
from core.client.handle import capture_run, run_capture
from core.model.loop_curves import loop_curves
from core.model.nesting import link_nested
from core.model.step_state import step_texts, step_view
from core.model.trace import CallInfo, Trace

FORMATS = ("png", "svg", "pdf", "dot", "json")


class ScriptError(Exception):
    """A problem with one script of the batch; the message names the script."""


def safe_name(script: Path) -> str:
    """The script's name for ``{name}``: never a path component that leaves the chosen folder."""
    name = script.stem.replace("/", "_").replace("\\", "_")
    if not name.strip("."):  # "", "." or ".." (a script named "...py")
        name = name.replace(".", "_") or "script"
    return name


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export",
        help="export graphs (PNG, SVG, PDF, DOT, JSON) or the memory chart",
        description="Run each script in a worker and export one of its backward graphs. With several "
        "scripts, -o must contain {name} (the script's file name without .py) or be a directory.",
    )
    p.add_argument("scripts", nargs="+", metavar="SCRIPT",
                   help="PyTorch scripts, notebooks, saved models or Hugging Face model folders, one export each")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output file (format from the suffix), a pattern with {name}, or a directory (required "
                   "unless --curves)")
    p.add_argument("--format", choices=FORMATS, help="format when OUT has no suffix or is a directory (default png)")
    p.add_argument("--call", type=int, help="which backward / grad call to export (default 0); JSON then holds "
                   "only that call")
    p.add_argument("--step", type=int, metavar="K", help="draw the graph as it is after K backward steps")
    p.add_argument("--theme", choices=("print", "light", "dark"), default="print",
                   help="colours: print (default, for paper and slides), light or dark")
    p.add_argument("--title", help="title above the graph ({name} and {call} are replaced)")
    p.add_argument("--caption", help="caption below the graph ({name} and {call} are replaced)")
    p.add_argument("--scale", type=float, default=2.0, help="PNG pixels per screen pixel (default 2)")
    p.add_argument("--transparent", action="store_true", help="PNG, SVG and PDF without a background")
    p.add_argument("--shapes", action="store_true", help="write tensor shapes on the edges")
    p.add_argument("--storage", metavar="NAME",
                   help="export the Storage view of the tensor the script calls NAME (PNG, SVG or PDF)")
    p.add_argument("--next-functions", dest="slots", action="store_true",
                   help="label each edge with its next_functions entry, (node, input_nr)")
    p.add_argument("--values", action="store_true",
                   help="show each leaf's data and .grad after the call, and the seed gradient at the root")
    p.add_argument("--saved", action="store_true", help="draw each node's saved tensors")
    p.add_argument("--expand", action="store_true", help="expand every module group (big graphs open collapsed)")
    p.add_argument("--nan-check", action="store_true", help="check each op's output and each gradient for NaN/Inf: "
                   "the first non-finite op and gradient are marked on the graph")
    p.add_argument("--color-by", choices=("grad-norm",), help="grad-norm: colour each edge by the norm of the "
                   "gradient it carried and each leaf by its ||grad||, on a log scale drawn under the graph")
    p.add_argument("--direction", choices=("TB", "LR", "forward"),
                   help="TB: the loss on top, arrows the way gradients flow (default; with --page, TB or LR, "
                   "whichever draws the graph larger); LR: the loss on the left; forward: inputs on top, arrows "
                   "from the inputs to the loss")
    p.add_argument("--page", choices=("16:9", "4:3", "A4", "Letter"),
                   help="fit a slide (16:9 is 1920x1080 in PNG) or a portrait page. On a slide, text stays at 10 "
                   "pt of the slide or more (20 px at 1920x1080): the graph is spaced compactly unless what "
                   "is written along its edges needs more room, and modules fold before text gets smaller; "
                   "only a graph that folded would still show just its part around the loss goes down to 9 "
                   "pt. On paper, modules fold rather than text going below 9 pt (9 px in PNG). With "
                   "--values, graphs of up to 40 nodes stay unfolded")
    p.add_argument("--frames", metavar="DIR", help="also write one PNG per backward step (frame_000.png, ...)")
    p.add_argument("--gif", metavar="OUT.gif", help="also write the steps as an animated GIF (with --forward-frames "
                   "and no --frames: the forward replay)")
    p.add_argument("--forward-frames", metavar="DIR", help="also write the forward replay: one PNG per op, in the "
                   "order the forward pass made them (frame_001.png, ...)")
    p.add_argument("--duration", type=int, default=700, help="milliseconds per GIF frame (default 700)")
    p.add_argument("--memory", action="store_true", help="export the memory chart of the run (PNG or SVG) "
                   "instead of a graph; with --call, zoomed to that call's iteration")
    p.add_argument("--reference", metavar="SCRIPT", help="with --memory: run this script too and draw it on the "
                   "same scale (a leak beside its fix)")
    p.add_argument("--curves", metavar="OUT", help="export the curves of the run's loop instead of a graph (PNG or "
                   "SVG, in place of -o): the loss and each small leaf's value per backward call")
    add_run_options(p, timeout_help="time limit per script in seconds (default 600)")
    add_worker_args(p)
    return p


def main(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="backprop-studio export: %(message)s")
    scripts = [Path(s) for s in args.scripts]
    batch = len(scripts) > 1
    try:
        _check_args(args, batch)
    except ScriptError as exc:
        print(f"backprop-studio export: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for script in scripts:
        try:
            done, warnings = _export_one(args, script, batch)
        except ScriptError as exc:
            done, warnings = [], [str(exc)]
        except Exception as exc:  # one bad script must not stop the batch
            done, warnings = [], [f"{type(exc).__name__}: {exc}"]
        for line in done:
            print(line)
        for line in warnings:
            print(f"backprop-studio export: {script}: {line}", file=sys.stderr)
        failed += bool(warnings)
    if batch:
        print(f"{len(scripts) - failed} of {len(scripts)} scripts exported without problems")
    return 1 if failed else 0


def _is_dir(target: str) -> bool:
    return target.endswith(("/", "\\")) or Path(target).is_dir()


def output_path(target: str, script: Path, default_ext: str) -> Path:
    """``target`` with {name} replaced, or ``target/<name>.<default_ext>`` when it is a directory."""
    if "{name}" in target:
        return Path(target.replace("{name}", safe_name(script)))
    if _is_dir(target):
        return Path(target) / f"{safe_name(script)}.{default_ext}"
    return Path(target)


def _format(args, out: Path) -> str:
    fmt = out.suffix.lstrip(".").lower() or args.format or ""
    if fmt not in FORMATS:
        raise ScriptError(f"-o {args.output}: unknown format {fmt!r}; use .png, .svg, .pdf, .dot or .json "
                          "(or --format)")
    return fmt


def _check_args(args, batch: bool) -> None:
    if getattr(args, "curves", None):
        if args.output is not None:
            raise ScriptError("--curves OUT writes its own file: leave out -o")
        args.output = args.curves  # checked as -o is: {name} with several scripts
    elif args.output is None:
        raise ScriptError("-o OUT is required (or --curves OUT)")
    if batch:
        for flag, value in (("-o", args.output), ("--gif", args.gif)):
            if value and "{name}" not in value and not _is_dir(value):
                raise ScriptError(f"{flag} {value}: with several scripts it must contain {{name}} or be a directory")
    _format(args, output_path(args.output, Path("script.py"), args.format or "png"))
    if args.step is not None and args.step < 0:
        raise ScriptError("--step must be 0 or more")
    if args.scale <= 0:
        raise ScriptError("--scale must be positive")


def _qt():
    """The pictures' renderers (``widgets.export.headless``), loaded with Qt the first time one is drawn."""
    from widgets.export import headless  # Qt loads only when exporting: a summary or JSON run never needs it

    return headless


def _export_storage(args, script: Path, trace) -> tuple[list[str], list[str]]:
    """``--storage NAME``: the Storage view of one tensor, in the print look."""
    qt = _qt()
    out = output_path(args.output, script, args.format or "png")
    fmt = _format(args, out)
    if fmt not in ("png", "svg", "pdf"):
        raise ScriptError(f"-o {args.output}: the storage view exports as .png, .svg or .pdf")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        qt.export_storage(trace, args.storage, out, fmt, scale=args.scale)
    except qt.StorageExportError as exc:
        raise ScriptError(f"--storage {args.storage}: {exc}") from None
    warnings = [f"the script raised {trace.error.type}: {trace.error.message}"] if trace.error else []
    return [f"{out}: storage of {args.storage}"], warnings


def _text(template: str | None, script: Path, call: CallInfo) -> str | None:
    if template is None:
        return None
    return template.replace("{name}", safe_name(script)).replace("{call}", str(call.index))


def _export_one(args, script: Path, batch: bool) -> tuple[list[str], list[str]]:
    """Run ``script`` and write its outputs: (lines written, warnings about the script)."""
    if not script.is_file():
        raise ScriptError("no such file")
    if getattr(args, "memory", False):
        return _export_memory(args, script)
    if getattr(args, "curves", None):
        return _export_curves(args, script)
    index = 0 if args.call is None else args.call
    forward = bool(getattr(args, "forward_frames", None))
    want_steps = args.step is not None or bool(args.frames) or (bool(args.gif) and not forward)
    steps: list[dict] = []

    def on_event(event) -> None:
        if isinstance(event, protocol.Step) and event.call == index:
            steps.append(event.record)

    # Qt and the renderers load while the worker runs the script, not after it.
    loader = threading.Thread(target=importlib.import_module, args=("widgets.export.headless",), daemon=True)
    loader.start()
    # The outputs are written while the worker's process exits (it is waited for at the end).
    with capture_run(str(script), device=args.device, mode=args.mode, timeout=args.timeout,
                     load=load_options(args), on_event=on_event if want_steps else None, nan_check=args.nan_check,
                     step={"call": index, "mode": "all"} if want_steps else None,
                     # only a JSON export keeps the memory samples
                     memory_rate=None if _format(args, output_path(args.output, script, args.format or "png"))
                     == "json" else 0,
                     **worker_options(args)) as result:
        loader.join()
        return _write_outputs(args, script, batch, result.trace, index, steps, want_steps)


def _write_outputs(args, script: Path, batch: bool, trace: Trace, index: int, steps: list[dict],
                   want_steps: bool) -> tuple[list[str], list[str]]:
    """Write the graph (and frames, GIF) of call ``index`` of ``trace``: (lines written, warnings)."""
    if args.storage:
        return _export_storage(args, script, trace)
    link_nested(trace.calls)  # a checkpoint node lists the backward run inside it
    call, notes, warnings = _pick_call(trace, index)
    if want_steps and not steps:
        raise ScriptError(f"call #{index} ran no backward step to draw (it was never backwarded)")
    if want_steps and call.index != index:
        raise ScriptError(f"call #{index} was kept as a summary only, so its steps cannot be drawn")
    qt = _qt()
    export_call, export_frames, export_gif, strip_call = qt.export_call, qt.export_frames, qt.export_gif, qt.strip_call
    states = edge_texts = None
    if args.step is not None:
        if args.step > len(steps):
            raise ScriptError(f"--step {args.step}: call #{call.index} has only {len(steps)} steps")
        view = step_view(call, steps, upto=args.step)
        states, edge_texts = view.states, step_texts(call, view)
    out = output_path(args.output, script, args.format or "png")
    fmt = _format(args, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    title, caption = _text(args.title, script, call), _text(args.caption, script, call)
    collapsed = frozenset() if args.expand else None
    if fmt == "json":  # the whole trace, or only the call asked for
        export_call(call, out, "json", trace=trace if args.call is None else strip_call(trace, call))
    else:
        export_call(call, out, fmt, theme=args.theme, title=title, caption=caption, states=states,
                    edge_texts=edge_texts, collapsed=collapsed, show_saved=args.saved, show_shapes=args.shapes,
                    values=args.values, slots=args.slots, color_by=args.color_by,
                    scale=args.scale, background="transparent" if args.transparent else None,
                    direction=args.direction, page=args.page, trace=trace)  # a failed run: titled by its error
    done = [f"{script}: {n}" for n in notes] + [f"{out}: call #{call.index} ({call.api}), {len(call.nodes)} nodes"]
    if getattr(args, "forward_frames", None):
        done += _forward_outputs(args, script, batch, call, dict(theme=args.theme, title=title, collapsed=collapsed,
                                                                 show_shapes=args.shapes))
    if args.frames or (args.gif and not getattr(args, "forward_frames", None)):
        frame_opts = dict(theme=args.theme, title=title, collapsed=collapsed, show_shapes=args.shapes)
        gif = output_path(args.gif, script, "gif") if args.gif else None
        if args.frames:
            frames_dir = Path(args.frames.replace("{name}", safe_name(script)))
            if batch and "{name}" not in args.frames:
                frames_dir = frames_dir / safe_name(script)
            paths = export_frames(call, steps, frames_dir, **frame_opts)
            done.append(f"{frames_dir}: {len(paths)} frames")
            if gif is not None:
                gif.parent.mkdir(parents=True, exist_ok=True)
                export_gif(paths, gif, args.duration)
        elif gif is not None:
            gif.parent.mkdir(parents=True, exist_ok=True)
            export_gif(call, gif, args.duration, steps=steps, **frame_opts)
        if gif is not None:
            done.append(f"{gif}: {len(steps)} frames")
    return done, warnings


def _forward_outputs(args, script: Path, batch: bool, call: CallInfo, options: dict) -> list[str]:
    """``--forward-frames DIR`` (and its ``--gif`` without ``--frames``): the forward replay of ``call``."""
    frames_dir = Path(args.forward_frames.replace("{name}", safe_name(script)))
    if batch and "{name}" not in args.forward_frames:
        frames_dir = frames_dir / safe_name(script)
    gif = output_path(args.gif, script, "gif") if args.gif and not args.frames else None
    return _qt().write_forward_frames(call, frames_dir, gif, args.duration, **options)


def _export_memory(args, script: Path) -> tuple[list[str], list[str]]:
    """Run ``script`` (and ``--reference``) and write the memory chart."""
    qt = _qt()
    out = output_path(args.output, script, args.format if args.format in ("png", "svg") else "svg")
    if out.suffix.lower() not in (".png", ".svg"):
        raise ScriptError(f"-o {args.output}: a memory chart is written as .png or .svg")
    trace = run_capture(str(script), device=args.device, mode=args.mode, timeout=args.timeout,
                        load=load_options(args)).trace
    reference, label = None, ""
    if args.reference:
        ref_path = Path(args.reference)
        if not ref_path.is_file():
            raise ScriptError(f"--reference {args.reference}: no such file")
        reference = run_capture(str(ref_path), device=args.device, mode=args.mode, timeout=args.timeout).trace.memory
        label = ref_path.stem
    try:
        qt.export_samples(trace.memory, out, reference=reference, reference_label=label, theme=args.theme,
                       fit_call=args.call)
    except qt.MemoryExportError as exc:
        raise ScriptError(str(exc)) from exc
    warnings = []
    if trace.error is not None:
        warnings.append(f"the script raised {trace.error.type}: {trace.error.message.splitlines()[0]}; "
                        "exported the memory recorded until then")
    return [f"{out}: memory chart, {len(trace.memory)} samples" + (f", beside {label}" if label else "")], warnings


def _export_curves(args, script: Path) -> tuple[list[str], list[str]]:
    """Run ``script`` and write the curves of its loop (``widgets.panels.curves``)."""
    qt = _qt()
    out = output_path(args.curves, script, args.format if args.format in ("png", "svg") else "png")
    if out.suffix.lower() not in (".png", ".svg"):
        raise ScriptError(f"--curves {args.curves}: the curves are written as .png or .svg")
    trace = run_capture(str(script), device=args.device, mode=args.mode, timeout=args.timeout,
                        load=load_options(args), memory_rate=0).trace
    try:
        qt.export_trace_curves(trace, out, theme=args.theme)
    except qt.CurvesExportError as exc:
        raise ScriptError(str(exc)) from exc
    shown = [s for s in loop_curves(trace).series if s.shown]
    warnings = [f"the script raised {trace.error.type}: {trace.error.message.splitlines()[0]}; "
                "exported the calls recorded until then"] if trace.error is not None else []
    return [f"{out}: curves of {', '.join(s.key for s in shown)} over {len(trace.calls)} calls"], warnings


def _pick_call(trace: Trace, index: int) -> tuple[CallInfo, list[str], list[str]]:
    """The call to export, notes, and warnings (the script raised after the graph was captured)."""
    notes, warnings = [], []
    call = next((c for c in trace.calls if c.index == index), None)
    err = trace.error
    why = f"{err.type}: {err.message.splitlines()[0] if err.message else ''}" if err else ""
    if err is not None and err.line:
        why += f" ({err.where or f'line {err.line}'})"  # a notebook's error is at "cell 4, line 2"
    if call is None:
        made = trace.call_count or len(trace.calls)
        if err is not None and not trace.calls:
            raise ScriptError(f"the script failed before any backward call: {why}")
        reason = f"; the script failed: {why}" if err else ""
        raise ScriptError(f"there is no backward call #{index} ({made} call(s) made{reason})")
    if not call.nodes and call.same_as:
        first = next((c for c in trace.calls if c.id == call.same_as), None)
        if first is None or not first.nodes:
            raise ScriptError(f"call #{index} was kept as a summary only; export an earlier call")
        notes.append(f"call #{index} has the same graph as call #{first.index}; exported that one")
        call = first
    if not call.nodes:
        raise ScriptError(f"call #{index} has no autograd graph to draw")
    if err is not None:
        warnings.append(f"the script raised {why}; exported the graph as captured")
    return call, notes, warnings
