"""How the batches stage's findings name many things in one sentence: the first few, then how many
more ("batch 1 row 0, batch 1 row 3, batch 2 row 1 and 12 more"); the full lists stay in each
finding's measured value (the JSON report)."""

from __future__ import annotations

FEW = 3  # items a message names before "and N more"


def few(items, limit: int = FEW) -> str:
    """'a, b, c and 12 more' (all of them when there are at most `limit`; 'a and b' for two)."""
    items = [str(i) for i in items]
    if len(items) <= limit:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""
    return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
