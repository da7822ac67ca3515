"""What ``generate`` writes from the table, one module per language: the Python names
(``python``), docs/protocol.md's tables (``markdown``), the shim's C header (``c``) and the
panel's status types (``typescript``). Each is a function of the table alone, returning text."""
