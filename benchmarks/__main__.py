"""Run every benchmark that needs no GPU: ``python -m benchmarks``."""

from benchmarks import daemon

daemon.main()
