"""The project's own prompt set: deterministic, sliceable, version 1 frozen (the committed regenerated data is
indexed by its positions) and version 2 disjoint from it."""
import gzip
import json

import pytest
from conftest import ROOT

from toolkit.data.topics import topic_prompts

DATA = ROOT / "benchmarks/data"  # SmolLM2's answers to the set, sorted by index


def users(conv):
    return [m["content"] for m in conv["messages"] if m["role"] == "user"]


@pytest.mark.parametrize("name, version, answered", [("smollm2_regen_topics.jsonl.gz", 1, 2370),
                                                      ("smollm2_regen_topics_v2.jsonl.gz", 2, 2280)])
def test_the_committed_answers_were_made_from_this_set(name, version, answered):
    whole = topic_prompts(answered, version=version)
    rows = [json.loads(line) for line in gzip.open(DATA / name, "rt")]
    index = [int(row["source"].rsplit(":", 1)[1]) for row in rows]  # "topics.jsonl:N" is the set's conversation N
    assert index == list(range(answered))
    for row, conv in zip(rows, whole):
        assert users(row) == users(conv), row["source"]
        assert row["messages"][-1]["role"] == "assistant"


@pytest.mark.parametrize("version, size", [(1, 2370), (2, 2280)])
def test_a_range_is_a_slice_of_the_whole_set(version, size):
    whole = topic_prompts(size, version=version)
    assert topic_prompts(100, start=50, version=version) == whole[50:150]
    assert topic_prompts(size, version=version) == whole  # deterministic
    assert topic_prompts(size, seed=1, version=version) != whole
    texts = [t for c in whole for t in users(c)]
    assert not any("{" in t or "}" in t for t in texts)  # every placeholder filled
    assert len({users(c)[0] for c in whole}) == size  # no first turn repeated
    follow_ups = sum(len(c["messages"]) == 2 for c in whole)
    assert 0.2 < follow_ups / size < 0.3


def test_version_2_shares_no_prompt_or_id_with_version_1():
    v1, v2 = topic_prompts(2370), topic_prompts(2280, version=2)
    assert not {users(c)[0] for c in v1} & {users(c)[0] for c in v2}
    assert not {c["id"] for c in v1} & {c["id"] for c in v2}
    kinds = " ".join(users(c)[0] for c in v2)
    for kind in ("Pretend you are", "Extract the people", "two-column table", "SQL", "Solve for x"):
        assert kind in kinds


def test_bad_requests_are_refused_with_the_accepted_values():
    with pytest.raises(ValueError, match="versions are 1 and 2"):
        topic_prompts(5, version=3)
    with pytest.raises(ValueError, match="at least 1"):
        topic_prompts(0)
    with pytest.raises(ValueError, match="this set has 2370"):
        topic_prompts(2371)
    with pytest.raises(ValueError, match="this set has 2280"):
        topic_prompts(10, start=2275, version=2)
