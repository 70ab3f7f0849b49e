"""Everything that reads, judges and shows a run's events, one role per folder (bottom to top):

  record/    the JSON-lines record: its header (the schema), writing it (JsonlWriter) and reading it back
  sources/   where device activity comes from: the simulated driver's modelled timeline, CUPTI
  analysis/  pure functions, events in, data out: summary, diff, what-if, thrash, graph memory, accounting...
  views/     data in, drawing out: the terminal tables, the diff text, the steps table, the plot
  sinks/     fed live from the bus: the terminal report (console), NVTX ranges, the trace-event timeline

Analyses never import a view or a sink, views never import a sink; tests/unit/test_layers.py holds the rule.
"""
