"""No product module over 450 lines: a module that grows past it holds two concerns (split it on a seam).

The product is what ships in the images: the packages under contract/, operator/, picker/ and runtime/.
The local platform (hack/) is development tooling and is not held to it.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("contract/chatfleet_contract", "operator/chatfleet_operator", "picker/chatfleet_picker",
           "runtime/chatfleet_runtime")  # fmt: skip
LIMIT = 450


def test_no_product_module_over_the_limit():
    sizes = {
        path.relative_to(REPO_ROOT).as_posix(): len(path.read_text().splitlines())
        for root in PRODUCT
        for path in (REPO_ROOT / root).rglob("*.py")
    }
    assert len(sizes) > 100, "the product's modules were not found"
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"product modules over {LIMIT} lines (split each on a seam): {over}"
