#!/usr/bin/env python3
"""Checks that relokv's headers include only what lies below them (docs/architecture.md).

Every folder of include/relokv has a rank; a header may include headers of its own folder and
of folders of a lower rank, and the top-level vocabulary (rank 0). Exit 1, naming each include
that points up or sideways, when one does.
"""
import pathlib
import re
import sys

RANKS = {
    "": 0,          # config.hpp, types.hpp, dtype.hpp, block_table.hpp: vocabulary
    "detail": 0,    # internal utilities (the huge-page allocator)
    "layout": 1,    # request primitives
    "concepts": 2,  # one concept per policy axis
    "hash": 3, "rope": 3, "memory": 3,  # hash schemes, RoPE, pools and KV storage
    "recompute": 4, "attention": 4,  # strategies and host kernels
    "cuda": 5,      # device kernels: they share the host kernels' vocabulary (the oracles)
    "store": 5,     # stores and the block format
    "cache": 6,     # the policy host
    "engine": 7,    # engine-side helpers over a cache: request_kv
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"relokv/([^"]+)"', re.M)


def folder(rel: str) -> str:
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else ""


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include") / "relokv"
    bad = []
    for path in sorted(list(root.rglob("*.hpp")) + list(root.rglob("*.cuh"))):
        rel = path.relative_to(root).as_posix()
        if rel == "relokv.hpp":
            continue  # the umbrella includes everything
        me = folder(rel)
        if me not in RANKS:
            bad.append(f"{rel}: folder '{me}' has no rank in tests/layering_check.py")
            continue
        for inc in INCLUDE.findall(path.read_text()):
            other = folder(inc)
            if other not in RANKS:
                bad.append(f"{rel}: includes {inc}, whose folder has no rank")
            elif other != me and RANKS[other] >= RANKS[me] and RANKS[other] > 0:
                bad.append(f"{rel} (rank {RANKS[me]}) includes relokv/{inc} (rank {RANKS[other]})")
    for b in bad:
        print(b)
    print(f"layering: {'FAILED' if bad else 'ok'} ({len(bad)} includes point up or sideways)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
