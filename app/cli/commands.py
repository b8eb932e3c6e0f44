"""The command line's one parser (the window's ``open`` and ``view``, and the headless commands), and the
headless commands: ``trace``, ``step``, ``export`` and ``hosts``, run through the same worker.

``step`` steps a call in the same run that captures it: its steps, leaf grads and captured call agree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import json
from dataclasses import asdict

from app.cli import export as export_cli
from app.cli.hosts import add_hosts_parser, add_worker_args, hosts_main, worker_options
from app.cli.options import add_run_options, load_options
from app.cli.step_at_line import step_at_line
from app.cli.window_options import add_window_commands
from core.protocol import messages as protocol
from core.client.handle import run_capture
from core.client.run_errors import script_problem
from core.client.launchers import LauncherError
from core.programs.notebook import NotebookError, notebook_script, script_line
from core.programs.notebook import where as line_where
from core.programs.openers import HUGGINGFACE, opener_for
from core.model.grad_health import report as grad_report
from core.model.rank_files import received_trace, save_ranks
from core.model.step_state import short_values
from app.cli.summary import trace_summary
from core.model.trace import Trace, TraceFormatError


def _trace(args) -> int:
    script = Path(args.script)
    problem = None if HUGGINGFACE.accepts(script) else script_problem(script)
    if problem:
        print(f"backprop-studio: {problem}", file=sys.stderr)
        return 2
    if opener_for(script).opens_as_trace:
        print(f"backprop-studio: {script} is a saved trace, not a script: open it with "
              f"'python main.py view {script}'", file=sys.stderr)
        return 2
    ranks: dict[int, object] = {}  # a DDP run's other ranks (protocol.RankTrace), by rank

    def on_event(event: protocol._Base) -> None:
        if isinstance(event, protocol.RankTrace):
            ranks[int(event.rank)] = event.trace

    result = run_capture(str(script), device=args.device, mode=args.mode, timeout=args.timeout,
                         load=load_options(args), on_event=on_event, nan_check=args.nan_check,
                         **worker_options(args))
    trace = result.trace
    _say_bad_messages(result)
    written = save_ranks(Path(args.json), trace, _other_ranks(ranks)) if args.json else []
    if result.output and not args.quiet:
        print("--- script output ---")
        print(result.output.rstrip())
        print("---")
    print(trace_summary(trace))
    if args.grad_norms:
        print(grad_report(trace))
    if len(written) > 1:
        print(f"traces of {len(written)} ranks written: {', '.join(map(str, written))}")
    elif written:
        print(f"trace written to {args.json}")
    return 1 if trace.error else 0


def _other_ranks(ranks: dict[int, object]) -> dict[int, Trace]:
    """The other ranks' traces as the worker sent them; one that cannot be read is named."""
    traces = {}
    for rank, data in sorted(ranks.items()):
        try:
            traces[rank] = received_trace(data)
        except TraceFormatError as exc:
            print(f"backprop-studio: rank {rank}'s trace could not be read: {exc}", file=sys.stderr)
    return traces


def _step(args) -> int:
    script = Path(args.script)
    problem = None if HUGGINGFACE.accepts(script) else script_problem(script)
    if problem:
        print(f"backprop-studio: {problem}", file=sys.stderr)
        return 2
    if args.at_line is not None:  # the graph alive before a line runs, not a backward call
        line = _breakpoint_line(script, args.at_line)
        if isinstance(line, str):
            print(f"backprop-studio step: --at-line {args.at_line}: {line}", file=sys.stderr)
            return 2
        return step_at_line(args, line, worker_options(args), load_options(args))
    steps: list[dict] = []
    info: dict = {}

    def on_event(event: protocol._Base) -> None:
        if isinstance(event, protocol.Step):
            steps.append(event.record)
        elif isinstance(event, (protocol.StepBegin, protocol.StepEnd)):
            info[type(event)] = event

    step = {"call": args.call, "mode": "all"}
    if args.breakpoint is not None:
        line = _breakpoint_line(script, args.breakpoint)
        if isinstance(line, str):
            print(f"backprop-studio step: --breakpoint {args.breakpoint}: {line}", file=sys.stderr)
            return 2
        step["line"] = line
    options = worker_options(args)
    if options.get("ddp"):
        print(f"backprop-studio step: stepping runs the DDP script as one process, rank 0 of a world of 1 "
              f"(as torchrun --nproc_per_node=1 starts it); 'trace --nproc {options['ddp']['nproc']}' "
              f"captures every rank", file=sys.stderr)
    result = run_capture(str(script), device=args.device, mode=args.mode, timeout=args.timeout,
                         on_event=on_event, step=step, load=load_options(args), **options)
    trace = result.trace
    wanted = f"no call was made from {_breakpoint_words(args.breakpoint)}" if args.breakpoint is not None \
        else f"call #{args.call} was never reached"
    _say_bad_messages(result)
    if protocol.StepBegin not in info:
        reason = f"{trace.error.type}: {trace.error.message}" if trace.error else "the script made fewer calls"
        print(f"backprop-studio: {wanted} ({trace.call_count} call(s) made; {reason})", file=sys.stderr)
        return 1
    begin: protocol.StepBegin = info[protocol.StepBegin]
    index = begin.call
    call = next((c for c in trace.calls if c.index == index), None)
    leaf_grads = {k: asdict(v) for k, v in call.leaf_grads.items()} if call is not None else {}
    end: protocol.StepEnd | None = info.get(protocol.StepEnd)
    doc = {
        "format": "backprop-studio-steps",
        "version": 2,
        "script": str(script.resolve()),
        "index": index,
        "api": begin.api,
        "line": begin.line,
        "seeds": trace.seeds,
        "state": end.state if end is not None else None,
        "error": end.error if end is not None else None,
        "steps": steps,
        "leaf_grads": leaf_grads,
        # The call as this same run captured it, before backward (trace format, tensors with values).
        "call": begin.graph,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(doc), encoding="utf-8")
    where = line_where(trace.cells, doc["line"]) if doc["line"] else "end of script"
    print(f"call #{index} ({doc['api']}, {where}): {len(steps)} steps, {doc['state']}")
    for record in steps:
        grads = ", ".join(short_values(g) for g in record.get("grad_inputs") or [])
        incoming = ", ".join(short_values(g) for g in record.get("grad_outputs") or [])
        line = f"  {record['index']:>4}  {record['node']:>6}  {record['name']:<28} in: {incoming}"
        if grads:
            line += f"  out: {grads}"
        for name, values in (record.get("leaf_grads") or {}).items():
            line += f"  {name}.grad = {short_values(values)}"
        if record.get("error"):
            line += f"  FAILED: {record['error'].get('type')}"
        print(line)
    if doc["error"]:
        print(f"backward failed: {doc['error']['type']}: {doc['error']['message'].splitlines()[0]}")
    if args.json:
        print(f"steps written to {args.json}")
    return 1 if doc["error"] else 0


def _breakpoint_line(script: Path, text: str) -> int | str:
    """The script line ``--breakpoint`` names: LINE, or CELL:LINE in a notebook; else why not."""
    cell, _, line = text.rpartition(":")
    if not line.isdigit() or (cell and not cell.isdigit()):
        return "give a line number, or CELL:LINE in a notebook (4:2 is cell 4, line 2)"
    if not cell:
        return int(line)
    if script.suffix.lower() != ".ipynb":
        return f"{script.name} is not a notebook: give its line number"
    try:
        found = script_line(notebook_script(script).cells, int(cell), int(line))
    except NotebookError as exc:
        return str(exc)
    return found if found is not None else f"the notebook has no code cell {cell} with a line {line}"


def _breakpoint_words(text: str) -> str:
    cell, _, line = text.rpartition(":")
    return f"cell {cell}, line {line}" if cell else f"line {line}"


def _say_bad_messages(result) -> None:
    """Worker messages that did not match the protocol, named on stderr (the run went on)."""
    for error in result.bad_messages:
        print(f"backprop-studio: warning: {error}", file=sys.stderr)


SCRIPT_HELP = "a PyTorch script, notebook (.ipynb), saved model or Hugging Face model folder"
DESCRIPTION = """\
Backprop Studio makes PyTorch autograd visible: the graph each backward call walks,
stepping it node by node, tensors and their storage, and memory over the run."""
EPILOG = """\
'backprop-studio SCRIPT [options]' is 'backprop-studio open SCRIPT [options]'; with no
arguments the window opens on a bundled example.
Run 'backprop-studio COMMAND --help' for a command's options."""
HEADLESS = ("trace", "step", "export", "hosts")  # the commands that run without a window


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Lists the commands one per line under "commands:", without argparse's COMMAND line above them."""

    def _format_action(self, action):
        if isinstance(action, argparse._SubParsersAction):
            return "".join(self._format_action(a) for a in action._get_subactions())
        return super()._format_action(action)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per command, the window's (open, view) and the headless ones."""
    parser = argparse.ArgumentParser(prog="backprop-studio", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    add_window_commands(sub)
    p = sub.add_parser("trace", help="run a script and summarise every autograd graph it builds",
                       description="Run a script in a worker and summarise every autograd graph it builds.")
    p.add_argument("script", metavar="SCRIPT", help=SCRIPT_HELP)
    p.add_argument("--json", metavar="OUT", help="write the trace as JSON (with --nproc: the picked rank's; "
                   "each other rank's beside it, OUT's name with .rankN)")
    p.add_argument("--quiet", action="store_true", help="do not echo the script's output")
    p.add_argument("--nan-check", action="store_true",
                   help="check every op's output and every node's gradient for NaN/Inf and name the first "
                   "of each (off by default: it costs a reduction per op)")
    p.add_argument("--grad-norms", action="store_true",
                   help="also print each module's gradient norm per call, the vanishing and exploding "
                   "flags, and the clipping and optimizer steps after each call")
    add_run_options(p)
    add_worker_args(p)
    p = sub.add_parser("step", help="step through one backward call node by node, printing each step",
                       description="Step through one backward call node by node and print every step.")
    p.add_argument("script", metavar="SCRIPT", help=SCRIPT_HELP)
    p.add_argument("--call", type=int, default=0, help="which backward / grad call to step (default 0)")
    p.add_argument("--breakpoint", metavar="LINE",
                   help="step the first call made from this script line (instead of --call); in a notebook, "
                   "CELL:LINE (4:2 is cell 4, line 2) or the line of the whole script")
    p.add_argument("--at-line", metavar="N",
                   help="instead, run to the first time line N is about to run and show the graph alive there; "
                   "in a notebook, CELL:LINE or the line of the whole script")
    p.add_argument("--json", metavar="OUT", help="write the steps, leaf grads and the call as JSON")
    add_run_options(p)
    add_worker_args(p)
    export_cli.add_parser(sub)
    add_hosts_parser(sub)
    return parser


def command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (``open``, ``trace``, ...) within ``parser``."""
    return parser._subparsers._group_actions[0].choices[name]


def window_parser(view: bool = False) -> argparse.ArgumentParser:
    """The one parser's ``open`` (or ``view``) command, which the window parses its arguments with."""
    return command_parser(build_parser(), "view" if view else "open")


def commands(parser: argparse.ArgumentParser) -> list[str]:
    """The command names, in the order --help lists them."""
    return list(parser._subparsers._group_actions[0].choices)


def main(args: argparse.Namespace | list[str]) -> int:
    """Run a headless command: parsed by ``build_parser``, or its words (``["trace", "x.py"]``)."""
    if not isinstance(args, argparse.Namespace):  # --help and refused words exit as argparse does
        args = build_parser().parse_args(list(args))
    try:
        return _dispatch(args)
    except LauncherError as exc:
        print(f"backprop-studio {args.command}: {exc}", file=sys.stderr)
        return 2


def _dispatch(args) -> int:
    if args.command == "hosts":
        return hosts_main(args)
    if args.command == "export":
        return export_cli.main(args)
    if args.command == "trace":
        return _trace(args)
    if args.command == "step":
        return _step(args)
    raise ValueError(f"not a headless command: {args.command}")
