"""Streaming text: deltas add up to exactly the non-streamed text, stop strings never leak out (not even a
prefix of one), and a multi-byte character split across tokens is held back until complete."""
import pytest

from toolkit.serve.text import TextStream


@pytest.mark.parametrize("stops", [[], ["Paris"], ["\n\n", "capital"], ["never here"]])
def test_deltas_add_up_to_the_full_text_cut_at_the_first_stop(smollm2_tokenizer, stops):
    tok = smollm2_tokenizer
    ids = tok("The capital of France is Paris.\n\nIt is a city of lights: caf\u00e9s, mus\u00e9es \u2603.").input_ids
    stream, out = TextStream(tok, stops), []
    for n in range(1, len(ids) + 1):
        out.append(stream.update(ids[:n], n == len(ids)))
        assert not any(s in "".join(out) for s in stops)
        assert not "".join(out).endswith(tuple(s[:k] for s in stops for k in range(1, len(s)))) or n == len(ids)
    full = tok.decode(ids, skip_special_tokens=True)
    cuts = [full.find(s) for s in stops if s in full]
    assert "".join(out) == (full[:min(cuts)] if cuts else full)
    assert stream.stopped == bool(cuts)
    # the tokens through the one that completed the stop string, fed one by one or all at once (a non-streamed
    # reply): what the engine generates when it stops there itself
    shows = [any(s in tok.decode(ids[:n], skip_special_tokens=True) for s in stops) for n in range(len(ids) + 1)]
    upto = shows.index(True) if any(shows) else None
    whole = TextStream(tok, stops)
    whole.update(ids, True)
    assert stream.stop_at == whole.stop_at == upto


def test_client_stops_end_the_sequence_where_the_text_shows_the_stop(smollm2_tokenizer):
    """The engine's check for a served request: the stop string in the text the client gets (special tokens
    skipped), where the text with them (StopStrings alone) has one between its characters."""
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence, StopStrings
    from toolkit.serve.text import ClientStops

    tok = smollm2_tokenizer
    ids = tok("Paris is the capital").input_ids
    ids[1:1] = [tok.convert_tokens_to_ids("<|im_start|>")]  # "Paris<|im_start|> is the capital"

    def stops_at(check) -> int | None:
        seq = Sequence([1], SamplingParams(max_new_tokens=len(ids) + 1), stop_strings=check)
        return next((n for n, t in enumerate(ids, 1) if seq.add(t)), None)

    assert stops_at(StopStrings(tok, ["Paris is"])) is None
    assert stops_at(ClientStops(tok, ["Paris is"])) == 3
    assert stops_at(ClientStops(tok, ["<|im_start|>"])) == 2  # a special token as a stop string still ends it


def test_a_split_multibyte_character_is_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok("snow \u2603 man").input_ids
    stream, pieces = TextStream(tok, []), []
    for n in range(1, len(ids) + 1):
        pieces.append(stream.update(ids[:n], False))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.update(ids, True) == tok.decode(ids)


class CountingTokenizer:
    """A tokenizer that records how many tokens each decode call was given."""

    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def decode(self, ids, **kw):
        self.sizes.append(len(ids))
        return self.tok.decode(ids, **kw)


@pytest.mark.parametrize("which", ["smollm2_tokenizer", "llama3_tokenizer", "qwen2_tokenizer"])
def test_a_long_stream_is_decoded_a_few_tokens_at_a_time_into_the_full_text(request, which):
    """Each update decodes only the new tokens in a small window (a 4,000-token stream re-decoded whole each
    time cost seconds of the event loop), and the deltas still add up to the whole generation's decode: word
    spaces, multi-byte characters split across tokens, CJK and emoji included."""
    tok = request.getfixturevalue(which)
    text = " ".join(["The caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2603 \u6771\u4eac\u90fd \U0001F600\U0001F468\u200d\U0001F469"
                     "\u200d\U0001F467 price: $3.50\n\n  indented\tcode()"] * 40)
    ids = tok(text, add_special_tokens=False).input_ids
    counting = CountingTokenizer(tok)
    stream, out = TextStream(counting, ["never here"]), []
    for n in range(1, len(ids) + 1):
        out.append(stream.update(ids[:n], n == len(ids)))
    assert "".join(out) == tok.decode(ids, skip_special_tokens=True)
    assert len(ids) > 600 and max(counting.sizes) <= 16


class Chars:
    """Token i decodes to chr(i)."""

    def decode(self, ids, **kw):
        return "".join(chr(i) for i in ids)


def test_the_engine_says_why_a_sequence_ended():
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence, StopStrings

    def run(tokens, n, **kw):
        seq = Sequence([1], SamplingParams(max_new_tokens=n), **kw)
        for t in tokens:
            if seq.add(t):
                break
        return seq.result.finish, len(seq.result.tokens)

    assert run([65, 66, 67], 3) == ("length", 3)
    assert run([65, 2, 67], 3, stop_ids=frozenset({2})) == ("stop", 2)
    # a stop string (here one a tokenizer would call special) completed by the last allowed token is a stop
    assert run([60, 98, 62], 3, stop_strings=StopStrings(Chars(), ["<b>"])) == ("stop", 3)
    assert run([65, 66], 5)[0] is None  # still running


@pytest.mark.parametrize("m, stops_at", [(0, 4), (3, 4), (4, 9), (5, 9), (9, None)])
def test_with_min_tokens_a_stop_string_counts_once_it_ends_past_the_first_min_tokens(m, stops_at):
    """vLLM's rule (its v1 detokenizer): "<b>" is completed by tokens 4 and 9; with min_tokens 4 the first showing
    never counts, not at the 5th token (when it is still in the text the engine checks) nor when a whole reply is
    scanned at once."""
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence, StopStrings
    from toolkit.serve.text import ClientStops

    tokens = [ord(c) for c in "x<b>yz<b>w"]
    for check in (StopStrings(Chars(), ["<b>"]), ClientStops(Chars(), ["<b>"], m)):
        seq = Sequence([1], SamplingParams(max_new_tokens=12, min_tokens=m), stop_strings=check)
        assert next((n for n, t in enumerate(tokens, 1) if seq.add(t)), None) == stops_at
    want = "x<b>yz<b>w"[:None if stops_at is None else stops_at - 3]
    one_by_one = TextStream(Chars(), ["<b>"], m)
    text = "".join(one_by_one.update(tokens[:n], n == len(tokens)) for n in range(1, len(tokens) + 1))
    at_once = TextStream(Chars(), ["<b>"], m)
    assert text == at_once.update(tokens, True) == want
    assert one_by_one.stop_at == at_once.stop_at == stops_at
