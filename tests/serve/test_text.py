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


def test_a_split_multibyte_character_is_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok("snow \u2603 man").input_ids
    stream, pieces = TextStream(tok, []), []
    for n in range(1, len(ids) + 1):
        pieces.append(stream.update(ids[:n], False))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.update(ids, True) == tok.decode(ids)
