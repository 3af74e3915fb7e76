"""Benchmarks of specdec against plain decoding, llama.cpp and llama-cpp-python.

``specdec bench`` (``cli``) runs a matrix (``matrix``) with the runner (``runner``),
peers in subprocesses (``peers``, ``llama_tools``, ``lcp_build``), and writes results
JSON and Markdown (``report``), PNG plots (``plots``) and the regression gate
(``compare``). Nothing here is imported by the library itself.
"""
