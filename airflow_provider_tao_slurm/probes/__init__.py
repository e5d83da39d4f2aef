"""Programs the provider stages to the cluster and runs there (standard library only; read as package data)."""

from __future__ import annotations
