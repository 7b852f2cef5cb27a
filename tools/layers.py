#!/usr/bin/env python3
"""Check that the C core's files call each other one way only (docs/design.md, "Layers").

For each src/aioprof/_core/*.c file: the non-static ap_* functions and globals it defines,
then which of those defined elsewhere it references (and which of the core's own headers
it includes, a header counting as the .c file of its name). Prints the graph bottom-up and
exits 1 on a cycle or on a reference against ORDER (a file may use only files below it).

    python3 tools/layers.py [--core DIR] [--quiet]
"""
import argparse
import os
import re
import sys

# Bottom-up: a file may reference only files before it in this list. Files on one line
# share a layer and must not reference each other.
ORDER = [
    ("clock", "hist", "table"),
    ("session",),
    ("code",),
    ("trace", "loopstats"),
    ("stacks",),
    ("tasks",),
    ("monitor",),
    ("hooks",),
    ("snapshot",),
    ("module",),
]

CORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "aioprof", "_core")

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
# A definition at file scope starts in column 0: a function ("type name(...)" followed by
# a body) or a global ("type name;" / "type name = ..."), not static, not extern.
FUNC_DEF = re.compile(r"^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t\*]*?\b(ap_\w+)\s*\([^;{]*\)\s*\{",
                      re.M)
VAR_DEF = re.compile(r"^(?!static\b|extern\b|typedef\b|return\b)[A-Za-z_][\w \t\*]*?\b(ap_\w+)\s*(?:\[[^\]]*\]\s*)*(?:=|;)",
                     re.M)
IDENT = re.compile(r"\bap_\w+\b")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([\w.]+)\.h"', re.M)


def strip(text):
    return COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else '""', text)


def scan(core):
    """{file stem: (defined names, referenced identifiers, included header stems)}."""
    files = {}
    for name in sorted(os.listdir(core)):
        if not name.endswith(".c"):
            continue
        with open(os.path.join(core, name), encoding="utf-8") as f:
            raw = f.read()
        text = strip(raw)
        defs = set(FUNC_DEF.findall(text)) | set(VAR_DEF.findall(text))
        files[name[:-2]] = (defs, set(IDENT.findall(text)), set(INCLUDE.findall(raw)))
    return files


def header_uses(core):
    """{header stem: header stems it includes}, for the core's own headers."""
    res = {}
    for name in os.listdir(core):
        if name.endswith(".h"):
            with open(os.path.join(core, name), encoding="utf-8") as f:
                res[name[:-2]] = set(INCLUDE.findall(f.read()))
    return res


def graph(core):
    files = scan(core)
    owner = {}
    for stem, (defs, _, _) in files.items():
        for d in defs:
            owner[d] = stem
    headers = header_uses(core)
    edges = {stem: {} for stem in files}
    for stem, (defs, refs, incs) in files.items():
        for r in sorted(refs - defs):
            o = owner.get(r)
            if o and o != stem:
                edges[stem].setdefault(o, []).append(r)
        # Includes, through the headers' own includes: a header is its .c file's.
        seen, todo = set(), list(incs)
        while todo:
            h = todo.pop()
            if h in seen:
                continue
            seen.add(h)
            todo.extend(headers.get(h, ()))
            if h in files and h != stem:
                edges[stem].setdefault(h, []).append("#include \"%s.h\"" % h)
    return edges


def find_cycle(edges):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not state.get(m):
                c = visit(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if not state.get(n):
            c = visit(n)
            if c:
                return c
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--core", default=CORE, help="the C core's directory")
    ap.add_argument("--quiet", action="store_true", help="print only the errors")
    args = ap.parse_args(argv)
    edges = graph(args.core)
    rank = {stem: i for i, layer in enumerate(ORDER) for stem in layer}
    errors = []
    for stem in sorted(set(edges) - set(rank)):
        errors.append("%s.c: not in tools/layers.py's ORDER" % stem)
    for stem in sorted(set(rank) - set(edges)):
        errors.append("%s.c: in ORDER but not in %s" % (stem, args.core))
    if not args.quiet:
        for layer in ORDER:
            for stem in layer:
                if stem in edges:
                    print("%-10s -> %s" % (stem, " ".join(sorted(edges[stem], key=lambda o: (rank.get(o, -1), o)))
                                           or "-"))
    for stem in sorted(edges):
        for o, names in sorted(edges[stem].items()):
            if stem in rank and o in rank and rank[o] >= rank[stem]:
                errors.append("%s.c uses %s.c (%s), which is not below it" % (stem, o, ", ".join(names[:6])))
    cycle = find_cycle(edges)
    if cycle:
        errors.append("cycle: " + " -> ".join(cycle))
    sys.stdout.flush()
    for e in errors:
        print("layers: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
