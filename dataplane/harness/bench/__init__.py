"""Benchmarks runnable by anyone (``pdpair-agent bench …``): each compares us with a reference measured
side by side in the same run, and reports machine, versions, absolute rates and the ratio."""
