"""Run every benchmark that needs no GPU: ``python -m benchmarks``."""

from benchmarks import daemon, fleet, kernel_cells, lab

daemon.main()
fleet.main([])
print()
lab.main()
print()
kernel_cells.main([])
