"""Benchmarks (`make bench`): each script runs alone with its size as a parameter."""
