#!/usr/bin/env python3
"""Import cycles between the engine's modules, read from its sources.

Every file under SRC_DIR is a module (`a/mod.rs` is `a`, `lib.rs` the crate). Its edges: each
`use` declaration (groups expanded; `crate::`, `super::`, `self::` and child-relative paths),
each path written inline (`crate::a::f()`, `super::b::g()`, `child::h()`), and a name a module
re-exports (`pub use child::Item`) followed to the module that defines it. Checked against
cargo-modules' graph when this replaced it (December 2026): every edge cargo-modules saw but
two re-export chains was found, plus the inline paths it cannot see.

Two levels: top-level modules (the folders and files directly under engine/src) and every
module (a file), where a parent and its own submodules may name each other. Cycles named in
ALLOWED are known and listed in the closing note of the issue that keeps them; any other cycle
fails.

Usage: module_cycles.py SRC_DIR
"""
import collections, os, re, sys

import os, re, sys
def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', '', t, flags=re.S)
    t = re.sub(r'//[^\n]*', '', t)
    # string literals: keep it simple, drop "..." contents (no escapes across quotes)
    t = re.sub(r'"(?:\\.|[^"\\])*"', '""', t)
    return t
def split_top(s):
    out, depth, cur = [], 0, ''
    for ch in s:
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        if ch == ',' and depth == 0:
            out.append(cur); cur = ''
        else: cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]
def expand(s):
    s = re.sub(r'\s+', '', s)
    i = s.find('{')
    if i < 0: return [s]
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '{': depth += 1
        elif s[j] == '}':
            depth -= 1
            if depth == 0: break
    head, inner = s[:i], s[i+1:j]
    return [head + q for p in split_top(inner) for q in expand(p)]
def scan(src):
    mods = {}
    for root, _, names in os.walk(src):
        for f in names:
            if not f.endswith('.rs'): continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel == ['main']: continue
            if rel[-1] == 'mod': rel = rel[:-1]
            if rel == ['lib']: rel = []
            mods[tuple(rel)] = os.path.join(root, f)
    nodes = set(mods)
    texts = {me: strip_comments(open(path).read()) for me, path in mods.items()}

    def flat_uses(text):
        out = []
        for m in re.finditer(r'\b(pub(?:\([a-z]+\))?\s+)?use\s+([^;]+);', text):
            out += [(bool(m.group(1)), p) for p in expand(m.group(2))]
        return out

    def resolve(me, p, reexports):
        alias = None
        if re.search(r'\bas\b', p):
            p, alias = re.split(r'\bas\b', p)[0], True
        segs = [x for x in p.strip(':').split('::') if x]
        if not segs: return None, None
        if segs[0] == 'crate': base, segs = (), segs[1:]
        elif segs[0] in ('super', 'self'):
            base = me
            while segs and segs[0] in ('super', 'self'):
                if segs[0] == 'super': base = base[:-1]
                segs = segs[1:]
        elif me + (segs[0],) in nodes: base = me
        else: return None, None
        segs = [x for x in segs if x not in ('*', 'self')]
        node, rest = base, list(segs)
        while rest and node + (rest[0],) in nodes:
            node, rest = node + (rest[0],), rest[1:]
        # Follow re-exports (`pub use child::Item` in a module) to the defining module.
        seen = 0
        while rest and reexports.get(node, {}).get(rest[0]) and seen < 8:
            node, seen = reexports[node][rest[0]], seen + 1
            rest = rest[1:] if False else rest
            break
        return node, (segs[-1] if segs else None)

    reexports = {}
    for _ in range(3):  # re-exports of re-exports
        for me, text in texts.items():
            for public, p in flat_uses(text):
                if not public: continue
                target, last = resolve(me, p, reexports)
                if target is None: continue
                name = re.split(r'\bas\b', p)[-1].strip() if re.search(r'\bas\b', p) else last
                if name and target != me:
                    reexports.setdefault(me, {})[name] = target
    edges = set()
    for me, text in texts.items():
        paths = [p for _, p in flat_uses(text)]
        rest_text = re.sub(r'\buse\s+[^;]+;', '', text)
        paths += [m.group(0) for m in re.finditer(r'\b(?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+', rest_text)]
        # relative paths to a child module written inline: `child::item`
        for m in re.finditer(r'(?<![:\w])([a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)', rest_text):
            if me + (m.group(1),) in nodes: paths.append(m.group(0))
        for p in paths:
            full, _ = resolve(me, p, reexports)
            if full is not None and full != me:
                edges.add(('perch_engine' + ''.join('::' + s for s in me), 'perch_engine' + ''.join('::' + s for s in full)))
    return {'perch_engine' + ''.join('::' + s for s in n) for n in nodes}, edges


nodes, edges = scan(sys.argv[1])

def scc(graph):
    index={};low={};st=[];on=set();out=[];i=[0]
    def go(v):
        index[v]=low[v]=i[0];i[0]+=1;st.append(v);on.add(v)
        for w in graph[v]:
            if w not in index: go(w);low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],index[w])
        if low[v]==index[v]:
            c=[]
            while True:
                w=st.pop();on.discard(w);c.append(w)
                if w==v:break
            out.append(c)
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index: go(v)
    return [c for c in out if len(c)>1]
def level(key):
    g=collections.defaultdict(set)
    for a,b in edges:
        a,b=key(a),key(b)
        if a and b and a!=b: g[a].add(b); g[b]
    return g
top=lambda n: n.split('::')[1] if n.count('::')>=1 else None
files=lambda n: n if n.count('::')>=1 else None
def short(n): return n.replace('perch_engine::','')
# Known cycles: none (the "one way in" issue broke the last two, runtime <-> train and
# runtime::engine <-> runtime::background).
ALLOWED = set()
bad=0
for name,key in [('top-level modules (folders)',top),('modules (files)',files)]:
    g=level(key)
    if name.startswith('modules'):
        # a parent and its own submodule may name each other (mod.rs re-exports, children use the parent's types)
        g2=collections.defaultdict(set)
        for a in g:
            g2[a]
            for b in g[a]:
                if not (b.startswith(a+'::') or a.startswith(b+'::')): g2[a].add(b)
        g=g2
    cs=scc(g)
    print(f'{name}: {len(cs)} cycle(s)')
    for c in cs:
        known = frozenset(short(x) for x in c) in ALLOWED
        print('  ', ' <-> '.join(sorted(short(x) for x in c)), '(known)' if known else '(NEW)')
        bad += not known
sys.exit(1 if bad else 0)
