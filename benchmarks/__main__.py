"""Run every benchmark that needs no GPU: ``python -m benchmarks``."""

from benchmarks import daemon, kernel_cells

daemon.main()
print()
kernel_cells.main([])
