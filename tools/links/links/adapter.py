"""The adapter file: a GGUF (written with llama.cpp's own `gguf` package from PyPI) holding the
link rows and what they were trained for. The engine reads it with its GGUF reader and refuses
one made for another model (dim or vocabulary differ, or the model's SHA-256 when given).

    general.architecture       "relokv-links"
    relokv.links.placement     "before_question", "wrappers" or "wrappers+before_question"
    relokv.links.rows          k (u32): header, then trailer, then before-question rows
    relokv.links.header_rows   u32: rows compiled before each span
    relokv.links.trailer_rows  u32: rows compiled after each span
    relokv.links.depth         "embedding" (rows the first layer reads) or "kv" (every layer's
                               key before RoPE and value: links.kv instead of links.rows)
    relokv.links.model_arch    the model's architecture
    relokv.links.model_dim     u32, relokv.links.model_vocab u32
    relokv.links.model_sha256  hex SHA-256 of the model file trained against
    relokv.links.info          JSON: the command, steps, seconds
    tensor links.rows          F32 [k][dim], the rows as the first layer reads them (after the
                               embedding scale the model applies to token embeddings)
    tensor links.kv            F32 [k][layers][2][kv_heads * head_dim] (depth kv)

A deep low-rank correction of each span's own keys and values (links/student.py), when present:

    relokv.links.lowrank_rank         u32 r
    relokv.links.lowrank_first_layer  u32: the first layer corrected (every later one is)
    tensor links.lowrank_a            F32 [corrected layers][dim][r]
    tensor links.lowrank_b            F32 [corrected layers][r][2 * kv_heads * head_dim], the
                                      key's part then the value's

An adapter may hold a correction and no rows (placement "none", relokv.links.rows 0).
"""
from __future__ import annotations

import json

import gguf
import numpy as np


def write(path, rows, model, model_sha, placement="before_question", info=None, header=0,
          trailer=0, kv=None, lowrank=None, depth=None):
    """rows [k, dim] (embedding depth), or kv [k, layers, 2, kv_heads * head_dim] (kv depth),
    or neither (no rows: a correction alone, of `depth`); lowrank: (a, b, first layer) of a
    correction, as student.lowrank_to_file gives it."""
    w = gguf.GGUFWriter(path, "relokv-links")
    w.add_string("relokv.links.placement", placement)
    if depth is None:
        depth = "embedding" if kv is None else "kv"
    n = 0 if rows is None and kv is None else (rows if kv is None else kv).shape[0]
    w.add_uint32("relokv.links.rows", n)
    w.add_uint32("relokv.links.header_rows", header)
    w.add_uint32("relokv.links.trailer_rows", trailer)
    w.add_string("relokv.links.depth", depth)
    w.add_string("relokv.links.model_arch", model.cfg.arch)
    w.add_uint32("relokv.links.model_dim", model.cfg.dim)
    w.add_uint32("relokv.links.model_vocab", model.cfg.vocab)
    w.add_string("relokv.links.model_sha256", model_sha)
    w.add_string("relokv.links.info", json.dumps(info or {}))
    if kv is not None:
        w.add_tensor("links.kv", np.ascontiguousarray(kv, np.float32))
    elif rows is not None:
        w.add_tensor("links.rows", np.ascontiguousarray(rows, np.float32))
    if lowrank is not None:
        a, b, first = lowrank
        w.add_uint32("relokv.links.lowrank_rank", a.shape[2])
        w.add_uint32("relokv.links.lowrank_first_layer", first)
        w.add_tensor("links.lowrank_a", np.ascontiguousarray(a, np.float32))
        w.add_tensor("links.lowrank_b", np.ascontiguousarray(b, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read(path):
    """(rows [k, dim] float32, or kv [k, layers, 2, kv_dim] for depth kv, or None without rows;
    metadata dict, holding a correction's tensors under their names links.lowrank_a and _b)."""
    r = gguf.GGUFReader(path)
    meta = {}
    for name, f in r.fields.items():
        if name.startswith("relokv.") or name == "general.architecture":
            meta[name] = f.contents()
    for t in r.tensors:
        if t.name in ("links.lowrank_a", "links.lowrank_b"):
            meta[t.name] = np.array(t.data, np.float32).reshape([int(d) for d in t.shape][::-1])
    if meta["relokv.links.rows"] == 0:
        return None, meta
    if meta.get("relokv.links.depth", "embedding") == "kv":
        t = next(t for t in r.tensors if t.name == "links.kv")
        dims = [int(d) for d in t.shape]  # gguf's order: kv_dim, 2, layers, rows
        return np.array(t.data, np.float32).reshape(dims[::-1]), meta
    t = next(t for t in r.tensors if t.name == "links.rows")
    rows = np.array(t.data, np.float32).reshape(meta["relokv.links.rows"], -1)
    return rows, meta


def loss_svg(path, curve, title, val=None):
    """The training loss per step (light), its 25-step running mean (dark) and, when given, the
    validation loss at (step, loss) points (orange), as an SVG."""
    W, H, pad = 640, 320, 48
    c = np.asarray(curve, np.float64)
    if c.size == 0:
        c = np.zeros(1)
    mean = np.convolve(c, np.ones(25) / 25, mode="valid") if c.size >= 25 else c
    hi = float(np.percentile(c, 99)) * 1.05 or 1.0

    def pts(ys, x0):
        n = max(len(c) - 1, 1)
        return " ".join(f"{pad + (x0 + i) / n * (W - 2 * pad):.1f},"
                        f"{H - pad - min(y, hi) / hi * (H - 2 * pad):.1f}"
                        for i, y in enumerate(ys))

    ticks = "".join(
        f'<text x="{pad - 6}" y="{H - pad - f * (H - 2 * pad) + 4:.1f}" text-anchor="end" '
        f'font-size="11">{f * hi:.3g}</text>' for f in (0, 0.5, 1))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif">\n<rect width="{W}" height="{H}" fill="white"/>\n'
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="13">{title}: KL loss '
           f'per step</text>\n'
           f'<line x1="{pad}" y1="{H - pad}" x2="{W - pad}" y2="{H - pad}" stroke="black"/>\n'
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{H - pad}" stroke="black"/>\n{ticks}\n'
           f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle" font-size="11">step (of '
           f'{len(c)})</text>\n'
           f'<polyline fill="none" stroke="#9ecae1" stroke-width="1" points="{pts(c, 0)}"/>\n'
           f'<polyline fill="none" stroke="#08519c" stroke-width="2" '
           f'points="{pts(mean, (len(c) - len(mean)) // 2)}"/>\n' + _val_svg(val, len(c), hi, W, H, pad)
           + '</svg>\n')
    with open(path, "w") as f:
        f.write(svg)


def _val_svg(val, steps, hi, W, H, pad):
    if not val:
        return ""
    n = max(steps - 1, 1)
    pts = " ".join(f"{pad + s / n * (W - 2 * pad):.1f},{H - pad - min(y, hi) / hi * (H - 2 * pad):.1f}"
                   for s, y in val)
    dots = "".join(
        f'<circle cx="{pad + s / n * (W - 2 * pad):.1f}" '
        f'cy="{H - pad - min(y, hi) / hi * (H - 2 * pad):.1f}" r="3" fill="#e6550d"/>'
        for s, y in val)
    return (f'<polyline fill="none" stroke="#e6550d" stroke-width="1.5" points="{pts}"/>{dots}\n'
            f'<text x="{W - pad}" y="{pad - 8}" text-anchor="end" font-size="11" '
            f'fill="#e6550d">validation</text>\n')
