"""The round's drafting: a cdef function for the controller, nothing callable from Python."""
