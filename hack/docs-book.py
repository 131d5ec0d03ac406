#!/usr/bin/env python3
"""Writes the mdBook source of `make docs` into target/book-src (see hack/docs.sh).

Pages: the README (the introduction), docs/*.md in reading order, e2e/README.md (as
testing.md). Links between these pages are rewritten to the book's flat layout; links to
any other file of the repository point at it on GitHub (the book holds only the pages)."""
import os, re, shutil, sys

REPO = "https://github.com/havip/havip/blob/main/"
root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
src = os.path.join(root, "target", "book-src")
order = ["architecture", "kubernetes", "standalone", "state-machine", "chart", "plugin", "kind", "benchmarks"]
docs = sorted(f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
pages = [f"{p}.md" for p in order if f"{p}.md" in docs] + [f for f in docs if f[:-3] not in order]
# repository path -> page name in the book
book = {"README.md": "README.md", "e2e/README.md": "testing.md"}
book.update({f"docs/{p}": p for p in pages})
link = re.compile(r"\]\(([^)\s]+)\)")


def rewrite(text, here):
    """`here`: the repository directory of the file the text comes from."""
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            out.append(line)
            continue

        def fix(m):
            target = m.group(1)
            if "://" in target or target.startswith(("#", "mailto:")):
                return m.group(0)
            path, _, anchor = target.partition("#")
            repo_path = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
            if repo_path in book:
                new = book[repo_path]
            elif repo_path.startswith("docs/bench/"):
                new = repo_path[len("docs/"):]  # copied into the book (the charts' SVGs)
            else:
                new = REPO + repo_path
            return "](" + new + ("#" + anchor if anchor else "") + ")"

        out.append(link.sub(fix, line))
    return "".join(out)


def title(path):
    with open(path) as f:
        for line in f:
            if line.startswith("# "):
                return line[2:].strip()
    return os.path.basename(path)


shutil.rmtree(src, ignore_errors=True)
os.makedirs(src)
for repo_path, page in book.items():
    with open(os.path.join(root, repo_path)) as f:
        text = f.read()
    with open(os.path.join(src, page), "w") as f:
        f.write(rewrite(text, os.path.dirname(repo_path)))
bench = os.path.join(root, "docs", "bench")
if os.path.isdir(bench):
    shutil.copytree(bench, os.path.join(src, "bench"))
with open(os.path.join(src, "SUMMARY.md"), "w") as f:
    f.write("# Summary\n\n[havip](README.md)\n\n")
    for p in pages:
        f.write(f"- [{title(os.path.join(root, 'docs', p))}]({p})\n")
    f.write(f"- [{title(os.path.join(root, 'e2e', 'README.md'))}](testing.md)\n")
print(src, file=sys.stderr)
