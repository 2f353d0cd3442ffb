"""Randomized: 240 random widget combinations across all pages (fixed seed), including malformed text
and binary uploads. Every run must finish with no exception element and no traceback text.

The model x hardware table's workload widgets (rec_seq, rec_batch) are left at their defaults here:
each new workload is a multi-second search, covered once in test_app_recommend.py."""

from __future__ import annotations

import json
import random
import time

from calc.contract.presets import model_presets
from calc.contract.scenario import Scenario
from calc.export import export_deepspeed
from tests.app.test_app_helpers import PAGES, assert_clean, go, open_app
from ui import state

SEED = 20261129
COMBINATIONS = 240
SKIP = {"rec_seq", "rec_batch"}

RADIO = {
    "sc_model_source": ["preset", "config"], "sc_hw_kind": ["gpu", "cluster", "custom"],
    "sc_mode": ["train", "inference"], "cmp_count": [2, 3, 4], "exp_source": ["current", "recommended"],
}
NUMBERS = {
    "sc_mbs": [1, 2, 3, 8, 32, 512], "sc_seq": [1, 64, 512, 2048, 4096, 32768, 262144], "sc_ga": [1, 2, 16],
    "sc_tp": [1, 2, 3, 4, 8], "sc_pp": [1, 2, 3, 4, 80], "sc_every": [1, 2, 5], "sc_lora_rank": [1, 8, 64, 1024],
    "sc_num_gpus": [1, 2, 3, 8, 16, 64, 4096], "sc_mem_gib": [0.5, 8.0, 24.0, 80.0, 4096.0],
    "sc_ram_gib": [0.0, 64.0, 1024.0], "sc_nvme_gib": [0.0, 100.0, 8192.0],
    "exp_lr": [1e-6, 1e-3, 5.0], "exp_wd": [0.0, 0.1], "exp_clip": [0.0, 1.0], "exp_warmup": [0, 100],
    "exp_steps": [0, 1000],
}


def _config_texts() -> list[str]:
    presets = model_presets()
    bad_heads = dict(presets["llama-3.2-1b"].config, num_attention_heads=7)
    return [json.dumps(presets[k].config) for k in ("gpt2", "qwen2.5-0.5b", "mixtral-8x7b", "phi-3-mini")] + [
        "", "{", "[]", "null", '{"model_type": "t5"}', json.dumps(bad_heads), '{"model_type": "llama", "vocab_size": 0}',
        json.dumps({"model_type": "llama", "hidden_size": 10**7, "num_hidden_layers": 10**4}),
    ]


def _ds_texts() -> list[str]:
    sc = Scenario(model="gpt2", training={"zero_stage": 2, "precision": "bf16-mixed", "offload_optimizer": "cpu"})
    return [json.dumps(export_deepspeed(sc).config), "{", '{"zero_optimization": {"stage": 7}}',
            '{"train_batch_size": "auto"}', '{"train_micro_batch_size_per_gpu": 3, "zero_optimization": 5}', ""]


def _record_texts() -> list[str]:
    return ["", "{", '{"schema_version": 1}', "[1, 2]", '{"schema_version": 1}\n{"schema_version": 2}', "\n\n"]


TEXTS = {"sc_config_text": _config_texts(), "exp_import_text": _ds_texts(), "val_paste": _record_texts()}
UPLOADS = [b"\xff\xfe\x00binary", b"{}", b'{"model_type": "llama"}', b"x" * 100]


def _widgets(at):
    out = []
    for kind in ("selectbox", "number_input", "radio", "checkbox", "toggle", "text_area", "text_input", "multiselect",
                 "button"):
        out += [w for w in getattr(at, kind) if w.key and w.key not in SKIP and not w.disabled]
    out += [w for w in at.get("file_uploader") if w.key]
    return out


def _poke(w, rng: random.Random) -> str:
    key = w.key
    if w.type == "selectbox" and ("off_" in key) and rng.random() < 0.6:
        w.select_index(0)  # offload needs ZeRO: keep most combinations valid so the charts get drawn
    elif w.type == "selectbox":
        w.select_index(rng.randrange(len(w.options)))
    elif w.type == "radio":
        w.set_value(rng.choice(RADIO.get(key) or [w.value]))
        if key.startswith("cmp_") and key.endswith("_kind"):
            w.set_value(rng.choice(["cluster", "gpu"]))
    elif w.type == "number_input":
        choices = NUMBERS.get(key) or ([1, 2, 8, 64] if key.startswith("cmp_") else [w.min or 0])
        if key in ("sc_tp", "sc_pp") and rng.random() < 0.5:
            choices = [1]
        lo, hi = (w.min if w.min is not None else -1e18), (w.max if w.max is not None else 1e18)
        w.set_value(min(max(rng.choice(choices), lo), hi))
    elif w.type in ("checkbox", "toggle"):
        w.set_value(rng.random() < (0.25 if key == "sc_sp" else 0.5))
    elif w.type == "text_area":
        w.set_value(rng.choice(TEXTS.get(key, ["", "x"])))
    elif w.type == "text_input":
        w.set_value(rng.choice(["", "/mnt/nvme", "ä" * 300]))
    elif w.type == "multiselect":
        opts = list(w.options)
        w.set_value(rng.sample(opts, rng.randint(0, len(opts))) if opts else [])
    elif w.type == "button":
        w.click()
    elif w.type == "file_uploader":
        w.set_value(None if rng.random() < 0.3 else (f"f{rng.randrange(9)}.json", rng.choice(UPLOADS),
                                                     "application/json"))
    return f"{key}={getattr(w, 'value', '?')!r}"[:120]


def test_random_widget_combinations():
    rng = random.Random(SEED)
    at = open_app()
    page = "calculator"
    log: list[str] = []
    slowest = (0.0, "")
    valid = 0
    t_all = time.perf_counter()
    for i in range(COMBINATIONS):
        if rng.random() < 0.15:
            page = rng.choice(list(PAGES))
            go(at, page)
            log.append(f"-> {page}")
        widgets = _widgets(at)
        main = [w for w in widgets if not w.key.startswith("sc_")]
        pool = main if main and rng.random() < 0.5 else widgets  # page widgets as often as the sidebar's
        for w in rng.sample(pool, min(len(pool), rng.randint(1, 3))):
            log.append(f"{i} {page}: {_poke(w, rng)}")
        t0 = time.perf_counter()
        at.run()
        dt = time.perf_counter() - t0
        slowest = max(slowest, (dt, f"{i} {page}"))
        valid += at.session_state[state.SCENARIO_ERROR] is None
        try:
            assert_clean(at)
        except AssertionError:
            raise AssertionError("after:\n" + "\n".join(log[-12:])) from None
    total = time.perf_counter() - t_all
    print(f"{COMBINATIONS} combinations in {total:.1f} s ({valid} valid scenarios); slowest run "
          f"{slowest[0]:.2f} s ({slowest[1]})")
    assert valid >= COMBINATIONS // 3  # enough of them draw the charts, not only the error message
