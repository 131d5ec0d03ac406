#!/usr/bin/env python3
"""Import circles between the modules of one Rust crate.

    python3 hack/import-cycles.py sm/src            # prints cycles, exits 1 if any
    python3 hack/import-cycles.py sm/src --edges    # also lists every module's edges

Module A *uses* module B when A names an item of B through a path: a `use` declaration
(nested groups `{a, b::{c, self}}` and renames included) or a path in the code
(`crate::a::b::X`, `super::X`, `self::x::Y`, `child::Y` for a child module `child`
declared in A). Paths are resolved to the deepest module they name, following
`pub use` re-exports (`crate::Role` is the module that defines `Role`, when the crate
root re-exports it). A module using its parent's items through `super::` counts like any
other use; declaring a child (`mod x;`) does not. A circle is a set of modules that use
each other, directly or around a loop (a strongly connected component of the graph).

Ignored: comments, string and char literals, items under `#[cfg(test)]` (test modules,
inline or in files, and test-only `use`/`fn`/`impl`), and paths outside the crate
(`std::`, other crates). Macro bodies are scanned like code. Each crate root found
(`lib.rs`, `main.rs`, `bin/*.rs`) is analysed as a crate of its own, following its
`mod` declarations to the files (`x.rs`, `x/mod.rs` or `#[path = ...]`). Glob imports
(`use x::*`, test modules included) are listed as notes: they hide what they use.

Python 3, standard library only.
"""

import os
import re
import sys

# ---------------------------------------------------------------------------------------
# Tokens


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tokenize(text):
    """(kind, value, line) tokens: kind 'id' (identifiers, keywords), '::', 'str' (a plain
    string literal), or 'p' for any other punctuation character. Comments and other
    literals are dropped."""
    toks = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += text[i] == "\n"
                    i += 1
        elif c in "rbc" and re.match(r"(br|cr|r)#*\"", text[i:]):
            m = re.match(r"(br|cr|r)(#*)\"", text[i:])
            end = '"' + m.group(2)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            line += text.count("\n", i, j)
            i = j
        elif c in "bc" and text.startswith('"', i + 1):
            i += 1  # b"..." / c"...": the string below
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            toks.append(("str", text[i + 1 : j], line))  # (for `#[path = "..."]`)
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime / label ('a).
            m = re.match(r"'(\\(u\{[0-9A-Fa-f]+\}|x[0-9A-Fa-f]{2}|.)|[^\\'])'", text[i:], re.S)
            if m:
                i += m.end()
            else:
                m = IDENT.match(text, i + 1)
                i = m.end() if m else i + 1
        elif c == "b" and text.startswith("'", i + 1):
            i += 1  # b'x': the char literal above
        elif c == "r" and text.startswith("r#", i) and IDENT.match(text, i + 2):
            m = IDENT.match(text, i + 2)  # raw identifier r#type
            toks.append(("id", m.group(0), line))
            i = m.end()
        elif IDENT.match(text, i):
            m = IDENT.match(text, i)
            toks.append(("id", m.group(0), line))
            i = m.end()
        elif c.isdigit():
            m = re.match(r"[0-9][0-9A-Za-z_]*", text[i:])
            i += m.end()
        elif text.startswith("::", i):
            toks.append(("::", "::", line))
            i += 2
        else:
            toks.append(("p", c, line))
            i += 1
    return toks


def skip_balanced(toks, i):
    """toks[i] is an opening bracket: the index after its matching closing one."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = [pairs[toks[i][1]]]
    i += 1
    while i < len(toks) and stack:
        k, v, _ = toks[i]
        if k == "p" and v in pairs:
            stack.append(pairs[v])
        elif k == "p" and v == stack[-1]:
            stack.pop()
        i += 1
    return i


# ---------------------------------------------------------------------------------------
# Parsing one file


class Module:
    def __init__(self, path, file, children_dir):
        self.path = path  # tuple of names; () is the crate root
        self.file = file
        self.children_dir = children_dir
        self.children = {}  # name -> Module
        self.uses = []  # (absolute-or-relative segments, line, via_use, is_pub)
        self.reexports = {}  # name -> segments (pub use)
        self.globs = []  # segments of `use x::*`

    def name(self):
        return "crate" if not self.path else "::".join(self.path)


def parse_use_tree(toks, i):
    """Parses a use tree starting at toks[i]; returns (list of (segments, alias)), next i.
    `self` inside a group names the group's prefix."""
    prefix = []
    out = []
    while i < len(toks):
        k, v, _ = toks[i]
        if k == "::":
            i += 1
            continue
        if k == "p" and v == "{":
            i += 1
            while i < len(toks) and not (toks[i][0] == "p" and toks[i][1] == "}"):
                if toks[i][0] == "p" and toks[i][1] == ",":
                    i += 1
                    continue
                sub, i = parse_use_tree(toks, i)
                for segs, alias in sub:
                    if segs == ["self"]:
                        out.append((list(prefix), alias))
                    else:
                        out.append((prefix + segs, alias))
            return out, i + 1
        if k == "p" and v == "*":
            out.append((prefix + ["*"], None))
            return out, i + 1
        if k == "id":
            prefix.append(v)
            i += 1
            if i < len(toks) and toks[i][0] == "id" and toks[i][1] == "as":
                alias = toks[i + 1][1]
                out.append((prefix, alias))
                return out, i + 2
            if i < len(toks) and toks[i][0] == "::":
                continue
            out.append((prefix, None))
            return out, i
        # `,` `}` `;` end this tree
        out.append((prefix, None))
        return out, i
    return out, i


def is_test_cfg(attr_toks):
    vals = [v for _, v, _ in attr_toks]
    return "cfg" in vals and "test" in vals and "not" not in vals


def parse_file(mod, crate):
    with open(mod.file, encoding="utf-8") as f:
        toks = tokenize(f.read())
    scan(toks, 0, len(toks), mod, crate)


def note_globs(toks, i, end, mod, where):
    """Records the glob imports of toks[i:end] (a skipped test module) for the report."""
    for j in range(i, end):
        if toks[j][0] == "id" and toks[j][1] == "use":
            trees, _ = parse_use_tree(toks, j + 1)
            for segs, _ in trees:
                if segs and segs[-1] == "*":
                    mod.globs.append((segs[:-1], toks[j][2], where))


def scan(toks, i, end, mod, crate):
    """Scans toks[i:end] as the body of `mod`."""
    test_attr = False
    is_pub = False  # the item being read is `pub` (a `pub use` re-exports)
    path_attr = None  # `#[path = "..."]` of the next `mod x;`
    while i < end:
        k, v, line = toks[i]
        # Attributes: remember #[cfg(test)] for the next item.
        if k == "p" and v == "#" and i + 1 < end and toks[i + 1][1] in ("[", "!"):
            j = i + 1 + (toks[i + 1][1] == "!")
            if j < end and toks[j][1] == "[":
                close = skip_balanced(toks, j)
                if is_test_cfg(toks[j:close]) and toks[i + 1][1] != "!":
                    test_attr = True
                attr = [t[1] for t in toks[j + 1 : close - 1]]
                if len(attr) == 3 and attr[:2] == ["path", "="] and toks[j + 3][0] == "str":
                    path_attr = attr[2]
                i = close
                continue
        if k == "id" and v in ("pub", "unsafe", "async", "const", "extern", "default"):
            is_pub |= v == "pub"
            if v == "pub" and i + 1 < end and toks[i + 1][1] == "(":
                i = skip_balanced(toks, i + 1)
            else:
                i += 1
            continue
        if k == "id" and v == "mod" and i + 1 < end and toks[i + 1][0] == "id":
            name = toks[i + 1][1]
            after = toks[i + 2] if i + 2 < end else None
            if after and after[1] == "{":
                close = skip_balanced(toks, i + 2)
                if test_attr:
                    note_globs(toks, i + 3, close - 1, mod, " (in a test module)")
                else:
                    child = Module(mod.path + (name,), mod.file, os.path.join(mod.children_dir, name))
                    mod.children[name] = child
                    crate.modules.append(child)
                    scan(toks, i + 3, close - 1, child, crate)
                i, test_attr = close, False
                continue
            if after and after[1] == ";":
                if not test_attr:
                    crate.load_child(mod, name, path_attr)
                i, test_attr, path_attr = i + 3, False, None
                continue
        if k == "id" and v == "use":
            trees, j = parse_use_tree(toks, i + 1)
            while j < end and toks[j][1] != ";":
                j += 1
            if not test_attr:
                for segs, alias in trees:
                    if segs and segs[-1] == "*":
                        mod.globs.append((segs[:-1], line, ""))
                        mod.uses.append((segs[:-1], line, True))
                        continue
                    mod.uses.append((segs, line, True))
                    if is_pub and segs:
                        mod.reexports[alias or segs[-1]] = segs
            i, test_attr, is_pub = j + 1, False, False
            continue
        if test_attr and k == "id" and v in ("fn", "impl"):
            # Skip the test-only item: to its body's end (or `;`).
            j = i
            while j < end and toks[j][1] not in ("{", ";"):
                j = skip_balanced(toks, j) if toks[j][1] in ("(", "[") else j + 1
            i = skip_balanced(toks, j) if j < end and toks[j][1] == "{" else j + 1
            test_attr = False
            continue
        if test_attr and k == "p" and v == "{":
            i, test_attr = skip_balanced(toks, i), False
            continue
        if k == "id" and (i == 0 or toks[i - 1][0] != "::") and i + 1 < end and toks[i + 1][0] == "::":
            # A path in the code: collect its segments.
            segs, j = [v], i + 1
            while j + 1 < end and toks[j][0] == "::" and toks[j + 1][0] == "id":
                segs.append(toks[j + 1][1])
                j += 2
            # (Resolved later: a child module may be declared below its first use.)
            mod.uses.append((segs, line, False))
            i = j
            test_attr = False
            continue
        if k == "p" and v in (";", "{", "}"):
            # (A test-only struct, enum or trait keeps the flag to its body, skipped above.)
            test_attr = is_pub = False
            path_attr = None
        i += 1


# ---------------------------------------------------------------------------------------
# One crate


class Crate:
    def __init__(self, label, root_file):
        self.label = label
        self.modules = []
        root = Module((), root_file, os.path.dirname(root_file))
        self.root = root
        self.modules.append(root)
        parse_file(root, self)
        self.by_path = {m.path: m for m in self.modules}

    def load_child(self, parent, name, path_attr=None):
        cands = [os.path.join(parent.children_dir, name + ".rs"), os.path.join(parent.children_dir, name, "mod.rs")]
        if path_attr:
            # Relative to the directory of the file that declares the module.
            cands = [os.path.join(os.path.dirname(parent.file), path_attr)]
        for cand in cands:
            if os.path.exists(cand):
                children_dir = os.path.join(parent.children_dir, name)
                child = Module(parent.path + (name,), cand, children_dir)
                parent.children[name] = child
                self.modules.append(child)
                parse_file(child, self)
                return
        print(f"warning: {parent.file}: module {name} has no file", file=sys.stderr)

    def start(self, mod, segs):
        """Where a path begins: (module, remaining segments) or None (outside the crate)."""
        first = segs[0]
        if first == "crate":
            return self.root, segs[1:]
        if first == "self":
            return mod, segs[1:]
        if first == "super":
            cur, rest = mod, segs
            while rest and rest[0] == "super":
                if not cur.path:
                    return None
                cur = self.by_path[cur.path[:-1]]
                rest = rest[1:]
            return cur, rest
        if first in mod.children:
            return mod.children[first], segs[1:]
        return None

    def resolve(self, mod, segs, seen=None):
        """The module a path names (deepest module, re-exports followed)."""
        seen = seen or set()
        st = self.start(mod, segs)
        if st is None:
            return None
        cur, rest = st
        while rest:
            name = rest[0]
            if name in cur.children:
                cur, rest = cur.children[name], rest[1:]
                continue
            if name in cur.reexports and (cur.path, name) not in seen:
                seen.add((cur.path, name))
                target = self.resolve(cur, cur.reexports[name] + rest[1:], seen)
                if target is not None:
                    return target
            break
        return cur

    def edges(self):
        """{from: {to: [(file, line)]}}"""
        out = {}
        for m in self.modules:
            for segs, line, _ in m.uses:
                if not segs:
                    continue
                t = self.resolve(m, segs)
                if t is None or t is m:
                    continue
                out.setdefault(m.name(), {}).setdefault(t.name(), []).append((m.file, line))
        return out


def sccs(nodes, edges):
    """Tarjan: strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
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

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(comp, edges):
    """A shortest cycle inside one component (breadth-first from each member)."""
    best = None
    members = set(comp)
    for s in comp:
        prev, frontier, found = {s: None}, [s], None
        while frontier and not found:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w not in members:
                        continue
                    if w == s:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found:
                    break
            frontier = nxt
        if found:
            path, v = [], found
            while v is not None:
                path.append(v)
                v = prev[v]
            path.reverse()
            if best is None or len(path) < len(best):
                best = path
    return best


def crate_roots(src):
    roots = []
    for name in ("lib.rs", "main.rs"):
        p = os.path.join(src, name)
        if os.path.exists(p):
            roots.append((name[:-3], p))
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for e in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, e)
            if e.endswith(".rs"):
                roots.append(("bin/" + e[:-3], p))
            elif os.path.exists(os.path.join(p, "main.rs")):
                roots.append(("bin/" + e, os.path.join(p, "main.rs")))
    return roots


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("-")]
    show_edges = "--edges" in argv
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    src = args[0]
    found = 0
    for label, root in crate_roots(src):
        crate = Crate(label, root)
        edges = crate.edges()
        rel = lambda f: os.path.relpath(f, src)  # noqa: E731
        if show_edges:
            print(f"{label}: {len(crate.modules)} modules")
            for m in crate.modules:
                for t, locs in sorted(edges.get(m.name(), {}).items()):
                    where = ", ".join(f"{rel(f)}:{line}" for f, line in locs[:3])
                    more = f" (+{len(locs) - 3})" if len(locs) > 3 else ""
                    print(f"  {m.name()} -> {t}    {where}{more}")
        for m in crate.modules:
            for segs, line, where in m.globs:
                print(f"{label}: note: glob import {'::'.join(segs)}::* at {rel(m.file)}:{line}{where} (hides what it uses)")
        for comp in sccs([m.name() for m in crate.modules], edges):
            found += 1
            cyc = shortest_cycle(comp, edges)
            print(f"{label}: import circle: {' -> '.join(cyc + [cyc[0]])}")
            if len(comp) > len(cyc):
                print(f"  (the circle joins {len(comp)} modules: {', '.join(comp)})")
            for a, b in zip(cyc, cyc[1:] + [cyc[0]]):
                locs = edges[a][b]
                print(f"  {a} -> {b}: " + ", ".join(f"{rel(f)}:{line}" for f, line in locs[:4]))
    if found:
        print(f"{found} import circle(s)")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
