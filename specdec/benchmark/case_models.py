"""The model files of a benchmark case, made on first use: gemma (the default model), its
layer-skip draft, the synthetic bigram MTP targets and their EAGLE-3 and DFlash drafts."""
from __future__ import annotations

from typing import Callable, Optional

from ..models import default_model_path
from .matrix import Case


class CaseModels:
    """Model files per case, made on first use (gemma, its layer-skip draft, bigram MTP)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def target(self, case: Case) -> str:
        if case.model == "bigram":
            from .synthetic import model_for
            return str(model_for(case.size, case.accuracy, case.arch, case.dtype, log=self.log))
        if case.model == "bigram+eagle3":   # the accuracy is the EAGLE-3 draft's
            from .synthetic import EAGLE3_TARGET_ACCURACY, model_for
            return str(model_for(case.size, EAGLE3_TARGET_ACCURACY, case.arch, case.dtype,
                                 log=self.log))
        if case.model == "bigram+dflash":   # likewise, the DFlash draft's
            from .synthetic import dflash_target
            return str(dflash_target(case.size, case.dtype))
        return str(default_model_path())

    def draft(self, case: Case) -> Optional[str]:
        if case.model == "bigram+eagle3":
            from .synthetic import eagle3_draft_for
            return str(eagle3_draft_for(self.target(case), case.size, case.accuracy, case.dtype,
                                        log=self.log))
        if case.model == "bigram+dflash":
            from .synthetic import dflash_draft_for
            return str(dflash_draft_for(self.target(case), case.size, case.accuracy, case.dtype))
        if case.model.startswith("layerskip:"):
            from ..drafters.layerskip import derive_layerskip_gguf
            return str(derive_layerskip_gguf(self.target(case), int(case.model.split(":")[1])))
        return None
