"""Responses output items from chat deltas (toolkit/serve/response_items.py): thinking, text and tool calls become
reasoning / message / function_call items in order; the deltas of any chunking give the items the whole message
gives; each item's events open, add and close it in the order OpenAI sends them; the reply as a chat turn."""
import pytest

from toolkit.serve.response_items import Items

WHOLE = {"role": "assistant", "reasoning_content": "Paris is in France.", "content": "Let me look.",
         "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                                          "arguments": '{"city": "Paris"}'}},
                        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
# the same reply as a stream's deltas: thinking and text piece by piece, the first call's arguments in pieces
DELTAS = [{"reasoning_content": "Paris is "}, {"reasoning_content": "in France."}, {"content": "Let "},
          {"content": "me look."},
          {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": '}}]},
          {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
          {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                           "function": {"name": "get_time", "arguments": "{}"}}]}]


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in i.items() if k != "id"} for i in items]


def test_deltas_and_the_whole_message_give_the_same_items():
    whole, streamed = Items(), Items()
    whole.feed(WHOLE)
    whole.close()
    events = [e for d in DELTAS for e in streamed.feed(d)] + streamed.close()
    assert without_ids(streamed.items) == without_ids(whole.items) == [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Paris is in France."}]},
        {"type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}',
         "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}", "status": "completed"}]
    kinds = [e["type"].removeprefix("response.") for e in events]
    assert kinds == ["output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.delta",
                     "reasoning_text.done", "content_part.done", "output_item.done",
                     "output_item.added", "content_part.added", "output_text.delta", "output_text.delta",
                     "output_text.done", "content_part.done", "output_item.done",
                     "output_item.added", "function_call_arguments.delta", "function_call_arguments.delta",
                     "function_call_arguments.done", "output_item.done",
                     "output_item.added", "function_call_arguments.delta", "function_call_arguments.done",
                     "output_item.done"]
    # every event names the item it belongs to by id and position; an added item is empty, a done one whole
    for e in events:
        at = e["output_index"]
        assert e.get("item_id", e.get("item", {}).get("id")) == streamed.items[at]["id"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[1]["status"] == "in_progress" and added[1]["content"] == [] and added[2]["arguments"] == ""
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == streamed.items
    texts = [e["text"] for e in events if e["type"].endswith("_text.done")]
    assert texts == ["Paris is in France.", "Let me look."]


@pytest.mark.parametrize("status", ["completed", "incomplete"])
def test_a_reply_cut_short_leaves_its_last_item_incomplete(status):
    items = Items()
    items.feed({"content": "Once upon"})
    events = items.close(status)
    assert items.items[0]["status"] == status and events[-1]["item"]["status"] == status
    assert items.close() == []  # closed once


def test_the_reply_as_the_chat_turn_that_continues_it():
    items = Items()
    items.feed(WHOLE)
    assert items.assistant_turn() == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    calls_only = Items()
    calls_only.feed({"tool_calls": WHOLE["tool_calls"][1:]})
    assert calls_only.assistant_turn()["content"] is None
