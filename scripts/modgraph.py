#!/usr/bin/env python3
"""Module graph of the Rust crates: which module of a crate uses which other module of it.

Prints each crate's edges and fails (exit 1) if two modules of a crate import each other
through any chain (a cycle), which the code layout forbids. A module is a file under src/
(`engine/locks.rs` is `engine::locks`, `cx/mod.rs` is `cx`); declaring a child module is
not an import, using its items is.

    scripts/modgraph.py [--edges] [crates/...]
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)::((?:[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)*)?")
LOCAL = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([a-z_][a-z0-9_]*)::", re.M)


def module_of(src: Path, f: Path) -> str:
    """`engine/locks.rs` -> `engine::locks`; `cx/mod.rs` -> `cx`; `lib.rs` -> ``."""
    parts = list(f.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return "::".join(parts)


def resolve(mods: set[str], base: list[str], names: list[str]) -> str | None:
    """The longest module that `base::names...` starts with."""
    best = None
    for i in range(1, len(names) + 1):
        cand = "::".join(base + names[:i])
        if cand in mods:
            best = cand
    return best


def graph(crate: Path) -> dict[str, set[str]]:
    src = crate / "src"
    files = list(src.rglob("*.rs"))
    mods = {module_of(src, f) for f in files}
    edges: dict[str, set[str]] = {m: set() for m in mods if m}
    for f in files:
        m = module_of(src, f)
        if not m:
            continue
        here = m.split("::")
        # Test modules may use anything; they are not part of the layout.
        text = f.read_text().split("#[cfg(test)]")[0]
        for root, rest in PATH.findall(text):
            names = rest.split("::") if rest else []
            base = {"crate": [], "super": here[:-1], "self": here}[root]
            target = resolve(mods, base, names) or ("::".join(base) if root == "super" else None)
            if target and target != m:
                edges[m].add(target)
        for child in LOCAL.findall(text):
            target = resolve(mods, here, [child])
            if target and target != m:
                edges[m].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show = "--edges" in sys.argv
    crates = [Path(a) for a in args] or sorted(p.parent for p in Path("crates").glob("*/Cargo.toml"))
    bad = 0
    for crate in crates:
        edges = graph(crate)
        found = cycles(edges)
        if show:
            print(f"{crate.name}:")
            for m in sorted(edges):
                print(f"  {m} -> {', '.join(sorted(edges[m])) or '-'}")
        for c in found:
            print(f"{crate.name}: modules import each other: {' <-> '.join(c)}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
