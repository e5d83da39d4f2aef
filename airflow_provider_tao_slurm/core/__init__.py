"""Pure domain layer: no Airflow imports and no I/O (network, processes, files).

Everything here is deterministic and unit tested with tables and golden files.
"""
