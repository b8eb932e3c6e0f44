"""Headless commands: ``trace`` (and later ``step``, ``export``), run through the same worker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.client import run_capture
from core.summary import trace_summary


def _trace(args) -> int:
    script = Path(args.script)
    if not script.is_file():
        print(f"backprop-studio: {script}: no such file", file=sys.stderr)
        return 2
    result = run_capture(str(script), device=args.device, mode=args.mode, timeout=args.timeout)
    trace = result.trace
    if args.json:
        trace.save(args.json)
    if result.output and not args.quiet:
        print("--- script output ---")
        print(result.output.rstrip())
        print("---")
    print(trace_summary(trace))
    if args.json:
        print(f"trace written to {args.json}")
    return 1 if trace.error else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="backprop-studio", description="Backprop Studio headless commands")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("trace", help="run a script in a worker and summarise every autograd graph it builds")
    p.add_argument("script")
    p.add_argument("--device", default="cpu", help="cpu, cuda:N or mps (default cpu)")
    p.add_argument("--json", metavar="OUT", help="write the trace as JSON")
    p.add_argument("--mode", choices=("auto", "script", "model"), default="auto")
    p.add_argument("--timeout", type=float, default=600.0, help="time limit in seconds (default 600)")
    p.add_argument("--quiet", action="store_true", help="do not echo the script's output")
    args = parser.parse_args(argv)
    if args.command == "trace":
        return _trace(args)
    parser.error(f"unknown command {args.command}")
    return 2
