"""The label contract at a glance (OBJ210): one real row of the grad batch, position by position —
input token, label, whether it trains, its share of the row's gradient — as the terminal,
Markdown and HTML reports show it. Built from a report dict only (the check's measured value),
so `objdebug render` shows it too; a report without the supervision-coverage check has none.
"""

from __future__ import annotations

from typing import Any

CHECK = "supervision-coverage"
HEADERS = ["pos", "input", "label", "trains", "grad share"]


def contract_tables(report: dict[str, Any], stage: str | None = None) -> list[dict[str, Any]]:
    """[{"title", "rows", "failing"}] for each supervision-coverage result (of `stage`) with a table."""
    out = []
    for res in report.get("results", []):
        if res.get("check") != CHECK or (stage is not None and res.get("stage") != stage):
            continue
        table = (res.get("value") or {}).get("contract") or {}
        positions = table.get("positions") or []
        if not positions:
            continue
        rows = [["…", "", "", "", ""] if p is None else
                [p["position"], p["input"], p["label"], p["trains"], f"{100.0 * p['share']:.1f}%"]
                for p in positions]
        shown = [p["position"] for p in positions if p is not None]
        title = (f"Label contract, row {table.get('row')}"
                 + (f" ({table['id']})" if table.get("id") else "")
                 + f": {table.get('length')} tokens, positions {shown[0]}..{shown[-1]} shown")
        failing = any(f.get("verdict") not in ("PASS", "SKIP") for f in res.get("findings", []))
        out.append({"title": title, "rows": rows, "failing": failing})
    return out
