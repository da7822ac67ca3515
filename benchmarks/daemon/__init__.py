"""The node daemon's benchmarks: handoffs with every client waiting against a C relay-ring
floor (``handoff``, with the C harness in ``c/``), the daemon's own work per handoff in-process
(``handoff_core``), a probe under attack (``attack``), a soak (``soak``) and the daemon as
Python clients see it (``python_clients``)."""
