"""Sinks and analyses over a run's events: the JSON-lines record, the summary, the terminal report,
the diff of two runs (or two steps), and NVTX ranges. Re-exported flat; each concept lives in its module."""

from .console import ConsoleReporter, render_report, render_summary
from .diff import RunDiff, StepDiff, diff_runs, diff_steps
from .nvtx_sink import NvtxSink
from .record import JsonlWriter, RunHeader, as_header, read_record, write_record
from .summary import Summary, summarize

__all__ = ["ConsoleReporter", "JsonlWriter", "NvtxSink", "RunDiff", "RunHeader", "StepDiff", "Summary",
           "as_header", "diff_runs", "diff_steps", "read_record", "render_report", "render_summary",
           "summarize", "write_record"]
