"""Hugging Face hub ids where a folder or file is expected: a target (`--model org/name`), a draft
(`--draft org/name`, as SGLang's --speculative-draft-model-path and vLLM's speculative model take one) and a
token map (`--token-map org/name/freq_32768.pt`, as SGLang's --speculative-token-map reads FR-Spec's maps).

A hub id is fetched into the HF cache (only the files a loader reads) when the hub is reachable; with
HF_HUB_OFFLINE=1 or no network it must already be cached, else the error names the id and what to do. A local
path always wins over a hub id of the same spelling.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
HUB_FILE = re.compile(r"^([A-Za-z0-9][\w.\-]*/[\w.\-]+)/([\w.\-][\w.\-/]*)$")
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
DRAFT_FILES = ["*.json", "*.safetensors"]
DRAFT_BIN = ["*.json", "pytorch_model*.bin"]  # SafeAILab's heads: fetched only where a repository has no safetensors
# loaders read a repository's top folder only, and never Mistral's consolidated.safetensors (a second copy of the
# weights in Mistral's naming: weight_files.py): fetched, it doubled the download, and offline a cache without it
# was refused as incomplete
IGNORED = ["consolidated*", "*/*"]


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _why(err: Exception) -> str:
    """What went wrong fetching from the hub, and what to do, by huggingface_hub's error type."""
    kind = type(err).__name__
    said = (str(err).strip().splitlines() or [""])[0][:200].rstrip(".")
    if kind == "GatedRepoError":
        return (f"the repository is gated ({kind}: {said}): accept its terms on its hub page and set HF_TOKEN (or "
                "run `hf auth login`)")
    if kind == "RepositoryNotFoundError":
        return (f"the hub has no such repository, or it is private and no token with access to it is set ({kind}): "
                "check the id, or set HF_TOKEN")
    if kind == "RevisionNotFoundError":
        return f"the repository has no such revision ({kind}): give a branch, tag or commit it has"
    if kind == "IncompleteSnapshotError":
        return (f"the local HF cache holds only part of it ({kind}): fetch it again where the hub is reachable "
                "(unset HF_HUB_OFFLINE)")
    how = ("HF_HUB_OFFLINE is set and it is not in the local HF cache" if offline()
           else "the hub could not be reached, and it is not in the local HF cache")
    return f"{how} ({kind}): download it where the hub is reachable (unset HF_HUB_OFFLINE)"


def snapshot(repo_id: str, flag: str, patterns: list[str], alternatives: str, revision: str | None = None) -> Path:
    """The local folder of hub repository `repo_id` at `revision` (a branch, tag or commit; None: main), downloaded
    or cached; `flag` and `alternatives` word the error (e.g. "--draft", "a local draft folder")."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, ignore_patterns=IGNORED,
                                      local_files_only=offline()))
    except Exception as err:  # huggingface_hub raises several types for "not reachable / not cached"
        at = f" at revision {revision}" if revision else ""
        raise ValueError(f"{flag} {repo_id}{at}: {_why(err)}; or pass {alternatives}.") from None


def draft_folder(name: str | None, flag: str = "--draft", revision: str | None = None) -> str | None:
    """A draft given as a folder stays as given; one given as a hub id (no such folder here) becomes its cached
    snapshot folder (at `revision`). Anything else is returned unchanged, for the loader to name what is wrong."""
    if name is None or Path(name).expanduser().exists() or not HUB_ID.match(name):
        if revision not in (None, "main"):  # "main" is what SGLang passes by default: nothing to pick locally
            raise ValueError(f"a draft revision ({revision}) picks a version of a hub repository, and the draft "
                             f"{name} is {'no hub id' if name else 'not given'}: drop the revision")
        return name
    revision = None if revision == "main" else revision
    folder = snapshot(name, flag, DRAFT_FILES, "a local draft folder", revision)
    if not any(folder.glob("*.safetensors")):  # not also a .bin copy of the same weights
        folder = snapshot(name, flag, DRAFT_BIN, "a local draft folder", revision)
    return str(folder)


def file(value: str | None, flag: str) -> str | None:
    """A file given as a path stays as given; `org/name/path/in/repo` (no such file here) becomes the cached
    copy of that file of hub repository org/name, as SGLang reads --speculative-token-map."""
    match = HUB_FILE.match(value or "")
    if value is None or Path(value).expanduser().exists() or not match:
        return value
    from huggingface_hub import hf_hub_download

    repo_id, filename = match.groups()
    try:
        return hf_hub_download(repo_id, filename, local_files_only=offline())
    except Exception as err:
        raise ValueError(f"{flag} {value}: no such file here, and as the file {filename} of hub repository "
                         f"{repo_id}: {_why(err)}; or give a local file.") from None
