"""Benchmark helpers: build and run llama.cpp's own reference tools for comparison."""
