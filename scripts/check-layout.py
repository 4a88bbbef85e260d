#!/usr/bin/env python3
"""Layout checks for Rust sources that neither rustc nor clippy makes.

Usage:
  scripts/check-layout.py cycles SRC_DIR...               no import cycle among a crate's files
  scripts/check-layout.py fn-lines --max N SRC_DIR...     no non-test function over N lines

`cycles`: a node is a source file (inline modules such as `mod tests { .. }` belong to their
file). An edge A -> B is any path in A that names an item of B: `use crate::b::X`, `super::X`,
`self::b::X`, `b::X` for a child module `b`, grouped `use` trees included, in code as well as in
`use` lines. Declaring `mod b;` is not an edge; calling into it is. So a parent module that
drives its children cannot also be imported by them: shared types live in a leaf, and the tree
reads in data-path order. Strings and comments are ignored.

`fn-lines`: a function's length runs from its `fn` line to its closing brace, comments and
blank lines included; `#[cfg(test)]` modules are left out. clippy's `too_many_lines` counts only
code lines, which lets a function grow long in comments and still pass.
"""

import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_literals(text):
    """Blanks out comments, strings and char literals, keeping newlines (for line numbers)."""
    out = []
    i, n = 0, len(text)
    raw = re.compile(r'(?:b|c)?r(#*)"')
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = raw.match(text, i)
        if m and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def module_of(src, path):
    """The module path (a tuple) a file defines: lib.rs is (), a/mod.rs and a.rs are (a,)."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (aliases and globs dropped)."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, body = m.group(1), m.group(2)
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(body):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:k])
            start = k + 1
    parts.append(body[start:])
    return [p for part in parts if part for p in expand_use(prefix + part)]


def scan(src):
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, f) for f in names if f.endswith(".rs")]
    modules = {}  # module path -> file
    inline = {}  # file -> [(start offset, end offset, module path)]
    texts = {}
    for f in sorted(files):
        mod = module_of(src, f)
        modules[mod] = f
        text = strip_literals(open(f, encoding="utf-8").read())
        texts[f] = text
        spans = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
            depth, j = 1, m.end()
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            spans.append((m.start(), j, m.group(1)))
        inline[f] = spans
    # Inline modules: their own module path, inside their file's.
    for f, spans in inline.items():
        for start, _, name in spans:
            outer = [s for s in spans if s[0] < start < s[1]]
            path = module_of(src, f) + tuple(s[2] for s in sorted(outer)) + (name,)
            modules.setdefault(path, f)
    return modules, inline, texts


def edges_of(src, modules, inline, texts):
    edges = defaultdict(dict)  # file -> {file: line}
    for f, text in texts.items():
        base = module_of(src, f)
        spans = inline[f]

        def module_at(offset):
            outer = sorted(s for s in spans if s[0] < offset < s[1])
            return base + tuple(s[2] for s in outer)

        refs = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            for p in expand_use(m.group(1)):
                refs.append((m.start(), p))
        for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r"::)+" + IDENT + ")", text):
            refs.append((m.start(), m.group(1)))
        for offset, p in refs:
            here = module_at(offset)
            target = resolve(p.split("::"), here, modules)
            if target is None:
                continue
            to = modules[target]
            if to != f:
                edges[f].setdefault(to, text.count("\n", 0, offset) + 1)
    return edges


def resolve(segs, here, modules):
    """The longest module prefix a path names, or None for paths outside the crate."""
    segs = [s for s in segs if s and s != "*"]
    if not segs:
        return None
    if segs[0] == "crate":
        cur, rest = (), segs[1:]
    elif segs[0] in ("self", "super"):
        cur, rest = here, segs
        while rest and rest[0] in ("self", "super"):
            cur = cur[:-1] if rest[0] == "super" else cur
            rest = rest[1:]
    elif here + (segs[0],) in modules:
        cur, rest = here, segs
    else:
        return None
    for s in rest:
        if cur + (s,) in modules:
            cur = cur + (s,)
        else:
            break
    return cur


def cycles(nodes, edges):
    """Tarjan's strongly connected components with more than one file."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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


def check_cycles(dirs):
    failed = False
    for src in dirs:
        modules, inline, texts = scan(src)
        edges = edges_of(src, modules, inline, texts)
        for comp in cycles(texts.keys(), edges):
            failed = True
            print(f"check-layout: {len(comp)} files of {src} import each other in a cycle:")
            members = set(comp)
            for f in comp:
                for to, line in sorted(edges[f].items()):
                    if to in members:
                        print(f"  {os.path.relpath(f, src)}:{line} -> {os.path.relpath(to, src)}")
    if not failed:
        print(f"check-layout: no import cycle in {' '.join(dirs)}")
    return failed


def long_functions(path, limit):
    """(length, line, name) of each function outside `#[cfg(test)]` modules over `limit` lines."""
    text = strip_literals(open(path, encoding="utf-8").read())
    tests = [
        (m.start(), block_end(text, m.end()))
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
    ]
    found = []
    for m in re.finditer(r"\bfn\s+(" + IDENT + r")[^;{]*\{", text):
        if any(start <= m.start() < end for start, end in tests):
            continue
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, block_end(text, m.end())) + 1
        if last - first + 1 > limit:
            found.append((last - first + 1, first, m.group(1)))
    return found


def block_end(text, open_at):
    """The offset just past the brace that closes the block opened before `open_at`."""
    depth, j = 1, open_at
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return j


def check_fn_lines(dirs, limit):
    failed = False
    for src in dirs:
        for root, _, names in sorted(os.walk(src)):
            for name in sorted(n for n in names if n.endswith(".rs")):
                path = os.path.join(root, name)
                for length, line, fn in long_functions(path, limit):
                    failed = True
                    print(f"check-layout: {path}:{line} fn {fn} has {length} lines (at most {limit})")
    if not failed:
        print(f"check-layout: no non-test function over {limit} lines in {' '.join(dirs)}")
    return failed


def main(args):
    if args[:1] == ["cycles"] and args[1:]:
        failed = check_cycles(args[1:])
    elif args[:2] == ["fn-lines", "--max"] and len(args) > 3 and args[2].isdigit():
        failed = check_fn_lines(args[3:], int(args[2]))
    else:
        sys.exit(__doc__)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
