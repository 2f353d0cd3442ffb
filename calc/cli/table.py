"""python -m calc table [--seq-len N] [--global-batch-tokens N] [--format table|json] [--lang en|zh]: the model x
hardware table (calc.recommend.table) as Markdown in `--lang`, or as JSON (English)."""

from __future__ import annotations

import argparse

from calc.cli.options import lang_option
from calc.recommend.table import recommendation_table
from calc.recommend.workload import TABLE_BATCH_TOKENS, TABLE_GLOBAL_BATCH_TOKENS, TABLE_SEQ_LEN, TABLE_SEQ_LENS


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", type=int, choices=TABLE_SEQ_LENS, default=TABLE_SEQ_LEN, help="tokens per sequence")
    p.add_argument("--global-batch-tokens", type=int, choices=TABLE_BATCH_TOKENS, default=TABLE_GLOBAL_BATCH_TOKENS,
                   help="tokens per optimizer step")
    p.add_argument("--format", choices=["table", "json"], default="table", help="table: Markdown")
    lang_option(p)


def run(args: argparse.Namespace) -> int:
    table = recommendation_table(seq_len=args.seq_len, global_batch_tokens=args.global_batch_tokens)
    print(table.model_dump_json(indent=2) if args.format == "json" else table.to_markdown(args.lang))
    return 0
