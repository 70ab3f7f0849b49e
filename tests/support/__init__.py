"""Test helpers shared by the report, record, diff and scenario tests (synthetic runs, normalisers)."""
