"""Runs a plain-Python script under ``core.worker.line_stops`` and prints where it stopped, as JSON.

Run by ``tests/core/worker/test_line_stops.py`` (and ``bench/bench_line_stops.py``) with each Python it finds (torch-free, so any
CPython 3.10+ can run it): ``python line_stops_run.py '{"script": ..., "lines": [...], "answers": [...]}'``.
The call tracer below stands in for the capture's name tracer: for each new frame of the script it
asks the stops' hook, as ``core.worker.capture.names.NameTable.tracer`` does.

An answer is what the user does at a pause: ``step over`` / ``step into`` / ``step out``,
``continue``, ``stop`` (the run ends with KeyboardInterrupt), ``clear`` (no breakpoints, continue)
or ``add N`` (a breakpoint on line N set while paused, as from the app's other thread, then continue).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from core.worker.line_stops import LineStops  # noqa: E402


class Stops(LineStops):
    def __init__(self, script: str, lines, answers, monitoring):
        super().__init__(script, lambda f: f.f_code.co_filename == script, monitoring)
        self.lines = frozenset(lines)
        self.answers = list(answers)
        self.seen: list[list] = []
        self.hook = None

    def breakpoints(self):
        return self.lines

    def install(self, hook):
        self.hook = hook

    def pause(self, frame, reason):
        self.seen.append([frame.f_code.co_name, frame.f_lineno, reason])
        frames, f = [], frame
        while f is not None:
            if self.is_user_frame(f):
                frames.append(f)
            f = f.f_back
        self.watch_stack(frames)
        answer = self.answers.pop(0) if self.answers else "continue"
        kind, _, arg = answer.partition(" ")
        if kind == "stop":
            raise KeyboardInterrupt
        if kind == "clear":
            self.lines = frozenset()
        elif kind == "add":
            self.lines = self.lines | {int(arg)}
            self.watch_running(frame)
        self.go(kind, arg or None, frame)


def main() -> None:
    spec = json.loads(sys.argv[1])
    script = spec["script"]
    stops = Stops(script, spec.get("lines", ()), spec.get("answers", ()), spec.get("monitoring"))
    stops.refresh()

    def plain(frame, event, arg):
        return plain

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == script:
            if stops.hook is not None:
                local = stops.hook(frame)
                if local is not None:
                    return local
            frame.f_trace_lines = False
            return plain
        return None

    code = compile(Path(script).read_text(), script, "exec")
    scope = {"__name__": "__main__"}
    outcome = "finished"
    cpu = time.process_time()
    sys.settrace(tracer)
    try:
        exec(code, scope)
    except KeyboardInterrupt:
        outcome = "stopped"
    finally:
        sys.settrace(None)
        cpu = time.process_time() - cpu
        stops.close()
    print(json.dumps({"python": list(sys.version_info[:2]), "source": stops.source, "seen": stops.seen,
                      "line_events": stops.line_events, "outcome": outcome, "result": scope.get("c"),
                      "cpu_s": cpu}))


if __name__ == "__main__":
    main()
