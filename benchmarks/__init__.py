"""Kiwi's performance suite. Every figure is a ratio against a floor measured in the same run;
results are recorded in BENCHMARKS.md with their date and machine."""
