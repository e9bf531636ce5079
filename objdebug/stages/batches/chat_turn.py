"""One turn of a conversation row and the kinds of its positions: shared by the id path
(chat_roles) and the text path (chat_text), which both build them."""

from __future__ import annotations

from dataclasses import dataclass, field

PREAMBLE, HEADER, CONTENT, STOP, TAIL, FIXED = "preamble", "header", "content", "stop", "tail", "fixed"


@dataclass
class Turn:
    role: str
    number: int             # 1-based, in the row
    start: int              # the header's first position
    content: tuple[int, int]  # [begin, end) of the content
    stop: list[int] = field(default_factory=list)  # positions of the stop tokens (the model must learn them)
    truncated: bool = False  # the row ends inside the content: no stop to find
