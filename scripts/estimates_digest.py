"""Print one digest of many estimates, so that a change meant to keep every byte can be checked.

The estimates: every committed measurement record's scenario, and N seeded random scenarios over the
presets and the training options, each on CUDA and on the CPU. The JSON of every estimate goes through one
SHA-256; `--out FILE` also writes the JSON lines, for a diff when the digests differ. The names of calc's
modules that the components cite as their source (`calc.memory.engine`) are left out of the digest unless
`--exact` is given, so that moving a function between modules keeps the digest.

    python scripts/estimates_digest.py            # the digest of 338 records + 1,500 random scenarios, x 2 targets
    python scripts/estimates_digest.py --out /tmp/before.jsonl

Only the package's public entry points are used (calc.engine.estimate, calc.scenario.Scenario, calc.presets).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import ValidationError  # noqa: E402

from calc.contract.errors import UserError  # noqa: E402
from calc.engine import estimate  # noqa: E402
from calc.evidence.validate import load_all  # noqa: E402
from calc.presets import model_presets  # noqa: E402
from calc.scenario import Scenario  # noqa: E402

GPUS = ["a100-80gb", "h100-sxm", "rtx-4090", "l4", "mi300x"]
MODULE_NAME = re.compile(r"\bcalc(\.\w+)+")
SMALL_MODELS = ["gpt2", "pythia-160m", "qwen2.5-0.5b", "llama-3.2-1b", "gemma-3-1b", "qwen2.5-1.5b"]


def random_scenario(rng: random.Random, models: list[str]) -> dict:
    """A scenario drawn over the options the engine branches on; invalid combinations are skipped by the caller."""
    model = rng.choice(models if rng.random() < 0.5 else SMALL_MODELS)
    training = {
        "micro_batch_size": rng.choice([1, 2, 4, 8]),
        "seq_len": rng.choice([128, 512, 1024, 2048, 4096]),
        "gradient_accumulation_steps": rng.choice([1, 4]),
        "precision": rng.choice(["fp32", "bf16", "amp-bf16", "amp-fp16", "bf16-mixed", "fp16-mixed"]),
        "optimizer": rng.choice(["adamw", "adamw", "sgd", "adamw-8bit", "adafactor"]),
        "optimizer_impl": rng.choice(["foreach", "fused", "for-loop"]),
        "activation_checkpointing": rng.choice(["none", "full", "selective"]),
        "checkpoint_every": rng.choice([1, 2]),
        "attention": rng.choice(["eager", "sdpa"]),
        "zero_stage": rng.randint(0, 3),
        "sharding": rng.choice(["deepspeed", "deepspeed", "fsdp2", "torch"]),
        "offload_optimizer": rng.choice(["none", "none", "cpu"]),
        "tensor_parallel": rng.choice([1, 1, 2]),
        "cross_entropy": rng.choice(["standard", "liger-fused"]),
    }
    if rng.random() < 0.3:
        training["lora"] = {"rank": rng.choice([8, 16, 64]), "targets": rng.choice(["all-linear", "attention"]),
                            "base_weights": rng.choice(["bf16", "int8", "nf4"])}
    return {"model": model, "mode": rng.choice(["train", "train", "inference"]), "training": training,
            "hardware": {"gpu": rng.choice(GPUS), "num_gpus": rng.choice([1, 2, 8])}}


def scenarios(count: int, seed: int) -> list[Scenario]:
    out = [r.scenario for r in load_all()]
    rng = random.Random(seed)
    models = sorted(model_presets())
    while len(out) < len(load_all()) + count:
        try:
            out.append(Scenario.model_validate(random_scenario(rng, models)))
        except (ValidationError, UserError, ValueError):
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=1500, help="random scenarios besides the records")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", type=Path, help="also write every estimate's JSON, one a line")
    ap.add_argument("--exact", action="store_true", help="keep the module names the sources cite")
    args = ap.parse_args()
    digest, lines = hashlib.sha256(), []
    for sc in scenarios(args.random, args.seed):
        for target in ("cuda", "cpu"):
            try:
                text = estimate(sc, target=target).model_dump_json()
            except UserError as e:
                text = "UserError: " + str(e)
            if not args.exact:
                text = MODULE_NAME.sub("calc.<module>", text)
            digest.update(text.encode() + b"\n")
            lines.append(text)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} estimates, sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
