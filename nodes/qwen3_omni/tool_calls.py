"""Function calls in a thinker reply: Qwen3's `<tool_call>` format, arguments constrained by xgrammar.

    calls = ToolCallDecoder.for_reply(omni, tools, choice="auto", parallel=True)
    allowed = calls.allowed(logits)        # before each token: a bool mask over the vocabulary, or None
    calls.accept(token)                    # after it: True while the token belongs to a call
    calls.finished                         # the calls made so far: [(name, arguments JSON text)]

A reply is free text until the model chooses `<tool_call>` (tool_choice `auto`), or a call from its
first token (`required`, or a named function: `<tool_call>` is forced). Inside a call every token is
chosen under a grammar compiled from the tools' JSON schemas (xgrammar, the structured-generation
library SGLang and vLLM use):

    \\n{"name": "<one of the tools>", "arguments": <JSON valid under that tool's parameters>}\\n</tool_call>

so the arguments are always valid JSON matching the schema, whatever the weights. After a call the
reply may end, or (with `parallel_tool_calls`) open another call; nothing else. `none` masks the
`<tool_call>` token out. A call is never cut off by the reply's token limit: past
`max(STEER_AFTER, limit)` tokens of a call, decoding prefers the tokens that close what is open
(quotes, brackets, the end marker), so a call ends within a few more tokens; `CALL_TOKEN_LIMIT` more
is a hard stop (the reply then ends without the call).
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from nodes.qwen3_omni.model import OmniModel

STEER_AFTER = 64
CALL_TOKEN_LIMIT = 256
# What closes an open JSON value fastest, most decisive first (a quote ends a string, a bracket a
# container; a comma or colon only moves on to what a schema still requires).
_CLOSERS = (('"',), ("}", "]"), (",",), (":",))
_GRAMMAR_CACHE_SIZE = 64


class ToolCallsUnavailable(RuntimeError):
    """The checkpoint's vocabulary has no `<tool_call>` token."""


class _Grammars:
    """Per model: the tokenizer as xgrammar sees it and the compiled call grammars (cached by tools)."""

    def __init__(self, omni: OmniModel):
        import xgrammar

        self.xgr = xgrammar
        vocab = int(omni.thinker.config.text_config.vocab_size)
        self.info = xgrammar.TokenizerInfo.from_huggingface(omni.tokenizer, vocab_size=vocab, stop_token_ids=sorted(omni.tokens.eos))
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=1)
        self.vocab = vocab
        self._cache: OrderedDict[str, Any] = OrderedDict()
        decoded = [omni.tokenizer.decode([i]) for i in range(min(vocab, len(omni.tokenizer)))]
        self.closers = []
        for texts in _CLOSERS:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[[i for i, text in enumerate(decoded) if text.strip(" ") in texts]] = True
            self.closers.append(mask)

    def call_grammar(self, tools: tuple[dict[str, Any], ...]) -> Any:
        """`\\n{"name": ..., "arguments": ...}\\n</tool_call>` over these tools, compiled."""
        key = json.dumps([[t["name"], t.get("parameters")] for t in tools], sort_keys=True)
        compiled = self._cache.get(key)
        if compiled is None:
            xgr = self.xgr
            closing = xgr.Grammar.from_ebnf("root ::= " + json.dumps("}\n</tool_call>"))
            bodies = []
            for tool in tools:
                opening = "\n" + '{"name": ' + json.dumps(tool["name"]) + ', "arguments": '
                schema = json.dumps(tool.get("parameters") or {"type": "object"})
                bodies.append(xgr.Grammar.concat(
                    xgr.Grammar.from_ebnf("root ::= " + json.dumps(opening)),
                    xgr.Grammar.from_json_schema(schema, any_whitespace=False),
                    closing,
                ))
            compiled = self.compiler.compile_grammar(bodies[0] if len(bodies) == 1 else xgr.Grammar.union(*bodies))
            self._cache[key] = compiled
            while len(self._cache) > _GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return compiled


_grammars: weakref.WeakKeyDictionary[OmniModel, _Grammars] = weakref.WeakKeyDictionary()


def _grammars_for(omni: OmniModel) -> _Grammars:
    grammars = _grammars.get(omni)
    if grammars is None:
        grammars = _grammars[omni] = _Grammars(omni)
    return grammars


@dataclass
class ToolCallDecoder:
    omni: OmniModel
    tools: tuple[dict[str, Any], ...]
    choice: str | dict[str, str]
    parallel: bool
    limit: int  # the reply's own token limit (a call may run past it, see the module docstring)
    finished: list[tuple[str, str]] = field(default_factory=list)
    _grammars: _Grammars | None = None
    _matcher: Any = None  # set while a call is open
    _call_ids: list[int] = field(default_factory=list)
    _tokens: int = 0  # reply tokens so far

    @classmethod
    def for_reply(cls, omni: OmniModel, tools: tuple[dict[str, Any], ...], choice: str | dict[str, str] = "auto",
                  parallel: bool = True, limit: int = 2048) -> ToolCallDecoder | None:
        """The decoder for a reply with these tools (None: no tools, nothing to do)."""
        if not tools:
            return None
        if omni.tokens.tool_call is None or omni.tokens.tool_call_end is None:
            raise ToolCallsUnavailable("this checkpoint's vocabulary has no <tool_call> token")
        if isinstance(choice, dict):
            tools = tuple(t for t in tools if t["name"] == choice["name"])
        decoder = cls(omni, tools, choice, parallel, limit)
        if choice != "none":
            decoder._grammars = _grammars_for(omni)
            decoder._grammars.call_grammar(tools)  # compile now: the first token must not wait for it
        return decoder

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    @property
    def in_call(self) -> bool:
        return self._matcher is not None

    def allowed(self) -> torch.Tensor | None:
        """Which tokens may come next (True = allowed), or None when any may."""
        tokens = self.omni.tokens
        vocab = self._vocab
        if self.choice == "none":
            mask = torch.ones(vocab, dtype=torch.bool)
            mask[tokens.tool_call] = False
            return mask
        if self._matcher is not None:
            xgr = self._grammars.xgr
            bitmask = xgr.allocate_token_bitmask(1, vocab)
            self._matcher.fill_next_token_bitmask(bitmask)
            logits = torch.zeros(1, vocab)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            mask = logits[0] == 0
            # The markers are single tokens that the grammar would also take as text inside a
            # JSON string: `</tool_call>` only where it ends the call, `<tool_call>` never.
            mask[tokens.tool_call] = False
            if self._matcher.find_jump_forward_string() == "</tool_call>":
                return self._only(tokens.tool_call_end)
            mask[tokens.tool_call_end] = False
            if len(self._call_ids) >= max(STEER_AFTER, self.limit):  # close what is open: the call must end soon
                for closer in self._grammars.closers:
                    if bool((mask & closer).any()):
                        return mask & closer
            return mask
        if self.forced and not self.finished:
            return self._only(tokens.tool_call)
        if self.finished:  # after a call: the reply ends, or another call opens
            mask = self._only(*tokens.eos)
            if self.parallel:
                mask[tokens.tool_call] = True
            return mask
        return None

    def accept(self, token: int) -> bool:
        """Take the chosen token; True when it belongs to a call (it is not spoken)."""
        self._tokens += 1
        if self._matcher is not None:
            if not self._matcher.accept_token(token):
                raise RuntimeError(f"token {token} is outside the call grammar")  # `allowed` was not applied
            self._call_ids.append(token)
            if self._matcher.is_terminated():
                self.finished.append(self._parse(self._call_ids))
                self._matcher, self._call_ids = None, []
            return True
        if token == self.omni.tokens.tool_call and self.choice != "none":
            xgr = self._grammars.xgr
            self._matcher = xgr.GrammarMatcher(self._grammars.call_grammar(self.tools), terminate_without_stop_token=True)
            self._call_ids = []
            return True
        return False

    def over_limit(self) -> bool:
        """A call has run into `CALL_TOKEN_LIMIT` past the point where it was steered to close."""
        return self._matcher is not None and len(self._call_ids) >= max(STEER_AFTER, self.limit) + CALL_TOKEN_LIMIT

    @property
    def _vocab(self) -> int:
        return int(self.omni.thinker.config.text_config.vocab_size)

    def _only(self, *token_ids: int) -> torch.Tensor:
        mask = torch.zeros(self._vocab, dtype=torch.bool)
        mask[list(token_ids)] = True
        return mask

    def _parse(self, ids: list[int]) -> tuple[str, str]:
        text = self.omni.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        body = text.rsplit("</tool_call>", 1)[0]
        call = json.loads(body)
        return call["name"], json.dumps(call["arguments"], ensure_ascii=False)
