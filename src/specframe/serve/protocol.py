"""The OpenAI wire format: request validation into decoding options, response and chunk shapes, errors.

Requests are validated here by hand rather than by a schema library, so that every problem becomes an
OpenAI-style error naming the parameter (``{"error": {"message", "type", "param", "code"}}``) and no client
input can reach the decoder unchecked. Nothing here touches a decoder: :class:`Job` carries what the engine
needs (:mod:`specframe.serve.engine`), and :class:`OutputText` turns the engine's token ids into the text a
client sees.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specframe.decoder import MAX_SEED, as_integer
from specframe.models.tokenizer import unicode_problem
from specframe.streaming import IncrementalText

#: OpenAI's limit on stop strings per request.
MAX_STOP = 4
#: Parameters of OpenAI's API that specframe does not implement, with the values that ask for nothing (``null``,
#: or leaving the field out, always does). Other values are refused, never ignored; a value must be of the
#: neutral one's JSON type (``echo: 0`` is not ``false``). In completions, ``logprobs`` is an integer and
#: ``0`` asks for the sampled tokens' log-probabilities (OpenAI's API returns them), so only ``null`` is
#: neutral; in chat it is a boolean and ``false`` is neutral. ``tool_choice`` ``"auto"`` with no tools (any
#: tools are refused) calls none, as ``"none"`` does.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (),
    "top_logprobs": (0,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "parallel_tool_calls": (True, False),
}
#: Chat's neutral values: ``logprobs`` is a boolean there.
CHAT_NEUTRAL = {**NEUTRAL, "logprobs": (False,)}
#: Why a non-neutral value of a parameter is refused, where the name alone does not say.
_UNSUPPORTED = {
    "logprobs": "log-probabilities are not returned (in completions, logprobs 0 asks for the sampled tokens' ones)",
    "top_logprobs": "log-probabilities are not returned",
    "echo": "the prompt is not echoed back",
    "best_of": "one choice is decoded per request",
    "response_format": "the output is plain text, never constrained to JSON",
}
#: Longest echo of a client's value in an error message; a longer value is cut, and its length said.
SHOWN_CHARS = 60
#: Longest error message: a longer one (a library error quoting client input) keeps its start and its end.
MAX_MESSAGE_CHARS = 1000
#: Parameters accepted and ignored (they change nothing about decoding).
IGNORED = ("user", "metadata", "store", "service_tier")
COMMON = ("model", "stream", "stream_options", "temperature", "top_p", "max_tokens", "stop", "seed", "n")
EXTRA = ("schedule", "width", "order", "top_k")  # specframe's own fields
COMPLETION_FIELDS = frozenset((*COMMON, *EXTRA, *NEUTRAL, *IGNORED, "prompt"))
CHAT_FIELDS = frozenset((*COMMON, *EXTRA, *NEUTRAL, *IGNORED, "messages", "max_completion_tokens"))
CHAT_ROLES = ("system", "developer", "user", "assistant")


class APIError(Exception):
    """A request the server refuses, as OpenAI reports it.

    The message and ``param`` are made safe to send whatever client input they quote: characters UTF-8 cannot
    encode (lone surrogates) are escaped, and a message over :data:`MAX_MESSAGE_CHARS` is cut in the middle.

    Args:
        status: HTTP status (4xx for the client's problems).
        message: What is wrong and what to do.
        param: The request parameter at fault, if one is.
        code: A machine-readable code (``"model_not_found"``, ``"rate_limit_exceeded"``...).
        type: OpenAI's error type; chosen from the status when not given.
    """

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        message = _bounded(_encodable(message), MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = None if param is None else _bounded(_encodable(param), SHOWN_CHARS)
        self.code = code
        self.type = type or _error_type(status)

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _error_type(status: int) -> str:
    return {
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        503: "server_unavailable",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")


def _encodable(text: str) -> str:
    r"""``text`` with what UTF-8 cannot encode (lone surrogates) escaped, as ``\ud800``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _bounded(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and end and saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}...[{len(text) - 2 * keep} characters cut]...{text[-keep:]}"


def shown(value: Any) -> str:
    """A client's value as an error message quotes it: JSON, at most :data:`SHOWN_CHARS` characters.

    A longer value is cut, saying its length (a 4000-digit seed or a 100 KB model name is not echoed whole).
    """
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > SHOWN_CHARS:
        text = f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
    return _encodable(text)


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """A 400 error about ``param``."""
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for.

    Attributes:
        max_body_bytes: Largest request body.
        max_prompt_tokens: Longest prompt, in tokens.
        max_tokens: Largest ``max_tokens`` a request may ask for (and the default of chat requests).
        max_width: Widest speculative width a request may ask for (rows per call grow with it).
        default_completion_tokens: ``max_tokens`` of a completion request that gives none (OpenAI's 16).
    """

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 4096
    max_tokens: int = 1024
    max_width: int = 32
    default_completion_tokens: int = 16


@dataclass(frozen=True)
class DecodeOptions:
    """The options that select a decoder (hashable: the engine keeps one pool of decoders per value).

    Attributes:
        schedule: The decoder config's ``schedule`` value, as canonical JSON.
        order: The ``order`` value, as canonical JSON.
        acceptance: The ``acceptance`` value, as canonical JSON.
        width: A width >= 1 or ``"auto"``.
        stop: Stop strings.
    """

    schedule: str
    order: str
    acceptance: str
    width: int | str
    stop: tuple[str, ...] = ()

    def config(self) -> dict[str, Any]:
        """The decoder config keys these options set (``model`` and the rest come from the server)."""
        return {
            "schedule": json.loads(self.schedule),
            "order": json.loads(self.order),
            "acceptance": json.loads(self.acceptance),
            "width": self.width,
            "stop": list(self.stop),
        }

    @property
    def greedy(self) -> bool:
        """Whether these options decode greedily (the output then does not depend on the seed)."""
        return json.loads(self.acceptance) == "greedy"


@dataclass
class Job:
    """One validated request on its way to the engine.

    Attributes:
        kind: ``"completion"`` or ``"chat"``.
        prompt_ids: Prompt token ids (BOS applied).
        options: Which decoder to use.
        max_tokens: Output length limit.
        seed: Sampling seed; ``None`` for a fresh random one.
        stream: Whether the client asked for server-sent events.
        include_usage: Whether a streamed response ends with a usage chunk.
        model: The served model id (echoed in responses).
        id: Response id.
        created: Unix time of arrival.
        arrived: ``time.perf_counter()`` at arrival (for latency metrics).
    """

    kind: str
    prompt_ids: list[int]
    options: DecodeOptions
    max_tokens: int
    seed: int | None
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    arrived: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class Defaults:
    """The server's decoding defaults (``specframe serve --schedule/--width/--order``)."""

    schedule: Any = "packed"
    width: int | str = "auto"
    order: Any = "ltr"


# -- reading requests ------------------------------------------------------------------------------------


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        APIError: 400 for a body that is not UTF-8, not JSON, or not an object.
    """
    if not body.strip():
        raise bad("the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"the request body is not UTF-8 (byte {exc.start})", code="invalid_json") from None

    def constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise bad(f"the request body must be a JSON object, got a JSON {_json_type(value)}", code="invalid_json")
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _number(body: Mapping[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{name} must be a number, got a JSON {_json_type(value)}", name, "invalid_type")
    if not low <= value <= high:
        raise bad(f"{name} must lie in [{low:g}, {high:g}], got {shown(value)}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    number = as_integer(value) if not isinstance(value, float) else None
    if number is None:
        raise bad(f"{name} must be an integer, got {shown(value)}", name, "invalid_type")
    return number


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise bad(f"{name} must be a string, got a JSON {_json_type(value)}", name, "invalid_type")
    problem = unicode_problem(value)
    if problem:
        raise bad(f"{name}: {problem}", name)
    return value


def _plugin(value: Any, name: str) -> str:
    """A plugin field (a name, or an object with ``name`` and options) as canonical JSON."""
    if isinstance(value, str):
        if not value.strip() or ":" in value:
            raise bad(
                f"{name} must be a registered {name} name (options go in an object: "
                f'{{"name": "kbranch", "k": 3}}), got {shown(value)}',
                name,
            )
        return json.dumps(value)
    if isinstance(value, dict):
        if not isinstance(value.get("name"), str) or not value["name"].strip():
            raise bad(f'{name} as an object needs a string "name", got {shown(value)}', name)
        for key, option in value.items():
            if isinstance(option, (dict, list)):
                raise bad(f"{name} option {shown(key)} must be a number, string, boolean or null", name, "invalid_type")
        return json.dumps(value, sort_keys=True)
    raise bad(f"{name} must be a name or an object with a name and options, got a JSON {_json_type(value)}", name)


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str], neutral: Mapping[str, tuple[Any, ...]]) -> None:
    """Refuse unknown fields, and fields of :data:`NEUTRAL` at a value that asks for something."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        names = ", ".join(shown(name) for name in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise bad(
            f"unrecognized request argument(s): {names}{more}; specframe's own fields are {', '.join(EXTRA)}",
            unknown[0],
            "unknown_parameter",
        )
    for name, values in neutral.items():
        value = body.get(name)
        if value is None or any(type(value) is type(v) and value == v for v in values):
            continue
        why = f": {_UNSUPPORTED[name]}" if name in _UNSUPPORTED else ""
        choices = " or ".join(json.dumps(v) for v in (None, *values))
        raise bad(
            f"{name} {shown(value)} is not supported by specframe serve{why}; leave it out or send {choices}",
            name,
            "unsupported_value",
        )


def decode_options(body: Mapping[str, Any], defaults: Defaults, limits: Limits) -> DecodeOptions:
    """The decoder options of a request: sampling from the OpenAI fields, schedule, width and order from specframe's.

    ``temperature`` 0 decodes greedily (``top_p`` and ``top_k`` are then ignored, as OpenAI ignores them);
    above 0 it is rejection sampling at that temperature. OpenAI's default temperature is 1.

    Raises:
        APIError: 400 naming the parameter.
    """
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if body.get("top_p") is not None and top_p == 0:
        raise bad("top_p must be > 0 (1 keeps every token)", "top_p")
    top_k = _integer(body, "top_k")
    if top_k is not None and top_k < 0:
        raise bad(f"top_k must be >= 0 (0: no truncation), got {shown(top_k)}", "top_k")
    if temperature == 0:
        acceptance: Any = "greedy"
    else:
        acceptance = {"name": "rejection", "temperature": temperature}
        if top_p < 1:
            acceptance["top_p"] = top_p
        if top_k:
            acceptance["top_k"] = top_k
    width: Any = body.get("width", defaults.width)
    if width is None:
        width = defaults.width
    if width != "auto":
        number = as_integer(width) if not isinstance(width, float) else None
        if number is None:
            raise bad(f'width must be an integer or "auto", got {shown(width)}', "width", "invalid_type")
        if not 1 <= number <= limits.max_width:
            raise bad(
                f'width must lie in [1, {limits.max_width}] on this server (specframe serve --max-width) or be "auto", '
                f"got {shown(number)}",
                "width",
            )
        width = number
    schedule = (
        _plugin(body["schedule"], "schedule")
        if body.get("schedule") is not None
        else json.dumps(defaults.schedule, sort_keys=True)
    )
    order = (
        _plugin(body["order"], "order") if body.get("order") is not None else json.dumps(defaults.order, sort_keys=True)
    )
    return DecodeOptions(schedule, order, json.dumps(acceptance, sort_keys=True), width, _stops(body.get("stop")))


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise bad(
            f"stop must be a string or an array of strings, got a JSON {_json_type(value)}", "stop", "invalid_type"
        )
    if len(items) > MAX_STOP:
        raise bad(f"stop takes at most {MAX_STOP} strings, got {len(items)}", "stop")
    stops = []
    for item in items:
        text = _text(item, "stop")
        if not text:
            raise bad("stop strings must not be empty", "stop")
        stops.append(text)
    return tuple(dict.fromkeys(stops))


def _common(body: Mapping[str, Any], served: str, limits: Limits) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad(f"model must be a string naming the served model ({served!r})", "model", "invalid_type")
    if model != served:
        raise model_not_found(model, served)
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise bad(f"n must be 1 (specframe serve returns one choice per request), got {shown(n)}", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad(f"stream must be true or false, got {shown(stream)}", "stream", "invalid_type")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
            raise bad('stream_options must be an object like {"include_usage": true}', "stream_options")
        if not stream:
            raise bad("stream_options is only allowed with stream: true", "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad("stream_options.include_usage must be true or false", "stream_options", "invalid_type")
    seed = _integer(body, "seed")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad(f"seed must lie in [0, 2**64 - 1], got {shown(seed)}", "seed")
    return {"stream": stream, "include_usage": include_usage, "seed": seed, "model": served}


def model_not_found(name: str, served: str) -> APIError:
    """The 404 for a model id other than the served one."""
    return APIError(
        404,
        f"the model {shown(name)} does not exist on this server; it serves {shown(served)}",
        param="model",
        code="model_not_found",
    )


def _max_tokens(body: Mapping[str, Any], names: Sequence[str], default: int, limits: Limits) -> tuple[int, bool]:
    """``max_tokens`` (or its alias), checked against the cap; also whether the client gave it."""
    for name in names:
        value = _integer(body, name)
        if value is None:
            continue
        if value < 1:
            raise bad(f"{name} must be >= 1, got {shown(value)}", name)
        if value > limits.max_tokens:
            raise bad(
                f"{name} {shown(value)} exceeds this server's limit of {limits.max_tokens} tokens per request "
                "(specframe serve --max-tokens)",
                name,
            )
        return value, True
    return default, False


def check_length(job: Job, context: int, limits: Limits, given: bool, param: str) -> None:
    """Check the prompt against the limits and fit it and the output into the model's context.

    A chat request that gave no ``max_tokens`` gets what is left of the context (up to the server's cap).

    Raises:
        APIError: 400 naming ``messages``/``prompt`` or the length parameter.
    """
    prompt = len(job.prompt_ids)
    where = "messages" if job.kind == "chat" else "prompt"
    if prompt > limits.max_prompt_tokens:
        raise bad(
            f"the prompt has {prompt} tokens, more than this server's limit of {limits.max_prompt_tokens} "
            "(specframe serve --max-prompt-tokens)",
            where,
            "context_length_exceeded",
        )
    room = context - prompt  # positions left; the last output token is never fed back (decoder.fits_context)
    if room < 1:
        raise bad(
            f"the prompt has {prompt} tokens, and the model's context is {context}; shorten the prompt",
            where,
            "context_length_exceeded",
        )
    if not given:
        job.max_tokens = min(job.max_tokens, room)
    elif job.max_tokens > room:
        raise bad(
            f"the prompt has {prompt} tokens, so {param} can be at most {room} for the model's context of "
            f"{context} positions, got {job.max_tokens}",
            param,
            "context_length_exceeded",
        )


def parse_completion(
    body: Mapping[str, Any],
    *,
    served: str,
    defaults: Defaults,
    limits: Limits,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    context: int,
) -> Job:
    """Validate a ``/v1/completions`` body into a :class:`Job`.

    ``prompt`` is a string, an array holding one string, an array of token ids, or an array holding one array
    of token ids (several prompts per request are refused: send one request each).

    Raises:
        APIError: 400 (404 for another model) naming the parameter.
    """
    _check_fields(body, COMPLETION_FIELDS, NEUTRAL)
    common = _common(body, served, limits)
    options = decode_options(body, defaults, limits)
    if "prompt" not in body:
        raise bad("prompt is required", "prompt", "missing_required_parameter")
    prompt_ids = _prompt(body["prompt"], encode, vocab_size)
    max_tokens, given = _max_tokens(body, ("max_tokens",), limits.default_completion_tokens, limits)
    job = Job("completion", prompt_ids, options, max_tokens, **common)
    check_length(job, context, limits, given, "max_tokens")
    return job


def _prompt(value: Any, encode: Callable[[str], list[int]], vocab_size: int) -> list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        text = _text(value, "prompt")
        if not text:
            raise bad("prompt is empty; give some text (or token ids)", "prompt")
        return encode(text)
    if isinstance(value, list):
        if not value:
            raise bad("prompt is empty; give some text (or token ids)", "prompt")
        if all(isinstance(item, (str, list)) for item in value):
            raise bad(
                f"prompt holds {len(value)} prompts; specframe serve takes one prompt per request (send them as "
                "separate requests, which are batched)",
                "prompt",
            )
        ids = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise bad(f"prompt token ids must be integers, got a JSON {_json_type(item)}", "prompt", "invalid_type")
            if not 0 <= item < vocab_size:
                raise bad(
                    f"prompt token id {shown(item)} is outside the model's vocabulary [0, {vocab_size})", "prompt"
                )
            ids.append(item)
        return ids
    raise bad(
        f"prompt must be a string or an array of token ids, got a JSON {_json_type(value)}", "prompt", "invalid_type"
    )


def parse_chat(
    body: Mapping[str, Any],
    *,
    served: str,
    defaults: Defaults,
    limits: Limits,
    template: str | None,
    encode: Callable[[str], list[int]],
    context: int,
) -> Job:
    """Validate a ``/v1/chat/completions`` body into a :class:`Job` (the messages rendered by the chat template).

    Raises:
        APIError: 400 naming the parameter, also when the model has no chat template.
    """
    from specframe.errors import InputError
    from specframe.models.chat import render_chat

    _check_fields(body, CHAT_FIELDS, CHAT_NEUTRAL)
    common = _common(body, served, limits)
    options = decode_options(body, defaults, limits)
    messages = _messages(body.get("messages"))
    if not template:
        raise bad(
            f"the model {served!r} has no chat template (chat_template.jinja or tokenizer_config.json's "
            "chat_template), so it cannot take chat messages; use /v1/completions with a plain prompt",
            "messages",
            "chat_template_missing",
        )
    try:
        text = render_chat(template, messages)
    except InputError as exc:
        raise bad(str(exc), "messages") from None
    if not text:
        raise bad("the chat template rendered the messages as empty text", "messages")
    names = ("max_completion_tokens", "max_tokens")
    max_tokens, given = _max_tokens(body, names, limits.max_tokens, limits)
    job = Job("chat", encode(text), options, max_tokens, **common)
    check_length(job, context, limits, given, next((n for n in names if body.get(n) is not None), "max_tokens"))
    return job


def _messages(value: Any) -> list[dict[str, str]]:
    if value is None:
        raise bad("messages is required: an array of {role, content} objects", "messages", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty array of {role, content} objects", "messages", "invalid_type")
    messages = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(f"{where} must be an object with role and content", where, "invalid_type")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {shown(role)}", where)
        unknown = sorted(set(message) - {"role", "content", "name"})
        if unknown:
            names = ", ".join(shown(name) for name in unknown[:5])
            raise bad(f"{where} has unsupported field(s) {names} (tool calls are not supported)", where)
        messages.append({"role": role, "content": _content(message.get("content"), where)})
    return messages


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return _text(value, f"{where}.content")
    if isinstance(value, list):  # content parts: text only
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f'{where}.content parts must be {{"type": "text", "text": ...}} (text only)', where)
            texts.append(_text(part["text"], f"{where}.content"))
        return "".join(texts)
    raise bad(f"{where}.content must be a string or an array of text parts", where, "invalid_type")


# -- writing responses -----------------------------------------------------------------------------------


class OutputText:
    """The text a client sees for a growing list of output ids, as OpenAI writes it.

    An EOS token at the end is not text, and the text ends before the first stop string (OpenAI leaves the stop
    sequence out). While streaming, text that could be the start of a stop string is held back (see
    :class:`specframe.streaming.IncrementalText`), so no piece ever shows part of a stop string.

    Args:
        decode: The model's ``ids -> text``.
        eos_token_ids: Ids that end generation.
        stop: Stop strings.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], eos_token_ids: Sequence[int], stop: Sequence[str]):
        self.decode = decode
        self.eos = frozenset(eos_token_ids)
        self.stop = tuple(stop)
        self.incremental = IncrementalText(decode, self.stop)
        self.sent = 0  # characters handed out

    def visible(self, ids: Sequence[int]) -> list[int]:
        """``ids`` without a final EOS token."""
        return list(ids[:-1]) if ids and ids[-1] in self.eos else list(ids)

    def final(self, ids: Sequence[int]) -> str:
        """The whole text of a finished generation's ``ids``."""
        return cut_at_stop(self.decode(self.visible(ids)), self.stop)

    def update(self, ids: Sequence[int]) -> str:
        """New text for the output ``ids`` so far (possibly empty)."""
        new = self.incremental.update(self.visible(ids))
        new = cut_at_stop(new, self.stop)  # held back while incomplete; complete only in the last piece
        self.sent += len(new)
        return new

    def finish(self, ids: Sequence[int]) -> str:
        """The rest of the text once generation has ended."""
        final = self.final(ids)
        rest = final[self.sent :] if len(final) > self.sent else ""
        self.sent += len(rest)
        return rest


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the first occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def finish_reason(stop_reason: str) -> str:
    """OpenAI's ``finish_reason`` for specframe's ``stop_reason`` (``eos``/``stop_sequence`` -> ``stop``)."""
    return "length" if stop_reason == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def speculative_stats(generation: Any, decoder_info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``specframe`` field of a response: how the output was decoded.

    Args:
        generation: The finished :class:`specframe.Generation`.
        decoder_info: ``schedule``, ``width`` and ``exact`` of the decoder that produced it.
    """
    m = generation.metrics
    return {
        **decoder_info,
        "nfe": m.nfe,
        "tokens_per_nfe": m.tokens_per_nfe,
        "widths": {str(k): v for k, v in m.width_histogram().items()},
        "schedules": m.schedule_histogram(),
        "mean_acceptance_length": m.mean_acceptance_length,
        "acceptance_rate": m.acceptance_rate,
        "draft_tokens": m.draft_tokens,
        "accepted_tokens": m.accepted_tokens,
        "stop_reason": generation.stop_reason,
        "output_ids": list(generation.output_ids),
        "model_s": m.model_s,
        "wall_s": m.wall_s,
    }


def response(job: Job, text: str, generation: Any, decoder_info: Mapping[str, Any]) -> dict[str, Any]:
    """The non-streamed response body of a finished job."""
    reason = finish_reason(generation.stop_reason)
    if job.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {
        "id": response_id(job),
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": usage(len(job.prompt_ids), len(generation.output_ids)),
        "specframe": speculative_stats(generation, decoder_info),
    }


def response_id(job: Job) -> str:
    """``chatcmpl-...`` or ``cmpl-...``."""
    return ("chatcmpl-" if job.kind == "chat" else "cmpl-") + job.id


def chunk(job: Job, text: str | None, *, reason: str | None = None, role: bool = False) -> dict[str, Any]:
    """One streamed chunk (``text_completion`` or ``chat.completion.chunk``)."""
    if job.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    body = {
        "id": response_id(job),
        "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": [choice],
    }
    if job.include_usage:
        body["usage"] = None
    return body


def usage_chunk(job: Job, generation: Any) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage."""
    body = chunk(job, None)
    body["choices"] = []
    body["usage"] = usage(len(job.prompt_ids), len(generation.output_ids))
    return body


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
