"""What a model's name may be: one rule for the repository API (load, index, infer),
``--models`` and the names ``clockwork compile`` / ``clockwork profile`` give packages
and profiles, so that a model made here can be loaded by its own name."""

from __future__ import annotations

import re

# a model's name: letters, digits, '_', '.' and '-', at most 128, not starting with '.'
# or '-'; MODEL_NAME also takes a copy's name, NAME:K (K >= 1 without a leading zero,
# at most 6 digits; copy 0 is NAME itself)
BASE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
MODEL_NAME = re.compile(BASE_NAME.pattern + r"(:[1-9][0-9]{0,5})?")
BASE_NAME_RULE = "letters, digits, '_', '.' and '-' (at most 128, not starting with '.' or '-')"
