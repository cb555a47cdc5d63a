"""The QA job from Python: relokv_rag's run, its figures as Python objects.

    import relokv
    result = relokv.rag.run(model="smollm2", variants=["naive", "epic"], requests=4)
    for v in result.variants:
        print(v.name, v.work_pct, v.first_token_kl.mean, v.agreement_pct.mean)
    result.to_pandas()          # one row a variant (pandas is optional)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from . import _relokv

__all__ = ["Estimate", "Variant", "RunResult", "run", "default_data"]


@dataclass(frozen=True)
class Estimate:
    """A mean over the requests with its bootstrap 95% interval [lo, hi]."""

    mean: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Variant:
    """One variant's row of relokv_rag's table, and its per-request values.

    Percentages are in percent; first_token_kl and answer_kl in nats, against full recompute
    (the first variant). ``requests`` maps a measure (ttft_ms, computed, work, first_token_kl,
    answer_kl, agreement, tf_agreement, em, f1, prompt_tokens) to its per-request list.
    """

    name: str
    key: str
    note: str
    ttft_p50_ms: float
    ttft_p95_ms: float
    computed: float
    work_pct: float
    exact_pct: float
    relocated_pct: float
    requests_per_s: float
    kv_mib: float
    first_token_kl: Estimate
    answer_kl: Estimate
    agreement_pct: Estimate
    em_pct: Estimate
    f1_pct: Estimate
    tf_agreement_pct: Estimate
    f1_over_full: Estimate
    identical_pct: float
    escalated_pct: float
    requests: dict = field(repr=False)


@dataclass(frozen=True)
class RunResult:
    """What relokv.rag.run measured: one Variant each, full recompute first."""

    variants: list
    source: str
    model: str
    synthetic: bool

    def __getitem__(self, key: str) -> Variant:
        """The variant of that key (full, naive, epic, ...)."""
        for v in self.variants:
            if v.key == key:
                return v
        raise KeyError(key)

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame, one row a variant (needs pandas)."""
        import pandas as pd  # optional dependency

        rows = []
        for v in self.variants:
            row = {}
            for name, value in vars(v).items():
                if name == "requests":
                    continue
                if isinstance(value, Estimate):
                    row[name] = value.mean
                    row[name + "_lo"] = value.lo
                    row[name + "_hi"] = value.hi
                else:
                    row[name] = value
            rows.append(row)
        return pd.DataFrame(rows).set_index("key")

    def requests_frame(self) -> Any:
        """Every request under every variant as a pandas DataFrame (needs pandas)."""
        import pandas as pd  # optional dependency

        rows = []
        for v in self.variants:
            n = len(v.requests["ttft_ms"])
            for i in range(n):
                row = {"variant": v.key, "request": i}
                row.update({k: vals[i] for k, vals in v.requests.items() if len(vals) == n})
                rows.append(row)
        return pd.DataFrame(rows)


def default_data() -> str:
    """The 2WikiMultihopQA sample the package ships (or the source tree's)."""
    here = os.path.join(os.path.dirname(__file__), "data", "2wikimqa_dev_sample200.jsonl")
    return here if os.path.exists(here) else _relokv.default_data


def run(
    model: Optional[str] = "smollm2",
    data: Optional[str] = None,
    variants: Sequence[str] = ("naive", "epic"),
    requests: int = 24,
    *,
    max_answer: int = 16,
    passages: int = 10,
    corpus: int = 40,
    first_k: int = 16,
    topk: float = 0.15,
    placement: str = "block_relative",
    kv_dtype: str = "bf16",
    seed: int = 1,
    links: Optional[str] = None,
    noise_floor: bool = True,
    num_blocks: int = 4096,
    progress: Optional[Callable[[int, int], None]] = None,
) -> RunResult:
    """Runs relokv_rag's QA job: each request under every variant, interleaved, in one cache.

    model: a name scripts/get-model fetched (smollm2, qwen2.5-0.5b, gemma3-270m, ...), a GGUF
    path, or None for the synthetic model (random weights; the built-in generator's workload).
    data: a 2WikiMultihopQA-style JSONL (default: the shipped sample for a real model).
    variants: keys of relokv_rag's variants (full recompute always runs first, as the
    reference; an empty list runs all twelve). The other arguments are relokv_rag's options.
    Returns a RunResult; raises relokv.Error for a bad option, relokv.ModelError for a model
    that cannot be read.
    """
    if isinstance(variants, str):
        variants = [v for v in variants.split(",") if v]
    if data is None and model is not None:
        data = default_data()
    raw = _relokv._rag_run(
        model,
        data,
        list(variants),
        requests,
        max_answer,
        passages,
        corpus,
        first_k,
        topk,
        placement,
        kv_dtype,
        seed,
        links,
        noise_floor,
        num_blocks,
        progress,
    )
    out = []
    for d in raw["variants"]:
        kw = {k: (Estimate(**v) if isinstance(v, dict) and k != "requests" else v) for k, v in d.items()}
        out.append(Variant(**kw))
    return RunResult(variants=out, source=raw["source"], model=raw["model"], synthetic=raw["synthetic"])
