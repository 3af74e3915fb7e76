"""The draft lengths of a round: cdef functions for the controller, nothing callable from Python."""
