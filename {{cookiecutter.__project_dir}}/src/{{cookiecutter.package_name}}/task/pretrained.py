"""Where ``model.pretrained`` comes from, settled before any process starts.

transformers takes every name that is not an existing folder for a hub id: a mistyped local path, or a
model never downloaded on a machine without network, costs one to three minutes of hub retries and a
page of tracebacks per process. The pre-check and the doctor resolve the name first: a local folder must
exist; a hub id must be in the local Hugging Face cache, or the hub must answer for it within a few
seconds. Only huggingface_hub is imported (no torch), and only for a name that is not a folder.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError

HUB_TIMEOUT_S = 5.0


class PretrainedError(ConfigError):
    """``model.pretrained`` names nothing this machine can load; ``problem`` and ``fix`` for the doctor."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def local_path_hint(name: str) -> str | None:
    """Why ``name`` must be a local path (empty: no particular reason), or None for a valid hub id."""
    from huggingface_hub.utils import validate_repo_id

    first = name.split("/", 1)[0]
    if "/" in name and Path(first).is_dir():
        return f" ({first}/ exists, without {name.split('/', 1)[1]} in it)"
    try:
        validate_repo_id(name)
    except ValueError:  # HFValidationError: absolute, ./, ~, more than one /, spaces, ...
        return ""
    return None


def resolve(name: str, use_network: bool = True) -> str:
    """Where the checkpoint will come from, in words; raise PretrainedError when it cannot be loaded.

    ``use_network=False`` skips asking the hub (a worker, whose launch.sh already asked)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return f"a local folder ({path.resolve()})"
    if path.exists():
        raise PretrainedError(f"model.pretrained={name!r} is a file", "give the folder holding config.json")
    hint = local_path_hint(name)
    if hint is not None:
        raise PretrainedError(
            f"model.pretrained={name!r} does not exist{hint}",
            f"check the path (relative paths start from {Path.cwd()}), or give a Hugging Face hub id",
        )
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cache = constants.HF_HUB_CACHE
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return f"{name} in the Hugging Face cache ({cache})"
    not_here = f"model.pretrained={name!r} is not a local folder, nor in the Hugging Face cache ({cache})"
    download = f"download it into that cache where there is network (hf download {name}; HF_HOME chooses it)"
    if constants.HF_HUB_OFFLINE:
        raise PretrainedError(
            f"{not_here}, and HF_HUB_OFFLINE is set",
            f"give the path of a local copy, {download}, or unset HF_HUB_OFFLINE",
        )
    if not use_network:
        return f"{name} on the hub, downloaded into {cache} at start"
    try:
        model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return f"{name} on the hub, gated: it needs a token with access (HF_TOKEN, or hf auth login)"
    except RepositoryNotFoundError:
        raise PretrainedError(
            f"model.pretrained={name!r} is neither a local folder nor a model on {constants.ENDPOINT}",
            f"check the spelling (relative paths start from {Path.cwd()})",
        ) from None
    except Exception as error:  # no network, DNS, proxy, timeout: the hub's client raises many kinds
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].replace(";", ",")
        raise PretrainedError(
            f"{not_here}, and {constants.ENDPOINT} did not answer within {HUB_TIMEOUT_S:g} s ({reason})",
            f"give the path of a local copy, or {download} and run with HF_HUB_OFFLINE=1",
        ) from None
    return f"{name} on the hub, downloaded into {cache} at start"


def resolve_if_used(pretrained: str, model_type: str, use_network: bool = True) -> str | None:
    """``resolve`` for the Hugging Face model types; None where the model type loads no hub checkpoint."""
    if model_type == "custom" or not pretrained:
        return None
    return resolve(pretrained, use_network)
