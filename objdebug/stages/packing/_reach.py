"""Where packed documents reach each other, position by position, and the cause that pattern
supports (issue 35: say what was measured before naming a cause).

From the shared measurement's `moved` maps (the model's next-token log-probabilities with each
document but the last of each row changed in turn, at every position, scored or not):

- `reaches`: each (row, changed document, other document) whose positions moved by more than
  the tolerance, with those positions (relative to the document's start) and the size;
- `pattern`: what the reaches add up to, and so which cause they support:
  - `none`: no change reaches another document at any position;
  - `late` (n): every boundary of every row, and nothing else: the change of a document reaches
    exactly the first n positions of the next one. The model does keep documents apart, with each
    boundary n positions late (an off-by-one in how it reads the boundary input), whatever the
    boundary form; its attention does not ignore the boundary;
  - `crosses`: at every boundary the change reaches the next document up to its last position:
    attention crosses the boundary (the model does not apply it);
  - `irregular`: anything else; no cause is named.
- `cut`, from `own_moved` (every document's first token changed): in every later document the
  first token reaches exactly its first n positions while in a row's first document it reaches
  further: the first n positions of each later document are cut off from the rest of it (a start
  read n positions late, seen from the document's own side; with no reach from the previous
  document, another boundary input the model reads keeps that one out).
"""

from __future__ import annotations

import numpy as np

from objdebug.core.findings import listing

# how each boundary form is read when it is read n positions late (the measured pattern `late`)
LATE = {
    "attention_mask": "it takes the block mask's document starts {n} position(s) late",
    "actual_seq_len": "it cuts attention {n} position(s) after each actual_seq_len end",
    "position_ids": "it starts a new document {n} position(s) after the position ids restart",
    "none": "it finds the boundaries itself, {n} position(s) late",
}


def reaches(m, tol: float) -> list[dict]:
    """Each (row, changed document, other document) where the change moves the other document's
    next-token log-probabilities by more than `tol` at some position."""
    out = []
    for c, moved in enumerate(m.moved):
        for i, row in enumerate(m.rows):
            for j, doc in enumerate(row.docs):
                if j == c:
                    continue
                s, e = row.span(j)
                d = moved[i, s:e]
                pos = [int(p) for p in np.flatnonzero(d > tol)]
                if pos:
                    out.append({"row": i, "from": row.docs[c].id, "from_index": c, "into": doc.id,
                                "into_index": j, "positions": pos, "length": doc.length,
                                "size": float(d.max())})
    return out


def pattern(found: list[dict], m) -> dict:
    """{"kind": none | late | crosses | irregular, "positions": n (late), "boundaries": measured}"""
    boundaries = sum(len(r.docs) - 1 for r in m.rows)
    out = {"boundaries": boundaries, "reached": len(found)}
    if not found:
        return out | {"kind": "none"}
    adjacent = [r for r in found if r["into_index"] == r["from_index"] + 1]
    every = len(adjacent) == boundaries
    sizes = {len(r["positions"]) for r in found}
    # the first n positions of the document, and not all of them
    prefixes = all(r["positions"] == list(range(len(r["positions"])))
                   and len(r["positions"]) < r["length"] for r in found)
    if every and len(adjacent) == len(found) and len(sizes) == 1 and prefixes:
        return out | {"kind": "late", "positions": sizes.pop()}
    if every and all(r["positions"][-1] == r["length"] - 1 for r in adjacent):
        return out | {"kind": "crosses"}
    return out | {"kind": "irregular"}


def cut(m, tol: float) -> dict:
    """{"kind": "cut" | "none", "positions": n, "documents": later documents, "first_reach": the
    positions a row's first document's first token reaches, fewest over the rows}"""
    later, first = [], []
    for i, row in enumerate(m.rows):
        for k, doc in enumerate(row.docs):
            s, e = row.span(k)
            pos = [int(p) for p in np.flatnonzero(m.own_moved[i, s:e] > tol)]
            (later if k else first).append((pos, doc.length))
    sizes = {len(p) for p, _ in later}
    reach = min(len(p) for p, _ in first)
    if (later and len(sizes) == 1 and all(p == list(range(len(p))) for p, _ in later)
            and all(len(p) < n for p, n in later) and reach > len(later[0][0])):
        return {"kind": "cut", "positions": sizes.pop(), "documents": len(later), "first_reach": reach}
    return {"kind": "none", "documents": len(later), "first_reach": reach}


def cut_text(c: dict) -> str:
    n = c["positions"]
    return (f"changing each document's first token moves only the first {n} position(s) of each of "
            f"the {c['documents']} later documents (in a row's first document, at least "
            f"{c['first_reach']} positions): the rest of a later document does not see its first "
            f"{n} position(s)")


def positions_text(pos: list[int], length: int) -> str:
    """'every position (45)', 'the first 1 position(s) of 45', '12 of 45 positions (0-3, 7, ...)'."""
    if len(pos) == length:
        return f"every position ({length})"
    if pos == list(range(len(pos))):
        return f"the first {len(pos)} position(s) of {length}"
    runs, start = [], pos[0]
    for a, b in zip(pos, pos[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return f"{len(pos)} of {length} positions ({listing(runs, 6)})"


def reach_text(r: dict) -> str:
    return (f"'{r['from']}' -> '{r['into']}' (row {r['row']}): "
            f"{positions_text(r['positions'], r['length'])}, up to {r['size']:.3g} nats")


def measured(found: list[dict], pat: dict) -> str:
    """What was measured, position by position, in one clause (no cause)."""
    head = ("measured position by position (the model's next-token log-probabilities at every "
            "document position, scored or not, each document but the last changed in turn): ")
    if pat["kind"] == "none":
        return head + "no change reaches another document at any position"
    shown = listing([reach_text(r) for r in found], 4)
    if pat["kind"] == "late":
        return head + (f"the first {pat['positions']} position(s) of each later document see the "
                       f"previous document, and no other position does (all {pat['boundaries']} "
                       f"boundaries): {shown}")
    return head + f"changes reach {len(found)} (document -> document) pair(s): {shown}"


def late_cause(pat: dict, boundary: str) -> str:
    """The cause a `late` pattern supports, said as the boundary form it was read from."""
    n = pat["positions"]
    return (f"the boundary is read {n} position(s) late: " + LATE[boundary].format(n=n)
            + f" (an off-by-one in the model's reading of the boundary, not a model that ignores "
              f"it): the first {n} position(s) of each document belong to the previous one")


def cut_cause(c: dict, inputs: list[str]) -> str:
    """The cause a `cut` with no reach from the previous document supports."""
    n = c["positions"]
    given = [x for x in inputs if x != "input_ids"]
    which = (f"one of the boundary inputs the model reads ({', '.join(given)}) gives each document "
             f"start {n} position(s) late while another keeps the previous document out"
             if len(given) > 1 else f"the model reads each document start {n} position(s) late "
             f"and keeps the previous document out of those positions")
    return (f"the first {n} position(s) of each later document are cut off from the rest of it and "
            f"no other document reaches them: {which} (an off-by-one in the model's reading of the "
            f"boundary)")
