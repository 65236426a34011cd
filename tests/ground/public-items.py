#!/usr/bin/env python3
"""Counts a crate's public items from its rustdoc JSON: what a user can reach from the crate root
through public, documented paths (`#[doc(hidden)]` ones are left out), by kind. An item is a module,
type, trait, function, constant, field, variant or inherent method; impl blocks, trait impls' methods
and the `pub use` lines themselves are not counted (what they re-export is, once).

  CARGO_TARGET_DIR=... cargo +nightly rustdoc -p leasehold-worker --lib -- -Z unstable-options --output-format json
  tests/ground/public-items.py $CARGO_TARGET_DIR/doc/leasehold_worker.json
"""
import collections, json, sys

doc = json.load(open(sys.argv[1]))
index = doc["index"]
seen, kinds = set(), collections.Counter()


def visit(item_id):
    key = str(item_id)
    if item_id is None or key in seen or key not in index:
        return
    seen.add(key)
    item = index[key]
    kind, inner = next(iter(item["inner"].items()))
    if kind == "use":
        # A glob re-exports a module's items; a named use its target.
        target = inner.get("id")
        if inner.get("is_glob") and str(target) in index:
            for child in index[str(target)]["inner"]["module"]["items"]:
                visit(child)
        else:
            visit(target)
        return
    if item.get("crate_id") != 0:
        return
    kinds[kind] += 1
    if kind == "module":
        for child in inner["items"]:
            visit(child)
    elif kind == "struct":
        shape = inner["kind"]
        if isinstance(shape, dict):
            fields = shape.get("plain", {}).get("fields") or shape.get("tuple") or []
            for field in fields:
                visit(field)
        inherent(inner.get("impls", []))
    elif kind == "enum":
        for variant in inner["variants"]:
            visit(variant)
        inherent(inner.get("impls", []))
    elif kind == "variant":
        shape = inner["kind"]
        if isinstance(shape, dict):
            fields = shape.get("struct", {}).get("fields") or shape.get("tuple") or []
            for field in fields:
                visit(field)
    elif kind == "trait":
        for child in inner["items"]:
            visit(child)


def inherent(impls):
    for impl_id in impls:
        impl = index.get(str(impl_id))
        if impl and impl["inner"]["impl"].get("trait") is None:
            for child in impl["inner"]["impl"]["items"]:
                if index.get(str(child), {}).get("visibility") == "public":
                    visit(child)


visit(doc["root"])
print("total", sum(kinds.values()))
for kind, n in kinds.most_common():
    print(f"  {kind} {n}")
