"""Request validation: what is accepted, and every refusal names its field in an OpenAI error object."""
import pytest
from pydantic import ValidationError

from toolkit.serve.api_error import ApiError, validation_error
from toolkit.serve.protocol import ChatRequest, CompletionRequest

USER = [{"role": "user", "content": "hi"}]


def refusal(model, body) -> ApiError:
    try:
        model.model_validate(body)
    except ValidationError as e:
        return validation_error(e.errors())
    except ApiError as e:
        return e
    raise AssertionError(f"{body} was accepted")


def test_accepted_forms():
    r = ChatRequest.model_validate({"messages": [{"role": "developer", "content": "be brief"},
                                                 {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}],
                                    "max_completion_tokens": 7, "stop": "x", "top_k": -1})
    assert r.max_tokens == 7 and r.stop == ["x"] and r.messages[1].text() == "a\nb" and r.temperature is None
    assert CompletionRequest.model_validate({"prompt": ["one prompt"]}).prompts() == ["one prompt"]
    assert CompletionRequest.model_validate({"prompt": [[1, 2], [3]]}).prompts() == [[1, 2], [3]]
    assert CompletionRequest.model_validate({"prompt": [1, 2]}).prompts() == [[1, 2]]
    assert CompletionRequest.model_validate({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    # null where OpenAI lets a field be null means its default (clients send null for unset fields)
    nulls = ChatRequest.model_validate({"messages": USER, **dict.fromkeys(
        ("temperature", "top_p", "top_k", "n", "stream", "presence_penalty", "frequency_penalty", "seed",
         "logit_bias", "top_logprobs", "response_format"))})
    # (sampling values left unset: the served target's defaults apply, toolkit/serve/defaults.py)
    assert (nulls.temperature, nulls.top_p, nulls.top_k, nulls.n, nulls.stream) == (None, None, None, 1, False)
    # seed -1 is vLLM's "no seed" (a random one), not the fixed seed -1
    assert ChatRequest.model_validate({"messages": USER, "seed": -1}).seed is None
    assert ChatRequest.model_validate({"messages": USER, "seed": -2}).seed == -2
    assert ChatRequest.model_validate({"messages": USER, "response_format": {"type": "text"},
                                       "seed": 2 ** 64 - 1}).seed == 2 ** 64 - 1


@pytest.mark.parametrize("body,param", [
    ({}, "messages"),
    ({"messages": USER, "temperature": -1}, "temperature"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "top_k": -2}, "top_k"),
    ({"messages": USER, "temperature": float("inf")}, "temperature"),
    ({"messages": USER, "seed": 2 ** 64}, "seed"),
    ({"messages": USER, "seed": -2 ** 63 - 1}, "seed"),
    ({"messages": USER, "logit_bias": {"50": 101}}, "logit_bias"),  # OpenAI's range is [-100, 100]
    ({"messages": USER, "logit_bias": {"fifty": 1}}, "logit_bias"),
    ({"messages": USER, "logit_bias": {"50": True}}, "logit_bias"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "stop": "x" * 1025}, "stop"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # vLLM's --max-logprobs 20
    ({"messages": USER, "presence_penalty": 2.5}, "presence_penalty"),  # OpenAI's range is [-2, 2]
    ({"messages": USER, "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"messages": USER, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": USER, "min_p": 1.5}, "min_p"),
    ({"messages": USER, "min_tokens": -1}, "min_tokens"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),  # no function in it
    ({"messages": [{"role": "function", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]}, "messages.0.content"),
    ({"messages": [{"role": "assistant", "content": "done"}]}, "messages"),
    ({"messages": USER, "max_completion_tokens": True}, "max_completion_tokens"),  # was read as 1
    ({"messages": USER, "max_completion_tokens": "12"}, "max_completion_tokens"),
    # vLLM's / SGLang's extras that change the output: refused when set, no longer silently ignored
    ({"messages": USER, "guided_choice": ["yes", "no"], "guided_json": {"type": "object"}}, "guided_choice"),
    ({"messages": USER, "structural_tag": {"type": "x"}}, "structural_tag"),
    ({"messages": USER, "include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ({"messages": USER, "skip_special_tokens": False}, "skip_special_tokens"),
    ({"messages": USER + [{"role": "assistant", "content": "Hi"}], "continue_final_message": True},
     "continue_final_message"),  # add_generation_prompt must be false beside it, as vLLM asks
    ({"messages": USER, "continue_final_message": True, "add_generation_prompt": False}, "messages"),
    ({"messages": USER, "chat_template": "{{ messages }}"}, "chat_template"),
    ({"messages": USER, "functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"messages": USER, "truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),  # vLLM's: keeps the last 8 only
    ({"messages": USER, "custom_logit_processor": "{}"}, "custom_logit_processor"),  # SGLang's
    ({"messages": USER, "add_special_tokens": "yes"}, "add_special_tokens"),
])
def test_chat_refusals_name_the_field(body, param):
    err = refusal(ChatRequest, body)
    assert err.status == 400 and err.param == param
    assert err.body()["error"]["param"] == param and err.body()["error"]["type"] == "invalid_request_error"
    assert param.split(".")[0] in err.message


@pytest.mark.parametrize("body,param", [({"prompt": ["a", ""]}, "prompt"), ({"prompt": [[1, 2], []]}, "prompt"),
                                        ({"prompt": "a", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                                        ({"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
                                        ({"prompt": "a", "best_of": 2}, "best_of"), ({"prompt": ""}, "prompt"),
                                        ({"prompt": "a", "guided_regex": "[0-9]+", "ebnf": "root ::= \"a\""}, "ebnf"),
                                        ({"prompt": "a", "use_beam_search": True}, "use_beam_search")])
def test_completion_refusals_name_the_field(body, param):
    assert refusal(CompletionRequest, body).param == param


def test_extras_at_their_defaults_are_accepted():
    """Clients that spell out vLLM's defaults (or SGLang's, or send null) are served as before."""
    r = ChatRequest.model_validate({"messages": USER, "skip_special_tokens": True, "add_generation_prompt": True,
                                    "include_stop_str_in_output": False, "guided_json": None, "bad_words": [],
                                    "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": None,
                                    "max_tokens": 9})
    assert r.max_tokens == 9
    assert CompletionRequest.model_validate({"prompt": "a", "add_generation_prompt": False}).prompt == "a"  # chat's


def test_completion_echo_null_is_no_echo():
    """OpenAI lets echo be null (clients send null for unset fields), as vLLM reads it: no echo."""
    assert CompletionRequest.model_validate({"prompt": "a", "echo": None}).echo is False
    assert refusal(CompletionRequest, {"prompt": "a", "echo": None, "max_tokens": 0}).param == "max_tokens"
    assert refusal(CompletionRequest, {"prompt": "a", "echo": "yes"}).param == "echo"  # still a strict boolean


def test_reasoning_effort_is_the_templates_variable():
    """OpenAI's reasoning_effort (gpt-oss's template writes it into its system message), as vLLM and SGLang pass
    it; a chat_template_kwargs value of its own wins; a value outside low / medium / high is refused by name."""
    r = ChatRequest.model_validate({"messages": USER, "reasoning_effort": "low"})
    assert r.chat_template_kwargs == {"reasoning_effort": "low"}
    r = ChatRequest.model_validate({"messages": USER, "reasoning_effort": "low",
                                    "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": True}})
    assert r.chat_template_kwargs == {"reasoning_effort": "high", "enable_thinking": True}
    assert ChatRequest.model_validate({"messages": USER}).chat_template_kwargs == {}
    err = refusal(ChatRequest, {"messages": USER, "reasoning_effort": "max"})
    assert err.param == "reasoning_effort" and "give one of low, medium, high" in err.message
