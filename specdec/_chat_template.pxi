# Part of _core (included by _core.pyx): llama.cpp's built-in chat templates (its C++
# renderings, named or recognised by their markers), for chat_template='NAME' and for checking
# Jinja renders against them.

def chat_builtin_templates() -> list:
    """Names of llama.cpp's built-in chat templates (``llama_chat_apply_template``)."""
    cdef int32_t n = llama_chat_builtin_templates(NULL, 0)
    cdef const char ** names = <const char **>malloc(max(n, 1) * sizeof(char *))
    if names == NULL:
        raise MemoryError()
    try:
        llama_chat_builtin_templates(names, n)
        return [(<bytes>names[i]).decode() for i in range(n)]
    finally:
        free(names)


def chat_apply_template(str tmpl, messages, bint add_assistant=True) -> str:
    """``(role, content)`` pairs rendered by llama.cpp's C++ version of a built-in template.

    ``tmpl`` is a name from :func:`chat_builtin_templates`, or a Jinja source that
    llama.cpp maps to one of them by its markers (it does not run Jinja).
    """
    cdef list keep = [_text_bytes(tmpl)]
    cdef vector[llama_chat_message] chat
    cdef llama_chat_message m
    cdef size_t total = 0
    cdef bytes r, c
    for role, content in messages:
        r = _text_bytes(role)
        c = _text_bytes(content)
        if b"\0" in r or b"\0" in c:
            raise ValueError("chat messages must not contain NUL characters")
        keep.append(r)
        keep.append(c)
        total += len(r) + len(c)
        m.role = r
        m.content = c
        chat.push_back(m)
    if b"\0" in keep[0]:
        raise ValueError("a chat template must not contain NUL characters")
    cdef int32_t size = <int32_t>min(2 * total + 1024, 0x3FFFFFFF), n
    cdef vector[char] buf
    while True:
        buf.resize(size)
        n = llama_chat_apply_template(keep[0], chat.data(), chat.size(), add_assistant,
                                      buf.data(), size)
        if n < 0:
            raise ValueError(f"llama.cpp has no built-in chat template for {tmpl[:80]!r} "
                             f"(names: {', '.join(chat_builtin_templates())})")
        if n <= size:
            return buf.data()[:n].decode("utf-8", "replace")
        size = n
