"""Which configurations fit every limit, ranked by estimated tokens/s in two groups (full fine-tuning and
adapters: LoRA / QLoRA); a model x hardware table built by the same search; and the "what to turn on
next" waterfall. One concern per module: models (request and results), combos (what is varied),
search (how the search stays fast is told there), state (what a search has tried, fitted and timed),
words (labels, explanations, advice), table and workload (its axes), waterfall. Its command lines are
calc.cli.recommend and calc.cli.table.

May import calc.contract, calc.sim, calc.memory and calc.speed; never calc.export, calc.evidence or calc.cli.
"""

from calc.recommend.combos import Combo, combo_of, enumerate_combos, groups_for, methods_for, scenario_for
from calc.recommend.models import (
    DEFAULT_LORA,
    DEFAULT_QLORA,
    DEFAULT_SAFETY_MARGIN,
    GROUP_LABELS,
    SLOW_FRACTION,
    Candidate,
    Group,
    GroupResult,
    Recommendation,
    RecommendRequest,
    SearchStats,
    usable_bytes,
)
from calc.recommend.search import fastest_fitting, recommend
from calc.recommend.table import Table, TableCell, recommendation_table, table_assumptions, table_cell
from calc.recommend.waterfall import WaterfallStep, optimization_waterfall
from calc.recommend.words import label, per_gpu_at, per_step_words, short_label, speed_ratio_words
from calc.recommend.workload import (
    TABLE_BATCH_TOKENS,
    TABLE_GLOBAL_BATCH_TOKENS,
    TABLE_HARDWARE,
    TABLE_MODELS,
    TABLE_SEQ_LEN,
    TABLE_SEQ_LENS,
)

__all__ = [
    "DEFAULT_LORA", "DEFAULT_QLORA", "DEFAULT_SAFETY_MARGIN", "GROUP_LABELS", "SLOW_FRACTION", "TABLE_BATCH_TOKENS",
    "TABLE_GLOBAL_BATCH_TOKENS", "TABLE_HARDWARE", "TABLE_MODELS", "TABLE_SEQ_LEN", "TABLE_SEQ_LENS", "Candidate",
    "Combo", "Group", "GroupResult", "Recommendation", "RecommendRequest", "SearchStats", "Table", "TableCell",
    "WaterfallStep", "combo_of", "enumerate_combos", "fastest_fitting", "groups_for", "label", "methods_for",
    "optimization_waterfall", "per_gpu_at", "per_step_words", "recommend", "recommendation_table", "scenario_for", "short_label",
    "speed_ratio_words", "table_assumptions", "table_cell", "usable_bytes",
]
