"""Session and URL state. Every session-state key the app uses is defined here.

The current scenario lives in `st.session_state[SCENARIO]` as a validated `calc.contract.scenario.Scenario`
and in the URL as one short query parameter per non-default field (`?model=llama-2-7b&gpu=rtx-4090
&zero=2`); a Hugging Face config dict travels as `config=` (zlib + base64url JSON). Both directions
go through the pydantic model, so a link reproduces the scenario or fails with a message naming the
field. Query-parameter values are strings; pydantic's lax mode turns "4" into 4 and "1" into True.

Key prefixes: `sc_` the shared scenario widgets (sidebar, every page), `vc_` shared non-widget
state, `cmp_` / `rec_` / `exp_` / `val_` / `explain_` page widgets.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from calc.contract.boundary import decompress, error_message, excerpt, parse_json, problem, short
from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, T_, Lang
from calc.contract.limits import MAX_JSON_BYTES, MAX_URL_PARAM_CHARS
from calc.contract.presets import cluster_presets, gpu_presets
from calc.contract.scenario import FRAMEWORK_DEFAULTS, HardwareConfig, LoraConfig, Offload, Scenario, default_seq_len
from calc.evidence.calibrate import Calibration

# ---- shared, non-widget keys --------------------------------------------------------------
SCENARIO = "vc_scenario"  # the current, validated Scenario
SCENARIO_ERROR = "vc_scenario_error"  # message of the last invalid widget combination, or None
URL_ERROR = "vc_url_error"  # a link that did not validate: shown once, then the default is used
URL_ERROR_SHOWN = "vc_url_error_shown"  # the URL_ERROR this run shows (drawn again with the rest of the page)
CONFIG_FILE_ID = "vc_config_file_id"  # the uploaded config.json already copied into the text area
CONFIG_UPLOAD_ERROR = "vc_config_upload_error"  # (file_id, message) of an upload that did not parse
COMPARE = "vc_compare"  # list[CompareColumn] for the Compare page
SYNC = "vc_sync_widgets"  # set when the scenario changed outside the widgets: re-seed them
PAGE = "vc_page"  # the page of the previous run: on a page switch all widgets are re-seeded
ARRIVED = "vc_arrived"  # True on the first run after arriving at a page (ui.first_screen)
FIRST_SCREEN = "vc_first_screen"  # True when the run stopped after the page's first screen (ui.first_screen)
CALIBRATION = "vc_calibration"  # calc.evidence.calibrate.Calibration from the user's own run, or absent
CALIBRATION_UPLOAD = "vc_calibration_upload"  # file ids of the records already fitted (not refitted on rerun)
CALIBRATION_NONCE = "vc_calibration_nonce"  # bumped by "clear" so that the uploader forgets its file
BROWSER_KEPT = "vc_browser_kept"  # widget keys whose values a reconnected page brought: not re-seeded this run
WIDGET_PREFIXES = ("sc_", "cmp_", "rec_", "exp_", "val_", "explain_", "cal_")

DEFAULT_SCENARIO = Scenario(model="llama-2-7b", hardware=HardwareConfig(gpu="rtx-4090", num_gpus=1))

# Query-parameter name -> path in Scenario.model_dump(). One short name per field.
URL_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("model",),
    "gpu": ("hardware", "gpu"),
    "gpus": ("hardware", "num_gpus"),
    "gpn": ("hardware", "gpus_per_node"),
    "cluster": ("hardware", "cluster"),
    "mem": ("hardware", "memory_bytes"),
    "ram": ("hardware", "cpu_ram_bytes"),
    "nvme": ("hardware", "nvme_bytes"),
    "mode": ("mode",),
    "mbs": ("training", "micro_batch_size"),
    "seq": ("training", "seq_len"),
    "ga": ("training", "gradient_accumulation_steps"),
    "gbt": ("training", "global_batch_tokens"),
    "prec": ("training", "precision"),
    "opt": ("training", "optimizer"),
    "impl": ("training", "optimizer_impl"),
    "ckpt": ("training", "activation_checkpointing"),
    "every": ("training", "checkpoint_every"),
    "attn": ("training", "attention"),
    "zero": ("training", "zero_stage"),
    "shard": ("training", "sharding"),
    "bucket": ("training", "reduce_bucket_size"),
    "off_opt": ("training", "offload_optimizer"),
    "off_par": ("training", "offload_params"),
    "tp": ("training", "tensor_parallel"),
    "pp": ("training", "pipeline_parallel"),
    "sp": ("training", "sequence_parallel"),
    "ep": ("training", "expert_parallel"),
    "keep": ("training", "keep_outputs"),
    "ce": ("training", "cross_entropy"),
    "ce_chunks": ("training", "cross_entropy_chunks"),
    "fw": ("training", "framework"),
    "compile": ("training", "compile"),
    "opt_bwd": ("training", "optimizer_in_backward"),
    "act_off": ("training", "activation_offload"),
    "lora_r": ("training", "lora", "rank"),
    "lora_a": ("training", "lora", "alpha"),
    "lora_t": ("training", "lora", "targets"),
    "lora_d": ("training", "lora", "dropout"),
    "lora_save": ("training", "lora", "modules_to_save"),
    "lora_w": ("training", "lora", "base_weights"),
    "lora_dq": ("training", "lora", "double_quant"),
    "gen": ("inference", "new_tokens"),
    "kv": ("inference", "kv_cache"),
    "wq": ("inference", "weights"),
    "wdq": ("inference", "double_quant"),
}
# parameters whose value is a comma-separated list of module names (lora_t: unless all-linear or attention)
LIST_PARAMS = {"lora_t", "lora_save"}
LORA_FLAG = "lora"  # present (=1) when LoRA is on, even with all-default LoRA settings
CONFIG_PARAM = "config"  # a Hugging Face config dict instead of a preset id
COMPARE_PARAM = "cmp"
CALIBRATION_PARAM = "cal"
MAX_URL_CONFIG_CHARS = 20_000
MAX_URL_CALIBRATION_CHARS = 1_000


class UrlError(UserError):
    """A link's query parameters do not form a valid scenario (worded in either language, calc.contract.errors)."""


# ---- URL <-> Scenario ---------------------------------------------------------------------

def _get(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _to_param(v: Any) -> str:
    if isinstance(v, list | tuple):
        return ",".join(map(str, v))
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def encode_config(config: dict[str, Any]) -> str:
    raw = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def decode_config(text: str) -> dict[str, Any]:
    """config= -> dict, through calc.contract.boundary: the inflated size is bounded before it is allocated
    (a 184-character link can carry gigabytes of zlib output), then depth and numbers."""
    if len(text) > MAX_URL_CONFIG_CHARS:
        raise UrlError(T_("{param}: longer than {n} characters", param=CONFIG_PARAM, n=f"{MAX_URL_CONFIG_CHARS:,}"))
    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise UrlError(T_("{param}: not an encoded config.json (bad base64)", param=CONFIG_PARAM)) from None
    try:
        data = parse_json(decompress(packed, CONFIG_PARAM, MAX_JSON_BYTES), CONFIG_PARAM)
    except UserError as exc:
        raise UrlError(exc.render) from None
    if not isinstance(data, dict):
        raise UrlError(T_("{param}: the config must be a JSON object", param=CONFIG_PARAM))
    return data


def scenario_to_params(sc: Scenario) -> dict[str, str]:
    """Short query parameters for every field that differs from the Scenario's own default."""
    full = sc.model_dump(mode="json")
    # the defaults, unvalidated: a model whose defaults are not a valid scenario (gpt-oss is eager-only)
    ref = Scenario.model_construct(model=sc.model).model_dump(mode="json")
    # the framework's defaults are not repeated: a link without them gets them again (TrainingConfig)
    ref["training"].update(FRAMEWORK_DEFAULTS[sc.training.framework])
    ref["training"]["lora"] = LoraConfig().model_dump(mode="json")
    ref["training"]["seq_len"] = default_seq_len(sc.spec)  # the model's own default (GPT-2: its 1,024 positions)
    out: dict[str, str] = {}
    if isinstance(sc.model, dict):
        out[CONFIG_PARAM] = encode_config(sc.model)
    for name, path in URL_FIELDS.items():
        if path == ("model",):
            if isinstance(sc.model, str):
                out[name] = sc.model
            continue
        if name == "gpus" and sc.hardware.cluster:
            continue  # the cluster states the count
        v = _get(full, path)
        if v is not None and v != _get(ref, path):
            out[name] = _to_param(v)
    if sc.training.lora is not None:
        out[LORA_FLAG] = "1"
    return out


def params_to_scenario(params: dict[str, str]) -> Scenario | None:
    """The scenario a link describes; None when the link has no scenario. UrlError names the field."""
    known = set(URL_FIELDS) | {LORA_FLAG, CONFIG_PARAM}
    if not (known & set(params)):
        return None
    for name in sorted(known & set(params)):
        if name != CONFIG_PARAM and len(params[name]) > MAX_URL_PARAM_CHARS:
            raise UrlError(T_("{param}: longer than {n} characters", param=name, n=MAX_URL_PARAM_CHARS))
    data: dict[str, Any] = {}
    if CONFIG_PARAM in params:
        data["model"] = decode_config(params[CONFIG_PARAM])
    for name, path in URL_FIELDS.items():
        if name not in params or (path == ("model",) and "model" in data):
            continue
        if path[:2] == ("training", "lora") and params.get(LORA_FLAG, "0") in ("0", ""):
            continue
        node = data
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = _from_param(name, params[name])
    if params.get(LORA_FLAG, "0") not in ("0", ""):
        data.setdefault("training", {}).setdefault("lora", {})
    # a link carries the fields it changes; a hand-written one may leave out the model too
    if "model" not in data:  # nor the hardware: the default scenario's, as the sidebar then shows it
        data["model"] = DEFAULT_SCENARIO.model
        data.setdefault("hardware", DEFAULT_SCENARIO.hardware.model_dump(exclude_defaults=True))
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise UrlError(lambda lang, e=exc: validation_message(e, url=True, lang=lang)) from None
    except ValueError as exc:
        raise UrlError(lambda lang, e=exc: error_message(e, lang)) from None


def _from_param(name: str, value: str) -> Any:
    """A list parameter's names (LIST_PARAMS); every other value as written (the scenario validates it)."""
    if name not in LIST_PARAMS or (name == "lora_t" and value in ("all-linear", "attention")):
        return value
    return [part for part in value.split(",") if part]


def validation_message(exc: ValidationError, url: bool = False, lang: Lang = DEFAULT_LANG) -> str:
    """The first problem as 'field: message' (URL parameter names when url=True), in `lang`: a
    validator's own message (calc.contract.errors.UserError) in either language, pydantic's own in English."""
    err = exc.errors()[0]
    loc = tuple(str(p) for p in err["loc"])
    where = ".".join(loc) or "scenario"
    if url:
        for name, path in URL_FIELDS.items():
            if loc[: len(path)] == path:
                where = name
    msg = problem(err, lang)
    return short(f"{where}: {msg}" if where != "scenario" else msg)


def error_text(exc: Exception, lang: Lang | None = None) -> str:
    """One short readable line for any validation problem (never a traceback), in `lang` (by default
    the session's language). Plain text: render it through ui.fmt.literal, it may quote the user's input."""
    if lang is None:
        from ui import language as i18n  # imports streamlit, as _st() does

        lang = i18n.current()
    if isinstance(exc, ValidationError):
        return validation_message(exc, lang=lang)
    return error_message(exc, lang)


# ---- Compare page columns -----------------------------------------------------------------

class CompareColumn(BaseModel):
    """One column of the Compare page: hardware and the sharding/offload that go with it; the
    rest of the scenario comes from the sidebar."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str | None = Field(None, description="cluster preset id; or gpu + num_gpus")
    gpu: str | None = None
    num_gpus: int = Field(1, ge=1, le=65536)
    zero_stage: int = Field(0, ge=0, le=3)
    offload_optimizer: Offload = Offload.none
    offload_params: Offload = Offload.none
    fastest: bool = Field(False, description="use the fastest configuration that fits this hardware "
                                             "(calc.recommend.fastest_fitting) instead of zero_stage / offload")

    @field_validator("cluster", "gpu")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("cluster")
    @classmethod
    def _known_cluster(cls, v: str | None) -> str | None:
        if v is not None and v not in cluster_presets():  # else the page would draw its first cluster instead
            raise UserError(T_("unknown cluster preset {preset}", preset=excerpt(v)))
        return v

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        if v is not None and v not in gpu_presets():  # else the page would draw its first GPU instead
            raise UserError(T_("unknown GPU preset {preset}", preset=excerpt(v)))
        return v

    def hardware(self, host: HardwareConfig | None = None) -> HardwareConfig:
        """The column's hardware; a GPU x count column keeps `host`'s RAM / NVMe per node (the sidebar's),
        a cluster column has its preset's."""
        if self.cluster:
            return HardwareConfig(cluster=self.cluster)
        return HardwareConfig(gpu=self.gpu, num_gpus=self.num_gpus, cpu_ram_bytes=host.cpu_ram_bytes if host else None,
                              nvme_bytes=host.nvme_bytes if host else None)

    def apply(self, base: Scenario) -> Scenario:
        """`base` with this column's hardware, ZeRO stage and offload (ValueError if invalid). With
        `fastest`, only the hardware: the search (ui.compute.column_scenario) chooses the rest."""
        on_hardware = base.variant(hardware=self.hardware(base.hardware))
        if self.fastest:
            return on_hardware
        return on_hardware.with_training(zero_stage=self.zero_stage, offload_optimizer=self.offload_optimizer,
                                         offload_params=self.offload_params)

    def to_param(self) -> str:
        parts = [f"c.{self.cluster}" if self.cluster else f"g.{self.gpu}.{self.num_gpus}", f"z.{self.zero_stage}"]
        if self.offload_optimizer != Offload.none:
            parts.append(f"oo.{self.offload_optimizer.value}")
        if self.offload_params != Offload.none:
            parts.append(f"op.{self.offload_params.value}")
        if self.fastest:
            parts.append("f.1")
        return "~".join(parts)

    @classmethod
    def from_param(cls, text: str) -> CompareColumn:
        if len(text) > MAX_URL_PARAM_CHARS:
            raise UrlError(T_("{param}: a column is longer than {n} characters", param=COMPARE_PARAM,
                              n=MAX_URL_PARAM_CHARS))
        data: dict[str, Any] = {}
        for part in text.split("~"):
            tag, _, rest = part.partition(".")
            if tag == "c":
                data["cluster"] = rest
            elif tag == "g":
                gpu, _, n = rest.rpartition(".")
                data.update(gpu=gpu, num_gpus=n)
            elif tag == "z":
                data["zero_stage"] = rest
            elif tag == "oo":
                data["offload_optimizer"] = rest
            elif tag == "op":
                data["offload_params"] = rest
            elif tag == "f" and rest in ("0", "1"):
                data["fastest"] = rest == "1"
            else:
                raise UrlError(T_("{param}: unknown part {part}", param=COMPARE_PARAM, part=excerpt(part)))
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UrlError(lambda lang, e=exc: f"{COMPARE_PARAM}: {validation_message(e, lang=lang)}") from None


# ---- calibration in the URL ---------------------------------------------------------------
# `cal=v1~g_a100-80gb~n_2~r_1.06_0.005~o_629145600_16777216~x_t_65536_1.7_2e4_3e8~w_-5.2`: the fitted
# numbers only (the per-record table and the GPU's long name stay in the calibration file). Parts:
# g GPU preset, n records, r reserve ratio, o bytes outside the allocator (value, sigma, "a" when
# the sigma is assumed), nccl flag, x residual (t|p, bytes per unit, sigma, rms per token, rms per
# parameter), s residual spread %, w one per disagreeing record (error %).

def _num(v: float) -> str:
    return format(v, ".6g").replace("e+", "e")  # a '+' in a link can come back as a space


def calibration_to_param(cal: Calibration) -> str:
    r, o = cal.reserve_ratio, cal.outside_bytes
    parts = ["v1"] + ([f"g_{cal.gpu}"] if cal.gpu else []) + [f"n_{cal.records}"]
    parts.append(f"r_{_num(r.value)}_{_num(r.sigma)}" + ("" if r.measured_spread else "_a"))
    parts.append(f"o_{round(o.value)}_{round(o.sigma)}" + ("" if o.measured_spread else "_a"))
    if cal.outside_includes_nccl:
        parts.append("nccl")
    if cal.residual is not None:
        x = cal.residual
        parts.append(f"x_{x.scales_with[0]}_{_num(x.bytes_per_unit)}_{_num(x.sigma)}_{_num(x.rms_tokens_bytes)}_"
                     f"{_num(x.rms_parameters_bytes)}")
    elif cal.residual_spread_pct:
        parts.append(f"s_{_num(cal.residual_spread_pct)}")
    parts += [f"w_{_num(d.error_pct)}" for d in cal.disagreements]
    return "~".join(parts)


def _correction(values: list[str]) -> dict[str, Any]:
    if len(values) not in (2, 3) or (len(values) == 3 and values[2] != "a"):
        raise ValueError("expected value_sigma[_a]")
    return {"value": float(values[0]), "sigma": float(values[1]), "measured_spread": len(values) == 2}


def calibration_from_param(text: str) -> Calibration:
    """The calibration a link carries; UrlError names the part that is wrong."""
    if len(text) > MAX_URL_CALIBRATION_CHARS:
        raise UrlError(T_("{param}: longer than {n} characters", param=CALIBRATION_PARAM,
                          n=f"{MAX_URL_CALIBRATION_CHARS:,}"))
    parts = text.split("~")
    if parts[0] != "v1":
        raise UrlError(T_("{param}: unknown version {version}", param=CALIBRATION_PARAM, version=repr(parts[0][:10])))
    data: dict[str, Any] = {"outside_includes_nccl": False, "disagreements": []}
    for part in parts[1:]:
        tag, *values = part.split("_")
        try:
            if tag == "g" and len(values) == 1:
                data["gpu"] = values[0]
            elif tag == "n" and len(values) == 1:
                data["records"] = int(values[0])
            elif tag == "r":
                data["reserve_ratio"] = _correction(values)
            elif tag == "o":
                data["outside_bytes"] = _correction(values)
            elif tag == "nccl" and not values:
                data["outside_includes_nccl"] = True
            elif tag == "x" and len(values) == 5 and values[0] in ("t", "p"):
                data["residual"] = {"scales_with": "tokens" if values[0] == "t" else "parameters",
                                    "bytes_per_unit": float(values[1]), "sigma": float(values[2]),
                                    "rms_tokens_bytes": float(values[3]), "rms_parameters_bytes": float(values[4])}
            elif tag == "s" and len(values) == 1:
                data["residual_spread_pct"] = float(values[0])
            elif tag == "w" and len(values) == 1:
                n = len(data["disagreements"]) + 1
                data["disagreements"].append({"name": f"record {n}", "error_pct": float(values[0])})
            else:
                raise ValueError("unknown part")
        except ValueError as exc:
            raise UrlError(T_("{param}: part {part}: {problem}", param=CALIBRATION_PARAM, part=repr(part[:40]),
                              problem=exc)) from None
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise UrlError(lambda lang, e=exc: f"{CALIBRATION_PARAM}: {validation_message(e, lang=lang)}") from None


DEFAULT_COMPARE: tuple[CompareColumn, ...] = (
    CompareColumn(cluster="1x-rtx-4090", fastest=True),  # opens on what each machine can do
    CompareColumn(cluster="8x-a100-80gb", fastest=True),
)


def compare_to_param(cols: list[CompareColumn]) -> str:
    return "_".join(c.to_param() for c in cols)


def compare_from_param(text: str) -> list[CompareColumn]:
    if len(text) > 4 * (MAX_URL_PARAM_CHARS + 1):
        raise UrlError(T_("{param}: longer than {n} characters", param=COMPARE_PARAM, n=4 * (MAX_URL_PARAM_CHARS + 1)))
    cols = [CompareColumn.from_param(t) for t in text.split("_") if t]
    if not 2 <= len(cols) <= 4:
        raise UrlError(T_("{param}: 2 to 4 columns, got {n}", param=COMPARE_PARAM, n=len(cols)))
    return cols


# ---- session state ------------------------------------------------------------------------

def _st():
    import streamlit as st

    return st


def init_state() -> None:
    """First run of a session: take the scenario (and compare columns) from the URL, else the
    default. Later runs keep what the session has."""
    st = _st()
    ss = st.session_state
    if SCENARIO in ss:
        return
    from ui.language import _  # imports streamlit, as _st() does

    params = {k: st.query_params[k] for k in st.query_params}
    sc = None
    try:
        sc = params_to_scenario(params)
    except UrlError as exc:
        ss[URL_ERROR] = _("The link's scenario is not valid ({problem}); showing the default instead.",
                          problem=error_text(exc))
    ss[SCENARIO] = sc or DEFAULT_SCENARIO
    ss[SCENARIO_ERROR] = None
    ss[SYNC] = True
    ss[BROWSER_KEPT] = widget_keys_from_browser()
    if COMPARE_PARAM in params:
        try:
            ss[COMPARE] = compare_from_param(params[COMPARE_PARAM])
        except UrlError as exc:
            ss[URL_ERROR] = _("The link's comparison is not valid ({problem}); showing the default instead.",
                              problem=error_text(exc))
    if CALIBRATION_PARAM in params:
        try:
            ss[CALIBRATION] = calibration_from_param(params[CALIBRATION_PARAM])
        except UrlError as exc:
            ss[URL_ERROR] = _("The link's calibration is not valid ({problem}); showing uncalibrated predictions.",
                              problem=error_text(exc))


def widget_keys_from_browser() -> frozenset[str]:
    """The keys of the widgets whose values came from the browser with this run. A session's first run
    brings them when the page outlived its session (the server restarted under an open page, as on every
    deploy): the change the user just made is among them, and seeding those widgets from the URL the page
    was opened with would throw it away. Streamlit has no public API for this: its widget states arrive
    keyed by element id, which ends with the widget's key (streamlit.runtime.state.common)."""
    from streamlit.runtime.state.common import is_element_id, user_key_from_element_id
    from streamlit.runtime.state.session_state_proxy import get_session_state

    try:
        ids = list(get_session_state()._state._new_widget_state.states)
    except (AttributeError, RuntimeError):  # not in a script run, or Streamlit's internals moved: nothing kept
        return frozenset()
    keys = (user_key_from_element_id(i) for i in ids if is_element_id(i))
    return frozenset(k for k in keys if k and k.startswith(WIDGET_PREFIXES))


def seed_widget(key: str, value: Any) -> None:
    """Give the widget `key` the value `value` unless it has one, or the browser brought one this run."""
    ss = _st().session_state
    if key not in ss and key not in ss.get(BROWSER_KEPT, ()):
        ss[key] = value


def enter_page(page: str) -> None:
    """Call first on every page. Streamlit gives a widget on another page a new identity, so on a
    page switch the old widget values are dropped here and re-seeded from the session's state."""
    ss = _st().session_state
    ss[ARRIVED] = ss.get(PAGE) != page
    ss[FIRST_SCREEN] = False
    if ss.get(PAGE) is not None:  # the browser's widget values count on a session's first run only
        ss[BROWSER_KEPT] = frozenset()
    if ss[ARRIVED]:
        for k in list(ss.keys()):
            if isinstance(k, str) and k.startswith(WIDGET_PREFIXES):
                del ss[k]
        ss[PAGE] = page


def arrived() -> bool:
    """Whether this run is the first since the session arrived at its page (a new session, a link or the
    navigation); reruns on the same page are not."""
    return bool(_st().session_state.get(ARRIVED))


def get_scenario() -> Scenario:
    init_state()
    return _st().session_state[SCENARIO]


def set_scenario(sc: Scenario, from_widgets: bool = False) -> None:
    """Make `sc` current. From outside the sidebar (a link, a recommendation) the widgets are
    re-seeded on the next run, so call this from a callback or before the sidebar renders."""
    ss = _st().session_state
    ss[SCENARIO] = sc
    ss[SCENARIO_ERROR] = None
    if not from_widgets:
        ss[SYNC] = True


def get_compare() -> list[CompareColumn]:
    ss = _st().session_state
    if COMPARE not in ss:
        ss[COMPARE] = list(DEFAULT_COMPARE)
    return list(ss[COMPARE])


def set_compare(cols: list[CompareColumn]) -> None:
    _st().session_state[COMPARE] = list(cols)


def get_calibration() -> Calibration | None:
    return _st().session_state.get(CALIBRATION)


def set_calibration(cal: Calibration | None) -> None:
    """Make `cal` the session's calibration (None clears it, and the uploader with it)."""
    ss = _st().session_state
    if cal is None:
        ss.pop(CALIBRATION, None)
        ss.pop(CALIBRATION_UPLOAD, None)
        ss[CALIBRATION_NONCE] = ss.get(CALIBRATION_NONCE, 0) + 1
    else:
        ss[CALIBRATION] = cal


def page_params(include_compare: bool = False) -> dict[str, str]:
    """The query parameters that describe the current state (for st.query_params and links)."""
    from ui import language as i18n  # imports streamlit, as _st() does

    out = scenario_to_params(get_scenario())
    if i18n.current() != i18n.DEFAULT_LANG:  # shared links open in the sharer's language
        out[i18n.LANG_PARAM] = i18n.current()
    if include_compare:
        out[COMPARE_PARAM] = compare_to_param(get_compare())
    cal = get_calibration()
    if cal is not None:
        out[CALIBRATION_PARAM] = calibration_to_param(cal)
    return out


def sync_url(include_compare: bool = False) -> None:
    """Write the current state into the URL when it differs (no rerun is triggered)."""
    st = _st()
    want = page_params(include_compare)
    have = {k: st.query_params[k] for k in st.query_params}
    if have != want:
        st.query_params.from_dict(want)
