"""Hub ids where a folder or file is expected (toolkit/hub.py), against a local HF cache the test writes: no network."""
from __future__ import annotations

import pytest

from toolkit import hub


def cached_repo(cache, repo_id: str, files: dict[str, bytes], commit: str = "0" * 40):
    """Write `files` as the cached snapshot of hub repository `repo_id`, as huggingface_hub lays one out."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snap = folder / "snapshots" / commit
    for name, data in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_bytes(data)
    return snap


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF cache that huggingface_hub reads, offline."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_draft_hub_id_is_its_cached_snapshot_and_a_local_path_wins(hf_cache, tmp_path, monkeypatch):
    snap = cached_repo(hf_cache, "org/head", {"config.json": b"{}", "pytorch_model.bin": b"x"})
    assert hub.draft_folder("org/head") == str(snap)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "head").mkdir(parents=True)  # a folder here of the same spelling is the one meant
    assert hub.draft_folder("org/head") == "org/head"
    assert hub.draft_folder("plain-name") == "plain-name" and hub.draft_folder(None) is None  # the loader names these


def test_a_draft_hub_id_neither_cached_nor_reachable_names_the_id_and_the_way_out(hf_cache):
    with pytest.raises(ValueError) as err:
        hub.draft_folder("org/absent", "--speculative-draft-model-path")
    assert str(err.value).startswith("--speculative-draft-model-path org/absent: HF_HUB_OFFLINE is set and it is not "
                                     "in the local HF cache")
    assert "a local draft folder" in str(err.value)


def test_a_token_map_as_org_name_file_is_that_file_of_the_repository(hf_cache):
    import torch

    from toolkit.tokenmap.maps import load_freq

    snap = cached_repo(hf_cache, "thunlp/LLaMA3-Instruct-8B-FR-Spec", {"freq_32768.pt": b""})
    torch.save([5, 3, 9], snap / "freq_32768.pt")
    got = hub.file("thunlp/LLaMA3-Instruct-8B-FR-Spec/freq_32768.pt", "--token-map")
    assert got == str(snap / "freq_32768.pt") and load_freq(got) == [5, 3, 9]
    with pytest.raises(ValueError, match="--token-map thunlp/LLaMA3-Instruct-8B-FR-Spec/freq_8192.pt: no such file "
                                         "here, and as the file freq_8192.pt of hub repository thunlp/LLaMA3-"):
        hub.file("thunlp/LLaMA3-Instruct-8B-FR-Spec/freq_8192.pt", "--token-map")
    assert hub.file("maps/freq_8192.pt", "--token-map") == "maps/freq_8192.pt"  # no repository: the path as given
    assert hub.file(None, "--token-map") is None


def test_a_target_hub_id_reads_the_same_cache(hf_cache):
    from toolkit.models import TargetError, resolve_target

    snap = cached_repo(hf_cache, "org/target", {"config.json": b'{"model_type": "llama"}'})
    assert resolve_target("org/target") == snap
    with pytest.raises(TargetError, match="--model org/other: HF_HUB_OFFLINE is set"):
        resolve_target("org/other")


def test_a_draft_revision_picks_that_snapshot_and_needs_a_hub_id(hf_cache):
    old = cached_repo(hf_cache, "org/head", {"config.json": b'{"old": 1}'}, commit="b" * 40)
    main = cached_repo(hf_cache, "org/head", {"config.json": b"{}"}, commit="a" * 40)  # refs/main now names it
    assert hub.draft_folder("org/head") == str(main)
    assert hub.draft_folder("org/head", revision="b" * 40) == str(old)
    with pytest.raises(ValueError, match="--draft org/head at revision v9: HF_HUB_OFFLINE is set"):
        hub.draft_folder("org/head", revision="v9")
    with pytest.raises(ValueError, match=r"a draft revision \(v1\) picks a version of a hub repository, and the draft "
                                         "plain-name is no hub id: drop the revision"):
        hub.draft_folder("plain-name", revision="v1")


def test_the_files_fetched_are_the_ones_loaders_read(hf_cache, monkeypatch):
    """Mistral's repositories ship consolidated.safetensors beside model.safetensors (the weights again, which no
    loader reads: fetched, a download twice the size; offline, a cache without it refused as incomplete); nor are
    subfolders read. A draft's pytorch_model.bin is fetched only where its repository has no safetensors."""
    from fnmatch import fnmatch

    import huggingface_hub

    calls = []

    def fake(repo_id, revision=None, allow_patterns=(), ignore_patterns=(), local_files_only=False):
        calls.append((allow_patterns, ignore_patterns))
        return str(snap)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)

    def fetched(name):
        allow, ignore = calls[-1]
        return any(fnmatch(name, p) for p in allow) and not any(fnmatch(name, p) for p in ignore)
    snap = cached_repo(hf_cache, "org/mistral", {"config.json": b"{}"})
    hub.snapshot("org/mistral", "--model", hub.MODEL_FILES, "a local folder")
    assert fetched("model-00001-of-00002.safetensors") and fetched("tokenizer.json")
    assert not fetched("consolidated.safetensors") and not fetched("original/model.safetensors")
    snap = cached_repo(hf_cache, "org/head", {"config.json": b"{}", "model.safetensors": b"x"})
    calls.clear()
    hub.draft_folder("org/head")
    assert len(calls) == 1 and fetched("model.safetensors") and not fetched("pytorch_model.bin")
    snap = cached_repo(hf_cache, "org/safeai", {"config.json": b"{}"})
    calls.clear()
    hub.draft_folder("org/safeai")
    assert len(calls) == 2 and fetched("pytorch_model.bin") and not fetched("optimizer.pt")


@pytest.mark.parametrize("error, said", [
    ("GatedRepoError", "the repository is gated (GatedRepoError: Access to model org/x is restricted): accept its terms "
                       "on its hub page and set HF_TOKEN"),
    ("RepositoryNotFoundError", "the hub has no such repository, or it is private and no token with access to it is "
                                "set (RepositoryNotFoundError): check the id, or set HF_TOKEN"),
    ("RevisionNotFoundError", "the repository has no such revision (RevisionNotFoundError)"),
    ("IncompleteSnapshotError", "the local HF cache holds only part of it (IncompleteSnapshotError)")])
def test_hub_errors_say_what_to_do_for_each_kind(hf_cache, monkeypatch, error, said):
    """A gated repository, a wrong id or revision and a partial cache each said as what they are (all read
    'could not be reached, or has no such repository'), with what to do."""
    import huggingface_hub
    import huggingface_hub.errors

    def fail(*a, **k):
        cls = getattr(huggingface_hub.errors, error)
        err = cls.__new__(cls)
        Exception.__init__(err, "Access to model org/x is restricted.\nmore")
        raise err
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ValueError) as err:
        hub.snapshot("org/x", "--model", hub.MODEL_FILES, "a local folder")
    assert str(err.value).startswith(f"--model org/x: {said}") and str(err.value).endswith("; or pass a local folder.")
