#!/usr/bin/env bash
# `make docs`: the README and docs/ as a browsable site, built with mdBook (from crates.io,
# hack/cargo-tools.sh) into target/book/ (open target/book/index.html). The book's source
# is generated in target/book-src/ by hack/docs-book.py: the README as the introduction,
# every page of docs/, e2e/README.md, with their links rewritten to the book's pages.
# `make test` checks the links of the same files (e2e/tests/docs_links.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(bash hack/cargo-tools.sh mdbook)
rm -rf target/book
python3 hack/docs-book.py
cat > target/book.toml <<TOML
[book]
title = "havip"
language = "en"
src = "book-src"

[build]
build-dir = "book"
create-missing = false

[output.html]
TOML
"$tools/mdbook" build target
echo "the book: $(pwd)/target/book/index.html"
