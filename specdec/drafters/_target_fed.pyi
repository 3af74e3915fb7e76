from ._base import Drafter

class TargetFedDrafter(Drafter):
    def synced(self, seq: int = 0) -> int: ...
