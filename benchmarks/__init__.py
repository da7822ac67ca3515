"""Kiwi's performance suite. Every figure is a ratio against a floor measured in the same run;
BENCHMARKS.md holds today's figures and how to reproduce each, and benchmarks/results/ the dated
runs.

``python -m benchmarks`` runs every benchmark that needs no GPU (``make bench``); ``common``
and ``ranges`` are what the runner and the benchmarks share. The benchmarks live by what they
measure: ``daemon/`` (the node daemon), ``fleet/`` (the scheduling policy, in a simulator of
its own), ``lab/`` (kernel and Jupyter server), ``shim/`` (the CUDA shim, and the GPU check).
The direction is benchmarks -> kiwi_jupyter -> nodeside; the product never imports this.
"""
