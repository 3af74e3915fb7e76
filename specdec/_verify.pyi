from ._core import Context

class Verifier:
    def __init__(self, ctx: Context) -> None: ...
