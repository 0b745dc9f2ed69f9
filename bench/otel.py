"""What tracing with OpenTelemetry costs per agent step (issue 26).

One thread on SQLite (synchronous FULL) runs ``--steps`` agent steps (a model
call answered by a scripted model, then a no-op ``read_only`` tool call), in
three variants interleaved ``--reps`` times: not instrumented; instrumented
with the OpenTelemetry SDK and a ``BatchSpanProcessor`` over an exporter that
drops the spans (the cost of making and queueing spans, as in production
minus the network); the same with content capture on. It prints the median
time per step of each variant and the difference, then one JSON line per
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's jixu

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from jixu.integrations.otel import instrument, uninstrument  # noqa: E402
from jixu.ledger import SQLiteStore  # noqa: E402
from jixu.threads import Agent, Harness, ScriptedModel, ToolCall, tool  # noqa: E402


class Dropping(SpanExporter):
    """Counts the spans it is given and drops them."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@tool(semantics="read_only")
def noop(step: int) -> str:
    """Do nothing."""
    return "ok"


def one_run(path: Path, steps: int) -> float:
    """Seconds per agent step of one turn of ``steps`` steps."""
    script: list[Any] = [ToolCall("noop", {"step": i}) for i in range(steps)] + ["done"]
    agent = Agent("bench", ScriptedModel(script, name="openai:gpt-4o", keep_calls=False), tools=[noop],
                  max_steps=steps + 2)

    async def main() -> float:
        with SQLiteStore(path) as store:
            thread = await Harness(agent, store).create_thread()
            started = time.perf_counter()
            await thread.send("go")
            state = await thread.wait()
            elapsed = time.perf_counter() - started
            if state.status != "idle":
                raise SystemExit(f"the bench thread ended {state.status}: {state.reason}")
            return elapsed / steps

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="directory for the SQLite files")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {"off": [], "on": [], "on+content": []}
    exported = 0
    with tempfile.TemporaryDirectory(prefix="jixu-otel-", dir=args.dir) as tmp:
        for rep in range(args.reps):
            for variant, variant_times in times.items():
                provider = exporter = None
                if variant != "off":
                    exporter = Dropping()
                    provider = TracerProvider()
                    provider.add_span_processor(BatchSpanProcessor(exporter))
                    instrument(provider, capture_content=variant == "on+content")
                try:
                    variant_times.append(one_run(Path(tmp) / f"{variant}-{rep}.db", args.steps))
                finally:
                    if provider is not None and exporter is not None:
                        uninstrument()
                        provider.shutdown()  # flushes the batch: every span reaches the exporter
                        exported += exporter.count
    medians = {variant: statistics.median(values) * 1e6 for variant, values in times.items()}
    expected = 2 * args.reps * (2 * args.steps + 2)  # per instrumented run: steps x (chat + tool) + last chat + turn
    print(f"{args.steps} agent steps x {args.reps} reps, SQLite FULL; {exported} spans exported "
          f"(expected {expected})")
    figures = [
        ("per agent step, not instrumented", "step_us_off", medians["off"], "us"),
        ("per agent step, OpenTelemetry on", "step_us_on", medians["on"], "us"),
        ("per agent step, OpenTelemetry on, content captured", "step_us_on_content", medians["on+content"], "us"),
        ("what OpenTelemetry adds per agent step", "otel_cost_us_per_step", medians["on"] - medians["off"], "us"),
        ("the same, as a share of the step", "otel_cost_share", (medians["on"] / medians["off"] - 1) * 100, "%"),
    ]
    for label, _metric, value, unit in figures:
        print(f"{label:56} {value:10.1f} {unit}")
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "otel", "metric": metric, "value": round(value, 3), "unit": unit}))
    if exported != expected:
        raise SystemExit(f"{exported} spans were exported, {expected} expected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
