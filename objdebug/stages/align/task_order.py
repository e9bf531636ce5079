"""Align for `[task] kind = "tagging"` (OBJ111) and `"embedding"` (OBJ112) (issue 47): the
objective ranks the truth below a near miss below a far one, with a clear gap, judged as OBJ110.

- OBJ111, tagging: on each align row whose scored positions the model tags right (the argmax of
  its emissions), the user's objective is called on that row alone (a batch of one,
  `task.objective`) with the gold tags, the gold tags with one tag changed (at the position the
  model is least sure of, to the tag it scores second: the near miss) and with every scored tag
  changed (each to the tag the model scores last: the far one). Padding and later word pieces
  keep `label_pad_id` in all three.
- OBJ112, embedding: on each align row whose positive the model ranks first among every text of
  the rows (by the objective's similarity or distance on the model's embeddings), the row's
  positive is replaced by the hard negative (the other text most similar to the anchor) and by
  the far text (the least similar). Pairs: the objective on the row in a batch with the other rows
  (their positives are its in-batch negatives, so an in-batch loss is not degenerate; rows whose
  positive is one of the candidates are left out of that batch, so no candidate appears twice).
  Triplets: the objective on the row alone with the row's true positive as the negative, so a
  correct margin loss is d(a, candidate) - d(a, positive) + m, never clipped at 0 on a row the
  model ranks right.

A candidate ordered only by float noise is not ordered: each step up must exceed `[align]
task_order_gap` times the larger of its two losses. Rows the model gets wrong are left out: on
them the order measures the model, not the objective.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition
from objdebug.core.settings import Settings
from objdebug.pipeline import task_kind
from objdebug.stages.align.classification import order_condition


def _ordered(losses, gap: float) -> bool:
    """Each step up by more than `gap` times the larger of its two losses: relative, so a trained
    model's saturated contrastive loss (1e-4 nats, the hard negative 4e-5 above) still counts, and
    two equal losses, or two that differ by float32 rounding alone, do not."""
    t, n, f = losses
    return bool(n - t > gap * max(abs(t), abs(n)) and f - n > gap * max(abs(n), abs(f)))


def _summary(rows: int, table: list[dict], bad: list[str]) -> dict[str, Any]:
    finite = all(math.isfinite(v) for r in table for v in r["loss"])
    return {"rows": rows, "correct": len(table), "accuracy": len(table) / max(rows, 1),
            "ordered_share": (sum(r["ordered"] for r in table) / len(table)) if table else float("nan"),
            "finite": finite, "disordered": bad, "table": table,
            "mean_loss": [float(np.mean([r["loss"][i] for r in table])) if table else float("nan")
                          for i in range(3)]}


def _no_align(example: str):
    def skip_reason(self, ctx) -> str | None:
        return None if ctx.config.data.align else f"no align data: set data.align to a JSONL of {example} rows"
    return skip_reason


# --------------------------------------------------------------------------- tagging
def _variants(em: np.ndarray, gold: np.ndarray, scored: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(one tag changed, every scored tag changed, the position changed) of a row the model tags
    right: the near miss at the scored position with the smallest margin over the second tag."""
    order = np.argsort(-em, -1, kind="stable")
    pos = np.flatnonzero(scored)
    margin = em[pos, order[pos, 0]] - em[pos, order[pos, 1]]
    t = int(pos[int(np.argmin(margin))])
    near, far = gold.copy(), gold.copy()
    near[t] = order[t, 1]
    far[pos] = order[pos, -1]
    return near, far, t


class TagRanking(Check):
    """loss(gold) < loss(one tag changed) < loss(many changed) on the rows the model tags right."""

    name = "tag-ranking"
    stage = "align"
    kinds = ("tagging",)
    skip_reason = _no_align("{id, tokens|ids, tags}")

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine import tasks

        rows = task_kind.align_rows(ctx)
        em = task_kind.outputs_of(ctx, rows)  # [N, T, K], padded to one bucket
        pad_label = ctx.config.data.label_pad_id
        names = ctx.config.task.labels or [str(k) for k in range(em.shape[-1])]
        table, bad = [], []
        for k, row in enumerate(rows):
            gold = np.full(em.shape[1], pad_label, np.int64)
            gold[:len(row.target)] = row.target
            scored = gold != pad_label
            if not scored.any() or (em[k].argmax(-1)[scored] != gold[scored]).any():
                continue
            near, far, t = _variants(em[k], gold, scored)
            x = ms.Tensor(np.repeat(em[k:k + 1], 3, 0).astype(np.float32))
            y = ms.Tensor(np.stack([gold, near, far]).astype(np.int32))
            losses = tasks.per_row(ctx.engine, x, y)
            ok = _ordered(losses, th["task_order_gap"])
            pos = np.flatnonzero(scored)
            # the emission margins the changes give up (float64): a token CE moves by them / many
            margins = [float(em[k, t, gold[t]] - em[k, t, near[t]]),
                       float((em[k, pos, gold[pos]] - em[k, pos, far[pos]]).sum())]
            table.append({"id": row.id, "line": row.line, "position": t, "margins": margins,
                          "changed": f"{names[gold[t]]} -> {names[near[t]]}",
                          "many": int(scored.sum()), "loss": [float(v) for v in losses], "ordered": ok})
            if not ok:
                bad.append(row.id)
        return _summary(len(rows), table, bad)

    def conditions(self, th: Settings) -> list[Condition]:
        return [order_condition("OBJ111", ("gold", "one tag changed", "every tag changed"),
                                "every scored tag the argmax of its emissions", th, gap=th["task_order_gap"])]


# --------------------------------------------------------------------------- embedding
def _closeness(cfg, cell, triplet: bool):
    """(name, [closeness]): the objective's own notion of close (higher = closer) as numpy on
    [N, D] x [M, D] when it declares one (`similarity` / `distance`, read as the grad stage's
    contrastive check reads them); else every notion an embedding objective may use (cosine, dot,
    Euclidean), the default first: a row then counts only where they all agree (issue 55: on the
    Llama encoder, whose norms vary 0.03-1.1, OpenCLIP's dot-product ClipLoss and
    sentence-transformers' cosine ContrastiveLoss were judged by a notion they do not use)."""
    key = "distance" if triplet else "similarity"
    how = cfg.objective.kwargs.get(key, getattr(cell, key, None))

    def unit(x):
        return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    notions = {"cosine": lambda a, b: unit(a) @ unit(b).T,
               "euclidean": lambda a, b: -np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1),
               "dot": lambda a, b: a @ b.T}
    if isinstance(how, str):
        how = how if how in notions else "dot"
        return how, [notions[how]]
    order = ("euclidean", "cosine", "dot") if triplet else ("cosine", "dot", "euclidean")
    return "undeclared: " + ", ".join(order), [notions[k] for k in order]


def _ranks_right(sims, i, own, hard, far, rest) -> bool:
    """The positive the closest of the rows' texts to anchor i and own > hard > far, by every notion."""
    return all(s[i, own] > max(s[i, j] for j in rest) and s[i, own] > s[i, hard] > s[i, far] for s in sims)


def _columns_right(sims, i, keep, candidates) -> bool:
    """The column direction of the batch the check builds: for every other anchor k of the batch,
    s(a_i, c) - s(a_k, c) ordered own > hard > far, by every notion. An in-batch loss meets each
    candidate again as the other anchors' negative, and a symmetric one (CLIP's) as a row of its
    transposed logits, softmaxed over the batch's anchors: there a hard negative closer to another
    anchor than to a_i costs more than a far text close to none, on a correct loss (Llama encoder,
    ClipLoss: 3 of 13 rows ordered by the row direction, disordered by the column one). With every
    difference ordered, each such term is ordered at any temperature."""
    if not keep:
        return True
    own, hard, far = candidates
    for s in sims:
        d = [s[i, c] - s[keep, c] for c in (own, hard, far)]
        if not (np.all(d[0] > d[1]) and np.all(d[1] > d[2])):
            return False
    return True


class PairRanking(Check):
    """loss(true positive) < loss(hard negative) < loss(far text) on the rows the model ranks right."""

    name = "pair-ranking"
    stage = "align"
    kinds = ("embedding",)
    skip_reason = _no_align("{id, anchor, positive, negative?}")

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        from objdebug.engine import tasks

        engine = ctx.engine
        rows = task_kind.align_rows(ctx)
        triplet = all(r.negative is not None for r in rows)
        pool: dict[tuple, int] = {}  # every text of the rows once, in order
        for r in rows:
            for seq in (r.positive, r.negative):
                if seq is not None:
                    pool.setdefault(tuple(seq), len(pool))
        texts = [list(t) for t in pool]
        anchors = _embed(ctx, [r.ids for r in rows])
        others = _embed(ctx, texts)
        how, closes = _closeness(ctx.config, ctx.target.objective, triplet)
        a64, o64 = anchors.asnumpy().astype(np.float64), others.asnumpy().astype(np.float64)
        all_sims = [close(a64, o64) for close in closes]
        sims = all_sims[0]
        table, bad = [], []
        for i, row in enumerate(rows):
            own = pool[tuple(row.positive)]
            rest = [j for j in range(len(texts)) if j != own and texts[j] != row.ids]
            if not rest:
                continue
            hard = max(rest, key=lambda j: sims[i, j])
            far = min(rest, key=lambda j: sims[i, j])
            if not _ranks_right(all_sims, i, own, hard, far, rest):
                continue
            keep = [] if triplet else _context(rows, pool, i, {own, hard, far}, engine.batch_size)
            if not triplet and not _columns_right(all_sims, i, keep, (own, hard, far)):
                continue
            losses = []
            for cand in (own, hard, far):
                if triplet:  # the row alone, its true positive as the negative
                    out = tasks.pair_objective(engine, anchors[i:i + 1], others[cand:cand + 1],
                                               others[own:own + 1])
                else:
                    out = tasks.pair_objective(engine, *_in_batch(anchors, others, rows, pool, i, cand, keep))
                losses.append(float(out.asnumpy()[0]))
            ok = _ordered(losses, th["task_order_gap"])
            table.append({"id": row.id, "line": row.line, "similarity": how,
                          "closeness": [float(sims[i, j]) for j in (own, hard, far)],
                          "loss": losses, "ordered": ok})
            if not ok:
                bad.append(row.id)
        out = _summary(len(rows), table, bad)
        out["form"] = "triplet" if triplet else "pairs"
        return out

    def conditions(self, th: Settings) -> list[Condition]:
        return [order_condition("OBJ112", ("true positive", "hard negative", "far text"),
                                "the positive the closest of the rows' texts to its anchor, the three candidates in order "
                                "in every direction the objective meets them", th,
                                gap=th["task_order_gap"])]


def _embed(ctx, seqs):
    """The model's embeddings of id sequences [N, D] (a Tensor), batch_size rows per call."""
    import mindspore as ms

    from objdebug.engine import tasks

    pad, n = ctx.engine.padding.pad_id, ctx.engine.batch_size
    length = tasks.bucket(max(map(len, seqs)))
    parts = [tasks.forward(ctx.engine, tasks.pad(seqs[i:i + n], pad, length)).asnumpy()
             for i in range(0, len(seqs), n)]
    return ms.Tensor(np.concatenate(parts))


def _context(rows, pool, i, candidates, batch_size) -> list[int]:
    """The other rows of row i's batch: up to batch_size - 1 rows whose positive is none of the
    candidates (so no candidate appears twice)."""
    keep = [j for j, r in enumerate(rows) if j != i and pool[tuple(r.positive)] not in candidates]
    return keep[:max(batch_size - 1, 1)]


def _in_batch(anchors, others, rows, pool, i, cand, keep):
    """(anchors, positives) [b, D]: row i with `cand` as its positive first, then the rows `keep`."""
    import mindspore as ms

    a = anchors.asnumpy()[[i] + keep]
    p = others.asnumpy()[[cand] + [pool[tuple(rows[j].positive)] for j in keep]]
    return ms.Tensor(a), ms.Tensor(p)


def checks() -> list[Check]:
    return [TagRanking(), PairRanking()]
