"""Which configurations fit every limit, ranked by estimated tokens/s in two groups (full fine-tuning and
adapters: LoRA / QLoRA); a model x hardware table built by the same search; and the "what to turn on
next" waterfall. One concern per module: models (request and results), combos (what is varied),
search, words (labels, explanations, advice), table, waterfall, cli.

The search enumerates precision, checkpointing granularity, attention kernel, ZeRO stage, offload
targets, tensor/pipeline sizes and the micro-batch / gradient-accumulation split of a requested global
batch (plus 8-bit AdamW, LoRA and QLoRA when the request allows changing the training method), keeps
what fits on the GPU with a safety margin, and ranks by the speed model (calc.speed).

It stays fast by never estimating what cannot win (branch and bound):
1. Speed needs no memory estimate (~15 us), so every combination gets an upper bound first: its best
   tokens/s over all micro-batch sizes. Combinations are visited best bound first, and the search stops
   once `max_candidates` fitting results are at least as fast as the next bound.
2. Memory is monotone in the micro-batch, so the largest micro-batch that fits is found by bisection
   over the divisors of the per-replica batch (log2 of their count estimates, not all of them).
3. Dominated combinations are skipped without an estimate: eager attention (more memory and slower than
   SDPA/FlashAttention in every case), NVMe offload where CPU offload fits (same GPU memory, slower),
   ZeRO stages on one data-parallel rank without offload (nothing to shard), and whole groups whose most
   frugal member (full checkpointing, everything offloaded, micro-batch 1) does not fit.
4. Every memory estimate is cached by its exact configuration.
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
