"""Is this text valid JSON, or the start of it? With a schema: JSON (or its
start) that the schema allows. For tests that assert a constraint held on
output the model may not have finished (the random demo model rarely
closes an unbounded JSON value), checked with xgrammar, the grammar
library vLLM constrains with.
"""

from __future__ import annotations

import json
from typing import Any


def _matcher(schema: dict[str, Any] | None) -> Any:
    import xgrammar as xgr

    grammar = (
        xgr.Grammar.from_json_schema(json.dumps(schema)) if schema is not None else xgr.Grammar.builtin_json_grammar()
    )
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(grammar)
    return xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)


def is_json_prefix(text: str, schema: dict[str, Any] | None = None) -> bool:
    """True when `text` is a prefix of a JSON document (that `schema` allows)."""
    return bool(_matcher(schema).accept_string(text))


def is_complete_json(text: str, schema: dict[str, Any] | None = None) -> bool:
    """True when `text` is a whole JSON document (that `schema` allows)."""
    matcher = _matcher(schema)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())
