"""How an embedding pools a sequence's final hidden states (after the final norm): their mean,
the last token's or the first token's (BERT's [CLS]); every vector is then L2-normalised. A model
declares its pooling (loading/embedding_spec.py) and a runner applies it (backends/base.py)."""

from __future__ import annotations

from typing import Literal

Pooling = Literal["mean", "last", "cls"]
POOLINGS: tuple[Pooling, ...] = ("mean", "last", "cls")
