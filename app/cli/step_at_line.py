"""``main.py step SCRIPT --at-line N``: the graph alive the first time line N is about to run, headless.

The script runs as a debug run with one forward breakpoint that pauses once without waiting
(``Run.debug["at_line"]``, ``core.worker.forward_pause``): the worker sends the live graph there
(``forward_paused``) and the script runs on to its end. The graph is written as a call is written in
a trace (api "live"), with the pause's line, function and stack; a line the script never reaches is
an error that names it. In a notebook, ``N`` may be ``CELL:LINE`` (``app.cli.commands``), and the
pause is named by its cell and line too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.client.handle import capture_run
from core.model.trace_json import call_from_dict
from core.programs.notebook import locate, notebook_script, where
from core.protocol import messages as protocol

FORMAT = "backprop-studio-live"


def step_at_line(args, line: int, options: dict, load: dict) -> int:
    """Run ``args.script`` to ``line`` and report the live graph there; the exit status."""
    script = Path(args.script)
    paused: list[protocol.ForwardPaused] = []

    def on_event(event: protocol._Base) -> None:
        if isinstance(event, protocol.ForwardPaused) and not paused:
            paused.append(event)

    debug = {"lines": [line], "pause_all": False, "at_line": True}
    with capture_run(str(script), device=args.device, mode=args.mode, timeout=args.timeout, on_event=on_event,
                     debug=debug, load=load, **options) as result:
        trace = result.trace
    for error in result.bad_messages:
        print(f"backprop-studio: warning: {error}", file=sys.stderr)
    cells = notebook_script(script).cells if script.suffix.lower() == ".ipynb" else []
    if not paused:
        reason = f"; the script ended with {trace.error.type}: {trace.error.message}" if trace.error else ""
        named = f"{where(cells, line)} (line {line} of the whole script)" if cells else f"line {line}"
        print(f"backprop-studio step: {named} of {script.name} was never reached{reason}", file=sys.stderr)
        return 1
    pause = paused[0]
    call = call_from_dict(pause.graph)
    doc = {"format": FORMAT, "version": 1, "script": str(script.resolve()), "line": pause.line,
           "function": pause.function, "module": pause.module, "stack": pause.stack, "seeds": trace.seeds,
           "call": pause.graph}
    in_program = not pause.stack or pause.file == pause.stack[0]["file"]  # not a file the program imports
    located = locate(cells, pause.line) if in_program else None
    if located is not None:
        doc["cell"], doc["cell_line"] = located
    if args.json:
        Path(args.json).write_text(json.dumps(doc), encoding="utf-8")
    named = [t for t in call.tensors if t.name]
    at = f"{where(cells, pause.line)} (script line {pause.line}, {pause.function})" if located is not None \
        else f"line {pause.line} ({pause.function})"
    print(f"before {at}: {len(call.nodes)} node(s), {len(named)} live tensor(s)")
    for node in call.nodes:
        print(f"  {node.id:>6}  {node.name:<28} {node.label or ''}")
    for t in named:
        grad = f" grad_fn={t.grad_fn_name}" if t.grad_fn_name else ""
        print(f"  {t.name:<20} {t.dtype} {list(t.shape)} requires_grad={t.requires_grad}{grad}")
    if args.json:
        print(f"live graph written to {args.json}")
    return 0
