"""Run every benchmark that needs no GPU: ``python -m benchmarks``."""

from benchmarks import daemon, fleet, lab

daemon.main()
fleet.main([])
print()
lab.main()
