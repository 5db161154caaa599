"""Models by name (GPT-3, PTD-P's Table 1, Llama 3) or by their numbers, and layouts as text.

EN model presets · RU готовые модели · ZH 预设模型

Each preset with its source:

- ``gpt3-*``: GPT-3 (Brown et al. 2020, arXiv 2005.14165, Table 2.1): layers, d_model,
  heads; n_ctx 2048; the GPT-2 vocabulary 50257 padded to 51200 as Megatron-LM pads it
  (PTD-P's V).  Table 2.1's 13B d_model "5140" is 5120 (40 heads of 128).
- ``ptdp-*``: the ten models of PTD-P's Table 1 (Narayanan et al. 2021, arXiv
  2104.04473; Megatron-LM examples/sc21/run_table_1.sh): h, a, l; s 2048, V 51200.
- ``llama3-8b``, ``llama3-70b``, ``llama3-405b``: Llama 3 (Dubey et al. 2024, "The Llama 3
  Herd of Models", arXiv 2407.21783, Table 3): layers, width, FFN width, heads, 8
  key/value heads (GQA), vocabulary 128,256 (128K), SwiGLU, untied embeddings, RMSNorm,
  rotary positions; sequence 8192 (the pre-training length).

A model by its numbers: ``layers=96,hidden=12288,heads=96,seq=2048,vocab=51200``, with
optional ``ffn=`` (default 4·hidden), ``kv_heads=`` and ``swiglu`` (then Llama-style:
GQA, SwiGLU, no biases, untied head).
"""

from __future__ import annotations

from minipar.plan.layouts import Layout, ModelSpec, gpt_model, llama_model

_GPT3 = {"gpt3-125m": (12, 768, 12), "gpt3-350m": (24, 1024, 16), "gpt3-760m": (24, 1536, 16),
         "gpt3-1.3b": (24, 2048, 16), "gpt3-2.7b": (32, 2560, 32), "gpt3-6.7b": (32, 4096, 32),
         "gpt3-13b": (40, 5120, 40), "gpt3-175b": (96, 12288, 96)}
_PTDP = {"ptdp-1.7b": (24, 2304, 24), "ptdp-3.6b": (30, 3072, 32), "ptdp-7.5b": (36, 4096, 32),
         "ptdp-18b": (40, 6144, 48), "ptdp-39b": (48, 8192, 64), "ptdp-76b": (60, 10240, 80),
         "ptdp-145b": (80, 12288, 96), "ptdp-310b": (96, 16384, 128),
         "ptdp-530b": (105, 20480, 128), "ptdp-1t": (128, 25600, 160)}
_LLAMA3 = {"llama3-8b": (32, 4096, 14336, 32, 8), "llama3-70b": (80, 8192, 28672, 64, 8),
           "llama3-405b": (126, 16384, 53248, 128, 8)}
MODEL_PRESETS: tuple[str, ...] = (*_GPT3, *_PTDP, *_LLAMA3)


def load_model(spec: str, seq: int | None = None) -> ModelSpec:
    """A preset name (:data:`MODEL_PRESETS`) or ``key=value,...`` numbers; ValueError naming
    the presets when the name is unknown.  ``seq`` overrides the sequence length."""
    s = str(spec).strip().lower()
    if s in _GPT3 or s in _PTDP:
        L, h, a = {**_GPT3, **_PTDP}[s]
        m = gpt_model(L, h, 51200, 2048, heads=a, seq=seq)
        return ModelSpec(**{**m.__dict__, "name": s})
    if s in _LLAMA3:
        L, h, f, a, g = _LLAMA3[s]
        return llama_model(L, h, a, g, f, 128256, 8192 if seq is None else seq, name=s)
    if "=" not in s:
        raise ValueError(f"model: unknown preset {spec!r}; presets: {', '.join(MODEL_PRESETS)}; "
                         "or numbers: layers=96,hidden=12288,heads=96,seq=2048,vocab=51200")
    kv: dict[str, str] = {}
    for part in filter(None, (x.strip() for x in s.split(","))):
        key, _, val = part.partition("=")
        kv[key.strip()] = val.strip() if _ else "on"
    allowed = {"layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "swiglu"}
    bad = sorted(set(kv) - allowed)
    if bad:
        raise ValueError(f"model: unknown key {bad[0]!r}; keys: {', '.join(sorted(allowed))}")
    missing = [x for x in ("layers", "hidden", "heads", "seq", "vocab") if x not in kv]
    if missing:
        raise ValueError(f"model: {missing[0]!r} is missing (give layers, hidden, heads, seq, "
                         "vocab)")
    num = {}
    for key, val in kv.items():
        if key == "swiglu":
            continue
        try:
            num[key] = int(val)
        except ValueError:
            raise ValueError(f"model: {key} must be a whole number, got {val!r}") from None
    if seq is not None:
        num["seq"] = seq
    if "swiglu" in kv or "kv_heads" in kv:
        return llama_model(num["layers"], num["hidden"], num["heads"],
                           num.get("kv_heads", num["heads"]),
                           num.get("ffn", 4 * num["hidden"]), num["vocab"], num["seq"])
    return gpt_model(num["layers"], num["hidden"], num["vocab"], num["seq"], num["heads"],
                     d_ff=num.get("ffn"))


#: the keys of a layout as text, named as minipar names its axes
LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "vp", "mb", "zero", "remat", "sp", "cpkind", "ulysses",
               "overlap", "flash", "placement", "schedule")


def parse_layout(text: str, model: ModelSpec, gpus: int, global_batch: int) -> Layout:
    """``dp=16,tp=8,pp=12,vp=2,mb=1,zero=1,remat=selective,sp=on`` -> a checked Layout.

    Defaults: tp, pp, cp, vp, mb 1; dp = gpus/(tp·pp·cp); zero 0; remat none; sp on
    when tp > 1; cpkind ring (or allgather, Llama 3's, or usp with ``ulysses=U``: U
    Ulysses ranks x cp/U ring groups); overlap on (the data-parallel
    reduction behind backward); flash off; placement tp-inner; schedule 1f1b (or
    DeepSeek-V3's dualpipe, dualpipev: pp stays the pipeline's ranks, dualpipev's stages
    are 2·pp).  m = B/(dp·mb).
    One ValueError line saying what does not divide or fit.
    """
    kv: dict[str, str] = {}
    for part in filter(None, (x.strip() for x in str(text).split(","))):
        if "=" not in part:
            raise ValueError(f"layout: expected key=value, got {part!r} (keys: "
                             f"{', '.join(LAYOUT_KEYS)})")
        key, val = (x.strip().lower() for x in part.split("=", 1))
        if key not in LAYOUT_KEYS:
            raise ValueError(f"layout: unknown key {key!r}; keys: {', '.join(LAYOUT_KEYS)}")
        if key in kv:
            raise ValueError(f"layout: {key} given twice ({kv[key]!r}, then {val!r})")
        kv[key] = val

    def whole(key: str, default: int) -> int:
        if key not in kv:
            return default
        try:
            x = int(kv[key])
        except ValueError:
            x = 0
        if x < 1 and not (key == "zero" and kv[key] == "0"):
            least = "0" if key == "zero" else "1"
            raise ValueError(f"layout: {key} must be a whole number ≥ {least}, got {kv[key]!r}")
        return x

    def flag(key: str, default: bool) -> bool:
        if key not in kv:
            return default
        if kv[key] not in ("on", "off", "1", "0", "true", "false"):
            raise ValueError(f"layout: {key} must be on or off, got {kv[key]!r}")
        return kv[key] in ("on", "1", "true")

    t, p, c, v, b = (whole(x, 1) for x in ("tp", "pp", "cp", "vp", "mb"))
    zero = whole("zero", 0)
    if "dp" in kv:
        d = whole("dp", 1)
    elif gpus % (t * p * c):
        raise ValueError(f"layout: tp·pp·cp = {t * p * c} does not divide the {gpus} GPUs")
    else:
        d = gpus // (t * p * c)
    if d * t * p * c != gpus:
        raise ValueError(f"layout: dp·tp·pp·cp = {d}·{t}·{p}·{c} = {d * t * p * c} is not the "
                         f"{gpus} GPUs")
    if global_batch % (d * b):
        raise ValueError(f"layout: dp·mb = {d}·{b} = {d * b} does not divide the global batch "
                         f"{global_batch}")
    lay = Layout(d, t, p, c, zero, kv.get("remat", "none"), b, global_batch // (d * b),
                 kv.get("placement", "tp-inner"), v, flag("sp", True), flag("overlap", True),
                 kv.get("cpkind", "ring"), flag("flash", False), kv.get("schedule", "1f1b"),
                 whole("ulysses", 1))
    from minipar.plan.layouts import check_layout

    check_layout(model, lay, global_batch=global_batch)
    return lay
