"""sshddp: run PyTorch distributed training across GPU machines over plain SSH."""

from __future__ import annotations

__version__ = "0.4.0"
