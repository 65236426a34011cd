#!/usr/bin/env python3
"""Counts the public items of a crate from its rustdoc JSON: every item rustdoc documents (reachable
from the crate root, not `#[doc(hidden)]`) except impl blocks and the methods of trait impls (`impl
Debug for X` adds nothing to learn), by kind.

  cargo +nightly rustdoc -p leasehold-worker --lib -- -Z unstable-options --output-format json
  tests/ground/public-items.py $CARGO_TARGET_DIR/doc/leasehold_worker.json
"""
import collections, json, sys

doc = json.load(open(sys.argv[1]))
index = doc["index"]
trait_impl_items = set()
for item in index.values():
    inner = item.get("inner", {})
    if "impl" in inner and inner["impl"].get("trait") is not None:
        trait_impl_items.update(str(i) for i in inner["impl"]["items"])
kinds = collections.Counter()
for key, item in index.items():
    if item.get("crate_id") != 0 or key in trait_impl_items:
        continue
    kind = next(iter(item.get("inner", {"?": 0})))
    if kind == "impl":
        continue
    kinds[kind] += 1
print("total", sum(kinds.values()))
for kind, n in kinds.most_common():
    print(f"  {kind} {n}")
