"""Benchmarks of the CUDA shim and the GPU (issue 32's ``benchmarks/shim/``)."""
