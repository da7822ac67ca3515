"""Run every benchmark that needs no GPU: ``python -m benchmarks``.

The GPU benchmarks (``benchmarks.shim_paging``, ``benchmarks.shim_overhead``) run on their own,
on a machine with an NVIDIA GPU.
"""

from benchmarks import daemon, fleet, kernel_cells, lab, shim_gate

daemon.main()
fleet.main([])
print()
lab.main()
print()
kernel_cells.main([])
print()
shim_gate.main()
