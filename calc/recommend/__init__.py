"""Which configurations fit every limit, ranked by estimated tokens/s in two groups (full fine-tuning and
adapters: LoRA / QLoRA); a model x hardware table built by the same search; and the "what to turn on
next" waterfall. One concern per module: models (request and results), combos (what is varied),
search (how the search stays fast is told there), words (labels, explanations, advice), table and
workload (its axes), waterfall, cli.
"""


import importlib
from typing import Any

# name -> the submodule that defines it. Imported on first use (PEP 562): `python -m calc recommend` needs the
# search, not the table or the waterfall, and every import is paid by a command that runs for a fraction of a second.
_WHERE = {
    "cli": ("cli_main", "format_recommendation", "load_request"),
    "combos": ("Combo", "combo_of", "enumerate_combos", "groups_for", "methods_for", "scenario_for"),
    "models": ("DEFAULT_LORA", "DEFAULT_QLORA", "DEFAULT_SAFETY_MARGIN", "GROUP_LABELS", "SLOW_FRACTION",
               "usable_bytes", "Candidate", "Group", "GroupResult", "Recommendation", "RecommendRequest",
               "SearchStats"),
    "search": ("fastest_fitting", "recommend"),
    "table": ("Table", "TableCell", "recommendation_table", "table_assumptions", "table_cell"),
    "waterfall": ("WaterfallStep", "optimization_waterfall"),
    "words": ("label", "short_label", "speed_ratio_words"),
    "workload": ("TABLE_BATCH_TOKENS", "TABLE_GLOBAL_BATCH_TOKENS", "TABLE_HARDWARE", "TABLE_MODELS", "TABLE_SEQ_LEN",
                 "TABLE_SEQ_LENS"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


__all__ = sorted(_MODULE_OF)  # the names above, each once
