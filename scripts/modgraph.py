#!/usr/bin/env python3
"""Module graph of the Rust crates: which module of a crate uses which other module of it.

Prints each crate's edges and fails (exit 1) if two modules of a crate import each other
through any chain (a cycle), which the code layout forbids. A module is a file under src/
(`engine/locks.rs` is `engine::locks`, `cx/mod.rs` is `cx`); declaring a child module is
not an import, using its items is.

Calls are checked too, between *parts* (a crate's top-level modules: `cx` with all of
`cx/`), which is where the server's protocols live. A call of a method of another part
needs no import when it goes through `self` or a field (`self.twopc.run(..)`), so the
script reads the impl blocks: `self.m(..)` calls the method `m` of the impl's own type,
`self.f.m(..)` the method `m` of field `f`'s type. It fails if parts call or import each
other through any chain, and if a type has methods in two parts (a god object spread over
protocols).

    scripts/modgraph.py [--edges] [--calls] [crates/...]
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


IMPL = re.compile(r"^impl(?:<[^>]*>)?\s+(?:[\w:<>, ]+\s+for\s+)?(\w+)(?:<[^>]*>)?\s*(?:where[^{]*)?\{", re.M)
IMPL_TRAIT = re.compile(r"^impl(?:<[^>]*>)?\s+[\w:<>, ]+\s+for\s+")
STRUCT = re.compile(r"^(?:pub(?:\([a-z]+\))?\s+)?struct\s+(\w+)(?:<[^>]*>)?\s*\{(.*?)^\}", re.M | re.S)
FIELD = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(\w+):\s*(?:&'\w+\s+)?(?:Arc<|Weak<)?(?:[\w]+::)*(\w+)", re.M)
SELF_CALL = re.compile(r"\bself\.(\w+)\s*(?:::<[^>]*>)?\(")
FIELD_CALL = re.compile(r"\bself\.(\w+)\.(\w+)\s*(?:::<[^>]*>)?\(")


# Crates whose parts are protocols with walls: calls between them are checked (others are
# reported with --calls).
CALLS_CHECKED = {"server"}


def part(module: str) -> str:
    return module.split("::")[0]


def impl_blocks(text: str):
    """(type, is a trait impl, body) of each impl block of `text`."""
    for m in IMPL.finditer(text):
        i, depth, j = m.end(), 1, m.end()
        while depth and j < len(text):
            depth += text[j] == "{"
            depth -= text[j] == "}"
            j += 1
        yield m.group(1), bool(IMPL_TRAIT.match(m.group(0))), text[i:j]


def top_fns(body: str) -> list[str]:
    """Names of the functions defined at the top level of an impl body."""
    out, depth = [], 0
    for m in re.finditer(r"[{}]|\bfn\s+(\w+)", body):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
        elif depth == 0:
            out.append(m.group(1))
    return out


def call_graph(crate: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Calls between parts through `self` and its fields, and the types whose inherent
    methods lie in two parts."""
    src = crate / "src"
    texts = {module_of(src, f): f.read_text().split("#[cfg(test)]")[0] for f in src.rglob("*.rs")}
    fields: dict[str, dict[str, str]] = {}
    methods: dict[tuple[str, str], set[str]] = {}  # (type, method) -> modules
    homes: dict[str, set[str]] = {}  # type -> parts with inherent methods
    for m, text in texts.items():
        for st in STRUCT.finditer(text):
            fields.setdefault(st.group(1), {}).update(dict(FIELD.findall(st.group(2))))
        for ty, is_trait, body in impl_blocks(text):
            for name in top_fns(body):
                methods.setdefault((ty, name), set()).add(m)
            if not is_trait and m:
                homes.setdefault(ty, set()).add(part(m))
    edges: dict[str, set[str]] = {}
    for m, text in texts.items():
        if not m:
            continue
        for ty, _, body in impl_blocks(text):
            targets = [(ty, name) for name in SELF_CALL.findall(body)]
            targets += [(fields.get(ty, {}).get(f, ""), name) for f, name in FIELD_CALL.findall(body)]
            for key in targets:
                for n in methods.get(key, ()):
                    if n and part(n) != part(m):
                        edges.setdefault(part(m), set()).add(part(n))
    spread = [f"{t} has methods in {', '.join(sorted(p))}" for t, p in sorted(homes.items()) if len(p) > 1]
    return edges, spread


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
    calls = "--calls" in sys.argv
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
        if crate.name not in CALLS_CHECKED and not calls:
            continue
        called, spread = call_graph(crate)
        parts = {m: set(called.get(m, set())) for m in called}
        for m, targets in edges.items():
            parts.setdefault(part(m), set()).update(part(t) for t in targets if part(t) != part(m))
        if calls:
            print(f"{crate.name} (calls and imports between parts):")
            for m in sorted(parts):
                print(f"  {m} -> {', '.join(sorted(parts[m])) or '-'}")
        checked = crate.name in CALLS_CHECKED
        for c in cycles(parts):
            print(f"{crate.name}: parts call or import each other: {' <-> '.join(c)}")
            bad += checked
        for s in spread:
            print(f"{crate.name}: {s} (a type's methods stay in one part)")
            bad += checked
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
