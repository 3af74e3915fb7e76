"""A single request's verify batches kept to one shape where a new shape is dear (a CUDA
graph is captured per shape); its functions are C-level, called by the controller, and
``specdec._checks.steady_rows`` sets them for tests."""
