"""The JSON-lines event record: a header line, then one line per decision event.

File layout (UTF-8, one JSON object per line):

    {"schema": "graphdiag-events", "version": 1, "graphdiag_version": "0.1.0", "backend": "sim", ...}
    {"kind": "step_started", "step": 0, "split": -1, "key": 0, "uid": 0, "t_ns": 1200, ...}
    ...

header.py: the schema name and `RunHeader`; write.py: `JsonlWriter` (the sink), `write_record`,
`open_output`; read.py: `read_record`. Re-exported flat.
"""

from .header import SCHEMA_NAME, RunHeader, as_header
from .read import read_record
from .write import JsonlWriter, open_output, write_record
