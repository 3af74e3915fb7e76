"""The OpenAI wire format: request bodies checked into :class:`Job` specs, results and
stream chunks shaped as OpenAI's, and errors in its error shape.

Fields of OpenAI's, vLLM's, llama-server's or llama-cpp-python's requests that this server
does not honour (the table :data:`specdec.refused.REFUSED`) are refused with a 400 naming them
rather than silently ignored; unknown fields are ignored, as OpenAI-compatible servers do.

Structured output comes in the fields of three APIs, each one of :class:`specdec.Constraint`'s
options (``CONSTRAINT_FIELDS``): OpenAI's ``response_format`` (``json_object``,
``json_schema``), llama-server's ``grammar`` / ``json_schema``, vLLM's ``guided_json`` /
``guided_regex`` / ``guided_choice`` / ``guided_grammar``; ``tools`` / ``tool_choice`` are
read here and constrained as ``tools.py`` says.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._core import Model
from ..chat import DEFAULT_LIMITS, TemplateLimits, chat_prompt, check_variables, template_for
from ..config import MAX_REPETITION_PENALTY, Sampling, bias_pairs
from .._request import Request
from ..refused import refusal, refused_field
from ..results import GenerationResult, Stats, TokenLogprob
from . import tools as tool_calls

#: OpenAI's limits
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
#: the most choices (``n``) one request may ask (each is a request of its own on the engine)
MAX_N = 16
#: OpenAI's default for /v1/completions; chat runs to its end of turn or the context
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: the request-body field for specdec's own per-request options
EXTENSION = "specdec"
#: the options it may carry (an Engine's: a Decoder takes none)
EXTENSION_OPTIONS = ("drafter", "n_max")


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: str = "invalid_request_error") -> None:
        # a client's text quoted back may hold lone surrogates, which no UTF-8 body can carry
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class Spec:
    """A checked request body: what to run (``requests`` makes the core's requests of it)
    and how the answer is shaped."""

    kind: str                          # "completion" | "chat"
    model: str
    prompt: Any                        # text or token ids (completions); messages (chat)
    max_tokens: Optional[int]          # None: to the end of the context
    sampling: Sampling
    stop: List[str]
    stop_token_ids: List[int] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int = -1                 # -1 none, 0 chosen token only, k: top-k too
    options: Dict[str, Any] = field(default_factory=dict)   # the ``specdec`` extension
    template_vars: Dict[str, Any] = field(default_factory=dict)
    n: int = 1                         # choices, each its own request (seed + i when seeded)
    constraint: Dict[str, Any] = field(default_factory=dict)  # one Constraint option, or none
    constraint_field: Optional[str] = None     # the request field that gave it
    tools: Optional[List[Dict[str, Any]]] = None           # chat: checked OpenAI tools
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    tool_format: Optional[str] = None      # the template's tool-call format (tools rendered)

    def samplings(self) -> List[Sampling]:
        """Each choice's sampling (``Sampling.for_choice``)."""
        return [self.sampling.for_choice(i) for i in range(self.n)]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: Mapping[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise bad(f"'{name}' must be a number in [{lo}, {hi}], got {v!r:.40}", name)
    return float(v)


def _int(body: Mapping[str, Any], name: str, lo: int, hi: int) -> Optional[int]:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v) or not lo <= v <= hi:
        raise bad(f"'{name}' must be an integer in [{lo}, {hi}], got {v!r:.40}", name)
    return int(v)


def _refuse_unsupported(body: Mapping[str, Any], within: Optional[str] = None) -> None:
    """A field another server defines and specdec does not honour: a 400 naming it."""
    name = refused_field(body)
    if name is not None:
        raise bad(refusal(name), within or name, code="unsupported_parameter")


#: request field -> the Constraint option it gives (llama-server's and vLLM's names)
CONSTRAINT_FIELDS: Dict[str, str] = {
    "grammar": "grammar", "json_schema": "json_schema", "guided_json": "json_schema",
    "guided_regex": "regex", "guided_choice": "choices", "guided_grammar": "grammar",
}


def _response_format(fmt: Any) -> Optional[Dict[str, Any]]:
    """OpenAI's ``response_format`` as a Constraint option (None: free text)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_schema": {"type": "object"}}
    if kind == "json_schema":
        js = fmt.get("json_schema")
        if not isinstance(js, Mapping):
            raise bad("'response_format': its 'json_schema' must be an object with a 'schema'",
                      "response_format")
        schema = js.get("schema", {"type": "object"})
        if not isinstance(schema, Mapping):
            raise bad("'response_format': its json_schema 'schema' must be a JSON schema "
                      "object", "response_format")
        return {"json_schema": dict(schema)}
    raise bad("'response_format': its 'type' must be 'text', 'json_object' or 'json_schema'",
              "response_format")


def _constraint(body: Mapping[str, Any]) -> Tuple[Optional[str], Dict[str, Any]]:
    """The request's constraint: the field that gives it, and ``{option: value}`` (empty:
    none); at most one such field."""
    found: Dict[str, Tuple[str, Any]] = {}
    rf = _response_format(body.get("response_format"))
    if rf:
        found["response_format"] = next(iter(rf.items()))
    for name, option in CONSTRAINT_FIELDS.items():
        v = body.get(name)
        if v is not None:
            found[name] = (option, v)
    if len(found) > 1:
        raise bad(f"give one of {sorted(found)}, not several", sorted(found)[1])
    for name, (option, value) in found.items():
        return name, {option: value}
    return None, {}


def _stop(body: Mapping[str, Any]) -> List[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v) or len(v) > MAX_STOP:
        raise bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them",
                  "stop")
    return list(v)


def _stop_token_ids(body: Mapping[str, Any]) -> List[int]:
    """vLLM's ``stop_token_ids`` (ids in the vocabulary are checked when the job is made)."""
    v = body.get("stop_token_ids")
    if v is None:
        return []
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise bad("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    return list(v)


def _options(body: Mapping[str, Any]) -> Dict[str, Any]:
    v = body.get(EXTENSION)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise bad(f"'{EXTENSION}' must be an object", EXTENSION)
    return dict(v)


def _sampling(body: Mapping[str, Any]) -> Sampling:
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad(f"'seed' must be an integer, got {seed!r:.40}", "seed")
    top_k = _int(body, "top_k", 0, 1 << 30)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p == 0:
        raise bad("'top_p' must be in (0, 1]", "top_p")
    bias = body.get("logit_bias")
    try:
        logit_bias = bias_pairs({} if bias is None else bias)
    except ValueError as e:
        raise bad(str(e), "logit_bias") from None
    try:
        return Sampling(temperature=_number(body, "temperature", 0.0, 2.0, 1.0), top_p=top_p,
                        top_k=top_k or 0, min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
                        seed=None if seed is None else seed % 2**64,
                        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
                        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
                        repetition_penalty=_number(body, "repetition_penalty", 1e-3,
                                                   MAX_REPETITION_PENALTY, 1.0),
                        logit_bias=logit_bias)
    except (TypeError, ValueError) as e:
        raise bad(str(e)) from None


def _common(body: Any, kind: str, models: Sequence[str]) -> Dict[str, Any]:
    if not isinstance(body, Mapping):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        model = models[0]     # OpenAI requires it; a one-model server need not
    if not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    if model not in models:
        raise APIError(404, f"The model '{model:.200}' does not exist (this server has: "
                       f"{', '.join(models)})", param="model", code="model_not_found")
    _refuse_unsupported(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, Mapping):
        raise bad("'stream_options' must be an object", "stream_options")
    if so is not None and not stream:     # as OpenAI and vLLM answer it
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    so = so or {}
    if not isinstance(so.get("include_usage", False), (bool, type(None))):
        raise bad("'stream_options.include_usage' must be a boolean", "stream_options")
    _refuse_unsupported(so, "stream_options")     # vLLM's continuous_usage_stats
    n = _int(body, "n", 1, MAX_N)
    con_field, con = _constraint(body)
    return dict(kind=kind, model=model, stream=stream, n=1 if n is None else n,
                include_usage=so.get("include_usage") is True,
                sampling=_sampling(body), stop=_stop(body),
                stop_token_ids=_stop_token_ids(body), options=_options(body),
                constraint=con, constraint_field=con_field)


def completion_spec(body: Any, models: Sequence[str]) -> Spec:
    """A ``/v1/completions`` body."""
    common = _common(body, "completion", models)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]           # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(_is_int(t) for t in prompt):
            raise bad("'prompt' must be a string, a list of token ids, or a list of one of "
                      "them (batches are not supported)", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad("'prompt' must be a non-empty string or a list of token ids", "prompt")
    max_tokens = _int(body, "max_tokens", 1, 2**31 - 1)
    logprobs = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    return Spec(prompt=prompt, logprobs=-1 if logprobs is None else logprobs,
                max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                **common)


def chat_spec(body: Any, models: Sequence[str]) -> Spec:
    """A ``/v1/chat/completions`` body (messages are checked when the template renders them)."""
    common = _common(body, "chat", models)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    max_tokens = _int(body, "max_completion_tokens", 1, 2**31 - 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, 2**31 - 1)
    want = body.get("logprobs", False)
    if not isinstance(want, bool) and want is not None:
        raise bad("'logprobs' must be a boolean", "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not want:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping):
        raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    try:
        check_variables(kwargs)
    except ValueError as e:
        raise bad(f"'chat_template_kwargs': {e}", "chat_template_kwargs") from None
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and tools != []:
        try:
            tools = tool_calls.check_tools(tools)
            tool_calls.chosen(tools, choice)
        except tool_calls.ToolError as e:
            raise bad(str(e), "tools") from None
    else:
        if choice not in (None, "none", "auto"):
            raise bad("'tool_choice' needs 'tools'", "tool_choice")
        tools = None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    return Spec(prompt=messages, max_tokens=max_tokens,
                logprobs=(top or 0) if want else -1, template_vars=dict(kwargs), tools=tools,
                tool_choice=choice, parallel_tool_calls=parallel, **common)


def _tools(spec: Spec, model: Model, chat_template: Optional[str]) -> None:
    """A chat with tools: the template renders them, and a reply that must call one is
    constrained to the template's tool-call format (``tools.py``)."""
    if not spec.tools or spec.tool_choice == "none":
        return
    try:
        source = template_for(model, chat_template).source
    except ValueError as e:
        raise bad(str(e), "tools") from None
    spec.tool_format = tool_calls.template_format(source)
    if spec.tool_format is None:
        raise bad("this model's chat template writes no tool-call format specdec knows "
                  f"({', '.join(tool_calls.FORMATS)})", "tools")
    spec.template_vars["tools"] = spec.tools
    must = tool_calls.chosen(spec.tools, spec.tool_choice)
    if must is not None:
        if spec.constraint:
            raise bad("a reply that must call a tool takes no response_format or grammar",
                      "tool_choice")
        spec.constraint = {"lark": tool_calls.grammar(spec.tool_format, must,
                                                      spec.parallel_tool_calls)}
        spec.constraint_field = "tools"


def prompt_tokens(model: Model, spec: Spec, chat_template: Optional[str],
                  template_limits: TemplateLimits = DEFAULT_LIMITS
                  ) -> Tuple[List[int], List[str], List[int]]:
    """Prompt tokens, and the stop strings and stop tokens the chat template adds."""
    if spec.kind == "chat":
        try:
            p = chat_prompt(model, spec.prompt, chat_template=chat_template,
                            template_limits=template_limits, **spec.template_vars)
        except (ValueError, TypeError) as e:
            raise bad(str(e), "messages") from None
        return p.tokens, p.stop, p.stop_token_ids
    if isinstance(spec.prompt, str):
        return model.tokenize(spec.prompt, add_special=True, parse_special=True), [], []
    n_vocab = model.n_vocab
    if not all(0 <= t < n_vocab for t in spec.prompt):
        raise bad(f"prompt token ids must be in [0, {n_vocab})", "prompt")
    return list(spec.prompt), [], []


def requests(spec: Spec, core: Any, chat_template: Optional[str],
             template_limits: TemplateLimits = DEFAULT_LIMITS) -> List[Request]:
    """What ``spec`` runs on ``core`` (a ``specdec.scheduler.Scheduler``), one checked
    :class:`~specdec._request.Request` per choice, built here once and run as it is: its
    prompt rendered and tokenized (within ``template_limits``), ``max_tokens`` held to the
    room a request has in the core's context, the ``specdec`` extension's drafter and
    ``n_max``. A field the core refuses raises its ``ValueError`` / ``TypeError``
    (``ImportError`` for a constraint without llguidance)."""
    model = core.model
    _tools(spec, model, chat_template)
    tokens, stops, stop_ids = prompt_tokens(model, spec, chat_template, template_limits)
    room = core.n_ctx_seq - len(tokens)
    if room < 1:
        raise APIError(413, f"the prompt is {len(tokens)} tokens; this server's context "
                       f"holds {core.n_ctx_seq} per request, generation included",
                       param="prompt" if spec.kind == "completion" else "messages",
                       code="context_length_exceeded")
    return [core.request(tokens, max_tokens=min(spec.max_tokens or room, 2**31 - 1),
                         sampling=sampling, stop=spec.stop + stops,
                         logprobs=None if spec.logprobs < 0 else spec.logprobs,
                         stop_token_ids=spec.stop_token_ids + stop_ids,
                         drafter=spec.options.get("drafter"), n_max=spec.options.get("n_max"),
                         **spec.constraint)
            for sampling in spec.samplings()]


# --- answers ----------------------------------------------------------------------------

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def finish_reason(res: GenerationResult) -> str:
    return FINISH.get(res.finish_reason or "", "stop")


def usage(stats: Sequence[Stats]) -> Dict[str, Any]:
    """OpenAI's token counts (the prompt once, the choices' completions summed), and the
    speculation stats beside them (summed over the choices)."""
    n_prompt = stats[0].n_prompt
    n_gen = sum(st.n_generated for st in stats)
    drafted = sum(st.drafted for st in stats)
    accepted = sum(st.accepted for st in stats)
    t_gen = max(st.t_generate_s for st in stats)

    def per_position(name: str) -> List[int]:
        lists = [getattr(st, name) for st in stats]
        return [sum(x[i] for x in lists if i < len(x)) for i in range(max(map(len, lists)))]
    return {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
            "speculation": {"drafted": drafted, "accepted": accepted,
                            # null: nothing was drafted, so nothing was measured
                            "acceptance_rate": accepted / drafted if drafted else None,
                            "rounds": sum(st.rounds for st in stats),
                            "draft_rounds": sum(st.draft_rounds for st in stats),
                            "accepted_per_position": per_position("accepted_per_position"),
                            "drafted_per_position": per_position("drafted_per_position"),
                            "tokens_per_s": (stats[0].tokens_per_s if len(stats) == 1
                                             else n_gen / t_gen if t_gen > 0 else 0.0),
                            "t_prompt_s": max(st.t_prompt_s for st in stats),
                            "t_generate_s": t_gen}}


@dataclass
class Envelope:
    """The fields every response and chunk of one request share."""

    kind: str
    model: str
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def wrap(self, obj: str, choices: List[Dict[str, Any]], **extra: Any) -> Dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, **extra}


# logprobs: a token as (its bytes, logprob, [(alt bytes, alt logprob), ...]); the bytes, not
# their text: a token may hold part of a UTF-8 character (a byte-fallback token), whose text
# alone is U+FFFD, while chat's ``bytes`` must let a client join the character back
TokenLP = Tuple[bytes, float, List[Tuple[bytes, float]]]


def token_logprobs(model: Model, tokens: List[int], lps: Optional[List[TokenLogprob]]
                   ) -> Optional[List[TokenLP]]:
    """A result's per-token logprobs as (bytes, logprob, [(alt bytes, logprob)])."""
    if lps is None:
        return None
    piece = model.token_to_piece
    return [(piece(t), lp.logprob, [(piece(a), alp) for a, alp in lp.top])
            for t, lp in zip(tokens, lps)]


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


def chat_logprobs(items: List[TokenLP]) -> Dict[str, Any]:
    def one(piece: bytes, lp: float) -> Dict[str, Any]:
        return {"token": _text(piece), "logprob": lp, "bytes": list(piece)}
    return {"content": [dict(one(t, lp), top_logprobs=[one(a, alp) for a, alp in top])
                        for t, lp, top in items]}


def completion_logprobs(items: List[TokenLP], offset: int) -> Dict[str, Any]:
    # ``text_offset``: where in the text the character holding a token's first byte begins.
    # A token may hold part of a character (a byte-fallback token): its text alone is U+FFFD,
    # so counting that text moved the offsets past the end of the text. ``offset`` is the
    # text before ``items``, so a character begun before them (a stream's held-back part)
    # begins there.
    offsets = []
    start = offset                     # where the last character begun so far begins
    for t, _, _ in items:
        offsets.append(start if t and t[0] & 0xC0 == 0x80 else offset)
        for b in t:
            if b & 0xC0 != 0x80:       # not a UTF-8 continuation byte: a character begins
                start, offset = offset, offset + 1
    return {"tokens": [_text(t) for t, _, _ in items],
            "token_logprobs": [lp for _, lp, _ in items],
            "top_logprobs": [{_text(a): alp for a, alp in top} for _, _, top in items],
            "text_offset": offsets}


def full_response(env: Envelope, results: Sequence[GenerationResult],
                  logprobs: Sequence[Optional[List[TokenLP]]],
                  tool_format: Optional[str] = None) -> Dict[str, Any]:
    """The whole answer (``stream: false``): one choice per result; ``tool_format``: a chat
    with tools, whose replies are read as ``tool_calls`` where they hold calls."""
    choices = []
    for i, (res, lps) in enumerate(zip(results, logprobs)):
        if env.kind == "chat":
            message: Dict[str, Any] = {"role": "assistant", "content": res.text}
            finish = finish_reason(res)
            content, calls = (tool_calls.parse(tool_format, res.text) if tool_format
                              else (res.text, []))
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls" if finish == "stop" else finish
            choices.append({"index": i, "message": message,
                            "logprobs": chat_logprobs(lps) if lps is not None else None,
                            "finish_reason": finish})
        else:
            choices.append({"index": i, "text": res.text,
                            "logprobs": completion_logprobs(lps, 0) if lps is not None else None,
                            "finish_reason": finish_reason(res)})
    obj = "chat.completion" if env.kind == "chat" else "text_completion"
    return env.wrap(obj, choices, usage=usage([r.stats for r in results]))


def chunk(env: Envelope, text: Optional[str], *, index: int = 0, first: bool = False,
          finish: Optional[str] = None, logprobs: Optional[List[TokenLP]] = None,
          offset: int = 0) -> Dict[str, Any]:
    """One stream chunk of choice ``index``: a piece of text, or (``finish``) its last one."""
    if env.kind == "chat":
        delta: Dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "finish_reason": finish,
                  "logprobs": chat_logprobs(logprobs) if logprobs else None}
        return env.wrap("chat.completion.chunk", [choice])
    choice = {"index": index, "text": text or "", "finish_reason": finish,
              "logprobs": completion_logprobs(logprobs, offset) if logprobs else None}
    return env.wrap("text_completion", [choice])


def usage_chunk(env: Envelope, stats: Sequence[Stats]) -> Dict[str, Any]:
    obj = "chat.completion.chunk" if env.kind == "chat" else "text_completion"
    return env.wrap(obj, [], usage=usage(stats))


class Chunks:
    """The chunks of one streamed answer of ``n`` choices, in order: the server sends each
    as an event, the Python face (:mod:`specdec.openai_face`) yields each as a dict."""

    def __init__(self, env: Envelope, include_usage: bool, n: int = 1,
                 tool_format: Optional[str] = None) -> None:
        self.env = env
        self.include_usage = include_usage
        self.offsets = [0] * n
        # a chat with tools: each reply read as it decodes, its calls sent as OpenAI's deltas
        self.calls = ([tool_calls.CallStream(tool_format) for _ in range(n)] if tool_format
                      else None)
        # logprobs held with their text go out with the choice's next chunk (or none were sent)
        self.held: List[List[TokenLP]] = [[] for _ in range(n)]

    def start(self) -> List[Dict[str, Any]]:
        """Before the first piece: chat announces the assistant's role in each choice."""
        if self.env.kind != "chat":
            return []
        return [chunk(self.env, "", index=i, first=True) for i in range(len(self.offsets))]

    def piece(self, index: int, text: str, logprobs: Optional[List[TokenLP]]
              ) -> List[Dict[str, Any]]:
        """The chunks of a piece of choice ``index`` (none while a tool call's text may
        be beginning)."""
        if self.calls is not None:
            self.held[index] += logprobs or []
            return [self._delta(index, d) for d in self.calls[index].feed(text)]
        c = chunk(self.env, text, index=index, logprobs=logprobs, offset=self.offsets[index])
        self.offsets[index] += len(text)
        return [c]

    def end(self, index: int, res: GenerationResult) -> List[Dict[str, Any]]:
        """After a choice's last piece: what it held back, and its finish reason
        (``tool_calls`` for a reply that called tools)."""
        finish = finish_reason(res)
        if self.calls is None:
            return [chunk(self.env, None, index=index, finish=finish)]
        reply = self.calls[index]
        out = [self._delta(index, d) for d in reply.close()]
        if reply.called and finish == "stop":
            finish = "tool_calls"
        lps, self.held[index] = self.held[index], []
        return out + [chunk(self.env, None, index=index, finish=finish, logprobs=lps or None)]

    def _delta(self, index: int, delta: Tuple[str, Any]) -> Dict[str, Any]:
        kind, value = delta
        lps, self.held[index] = self.held[index], []
        if kind == "content":
            return chunk(self.env, value, index=index, logprobs=lps)
        return self.env.wrap("chat.completion.chunk", [
            {"index": index, "delta": {"tool_calls": [value]}, "finish_reason": None,
             "logprobs": chat_logprobs(lps) if lps else None}])

    def usage(self, results: Sequence[GenerationResult]) -> List[Dict[str, Any]]:
        """After every choice's end: the usage, when it was asked for."""
        return [usage_chunk(self.env, [r.stats for r in results])] if self.include_usage else []
