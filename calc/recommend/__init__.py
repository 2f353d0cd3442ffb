"""Which configurations fit every limit, ranked by estimated tokens/s in two groups (full fine-tuning and
adapters: LoRA / QLoRA); a model x hardware table built by the same search; and the "what to turn on
next" waterfall. One concern per module: models (request and results), combos (what is varied),
search (how the search stays fast is told there), words (labels, explanations, advice), table,
waterfall, cli.
"""


from calc.recommend.cli import cli_main, format_recommendation, load_request
from calc.recommend.combos import Combo, combo_of, enumerate_combos, groups_for, methods_for, scenario_for
from calc.recommend.models import (
    DEFAULT_LORA,
    DEFAULT_QLORA,
    DEFAULT_SAFETY_MARGIN,
    GROUP_LABELS,
    SLOW_FRACTION,
    TABLE_HARDWARE,
    TABLE_MODELS,
    Candidate,
    Group,
    GroupResult,
    Recommendation,
    RecommendRequest,
    SearchStats,
)
from calc.recommend.search import fastest_fitting, recommend
from calc.recommend.table import Table, TableCell, recommendation_table, table_assumptions, table_cell
from calc.recommend.waterfall import WaterfallStep, optimization_waterfall
from calc.recommend.words import label, short_label, speed_ratio_words

__all__ = [
    "DEFAULT_LORA", "DEFAULT_QLORA", "DEFAULT_SAFETY_MARGIN", "GROUP_LABELS", "SLOW_FRACTION", "TABLE_HARDWARE", "TABLE_MODELS", "Candidate", "Combo",
    "Group", "GroupResult", "Recommendation", "RecommendRequest", "SearchStats", "Table", "TableCell",
    "WaterfallStep", "cli_main", "combo_of", "enumerate_combos", "fastest_fitting", "format_recommendation", "groups_for", "label",
    "load_request", "methods_for", "optimization_waterfall", "recommend", "recommendation_table", "table_assumptions", "table_cell", "scenario_for",
    "short_label", "speed_ratio_words",
]
