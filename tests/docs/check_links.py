#!/usr/bin/env python3
"""Every relative link in the README and the docs resolves to a file or folder of the repository.

Checks README.md, docs/*.md, examples/README.md, bench/results/README.md and data/README.md:
each markdown link [text](target) outside code blocks whose target is not a URL or an anchor
must name an existing path relative to the page. Prints each broken link with its page and line;
exits 1 if there is one."""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
pages = ["README.md", "examples/README.md", "bench/results/README.md", "data/README.md"]
pages += ["docs/" + f for f in sorted(os.listdir(os.path.join(root, "docs"))) if f.endswith(".md")]
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
broken, checked = [], 0
for page in pages:
    path = os.path.join(root, page)
    if not os.path.exists(path):
        continue
    fence = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            for target in link.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                checked += 1
                local = target.split("#", 1)[0]
                if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), local))):
                    broken.append(f"{page}:{n}: {target}")
for b in broken:
    print("broken link: " + b)
print(f"{checked} relative links checked in {len(pages)} pages, {len(broken)} broken")
sys.exit(1 if broken else 0)
