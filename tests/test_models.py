"""Tests for model loading: scratch presets, tiny local models, .gguf paths, dtype and attention."""

import os
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT
from trl import ModelConfig

from medrecipes import cli
from medrecipes.errors import UserError
from medrecipes.models.gguf import split_gguf
from medrecipes.models.loading import load_model, load_tokenizer, resolve_attention, resolve_dtype
from medrecipes.models.scratch import PRESETS, preset_config
from medrecipes.plan.shape import model_shape

# name: (layers, hidden size, stated total in the "Pure Transformer" table, exact count)
TABLE = {
    "tiny": (12, 512, 85e6, 84_947_456),
    "small": (16, 768, 178e6, 179_331_840),
    "medium": (24, 1024, 374e6, 377_537_536),
    "medium-large": (20, 1152, 401e6, 401_717_376),
    "large": (24, 1536, 763e6, 755_049_984),
    "xlarge": (32, 1920, 1.46e9, 1_462_888_320),
}


def test_every_preset_is_in_the_table():
    assert list(PRESETS) == list(TABLE)


@pytest.mark.parametrize("name", list(TABLE))
def test_preset_matches_the_table(name):
    layers, hidden, stated, exact = TABLE[name]
    shape = model_shape(preset_config(name))
    assert (shape.num_layers, shape.hidden_size) == (layers, hidden)
    assert abs(shape.num_parameters - stated) / stated < 0.025
    # The exact count pins the preset: any change to a width or the vocabulary shows up here.
    assert shape.num_parameters == exact
    assert shape.vocab_size == 49152


def test_preset_heads_are_64_wide_and_embeddings_tied():
    config = preset_config("small")
    assert config.hidden_size // config.num_attention_heads == 64
    assert config.tie_word_embeddings


def test_unknown_preset_suggests_the_closest():
    with pytest.raises(UserError) as info:
        preset_config("smal")
    message = str(info.value)
    assert "'smal'" in message
    assert "did you mean 'small'" in message


# ---------------------------------------------------------------------------
# medrecipes tiny-model


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3_text"])
def tiny_folder(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"tiny-{request.param}")
    # The command's default corpus is relative to the project root, where users run it.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        cli.main(["tiny-model", str(out), "--arch", request.param])
    return request.param, out


def test_tiny_model_loads_and_runs(tiny_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arch, folder = tiny_folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == arch
    assert model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    inputs = tokenizer(["Aortic stenosis causes exertional syncope."], return_tensors="pt")
    assert inputs["input_ids"][0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_tiny_model_has_a_chat_template(tiny_folder):
    from transformers import AutoTokenizer

    _, folder = tiny_folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [
        {"role": "user", "content": "Which drug reverses heparin?"},
        {"role": "assistant", "content": "Protamine."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\nWhich drug reverses heparin?<|im_end|>" in text
    assert "<|im_start|>assistant\nProtamine.<|im_end|>" in text
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    # Each chat marker is one token, so generation can stop on <|im_end|>.
    assert len(tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"]) == 1


def test_tiny_model_loads_through_the_recipe_loaders(tiny_folder):
    _, folder = tiny_folder
    tokenizer = load_tokenizer(str(folder))
    model_args = ModelConfig(model_name_or_path=str(folder), dtype="float32")
    model = load_model(model_args, SimpleNamespace(init_from_scratch=False), tokenizer)
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.num_hidden_layers == 2


def test_a_json_document_corpus_is_read_as_its_texts(tmp_path):
    """A JSON file (PubMedQA's, one object keyed by id) gives its strings, not its syntax and keys."""
    import json

    from medrecipes.models.tiny import _read_texts, train_tokenizer

    path = tmp_path / "pubmedqa.json"
    document = {"123": {"QUESTION": "Does it help?", "CONTEXTS": ["It did.", "Twice."]}}
    for indent in (None, 1):  # on one line, and over many as PubMedQA's own file is written
        path.write_text(json.dumps(document, indent=indent), "utf-8")
        assert list(_read_texts([str(path)])) == ["Does it help?", "It did.", "Twice."]
        assert train_tokenizer([str(path)], vocab_size=300).get_vocab()  # its checks take it whole
    lines = [{"text": "Does it help?", "id": 1}, {"text": "It did.", "id": 2}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")  # JSON Lines named .json
    assert list(_read_texts([str(path)])) == ["Does it help?", "It did."]
    assert train_tokenizer([str(path)], vocab_size=300).get_vocab()


def test_tiny_model_with_missing_corpus(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["tiny-model", str(tmp_path / "out"), "--corpus", str(tmp_path / "missing.txt")])
    assert info.value.code == 2
    assert "missing.txt" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Paths, dtype, attention


def test_gguf_file_loads_from_its_folder(tmp_path):
    path = tmp_path / "model-Q4_K_M.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # a whole header: no tensors, no metadata
    assert split_gguf(str(path)) == (str(tmp_path), {"gguf_file": "model-Q4_K_M.gguf"})
    path.write_bytes(b"GGUF")  # cut short in its header
    with pytest.raises(UserError, match="model-Q4_K_M.gguf is cut short or corrupt"):
        split_gguf(str(path))


def test_missing_gguf_file(tmp_path):
    with pytest.raises(UserError, match="absent.gguf"):
        split_gguf(str(tmp_path / "absent.gguf"))


def test_other_paths_load_as_they_are(tmp_path):
    assert split_gguf("google/gemma-3-4b-pt") == ("google/gemma-3-4b-pt", {})
    assert split_gguf(str(tmp_path)) == (str(tmp_path), {})


@pytest.mark.parametrize("path", ["/no/such/model", "./no-model", "outputs/no-run/final"])
def test_a_missing_local_path_is_not_taken_for_a_hub_id(path):
    with pytest.raises(UserError) as info:
        split_gguf(path)
    where = "" if path.startswith("/") else f" under {os.getcwd()}, where relative paths start"
    assert str(info.value) == (
        f"{path}: no such file or folder{where}; pass a model's folder, a .gguf file or a Hub id (org/name)"
    )


def test_dtype_names():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("auto") == "auto"
    assert resolve_dtype(None) == "auto"
    with pytest.raises(UserError, match="bogus"):
        resolve_dtype("bogus")


def test_attention_default_on_cpu_and_explicit_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_attention(None) == "sdpa"
    assert resolve_attention("eager") == "eager"
    assert resolve_attention("flash_attention_2") == "flash_attention_2"


def test_missing_model_is_a_user_error(tmp_path, tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    model_args = ModelConfig(model_name_or_path=str(tmp_path / "no-model"), dtype=None)
    with pytest.raises(UserError, match="no-model"):
        load_model(model_args, SimpleNamespace(init_from_scratch=False), tokenizer)


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused_at_load(tiny_model):
    """Ids past the embedding's last row would fail inside the first step; said in one line."""
    tokenizer = load_tokenizer(tiny_model)
    rows = len(tokenizer)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(8)])
    recipe = SimpleNamespace(init_from_scratch=False, tokenizer_name_or_path="other")
    with pytest.raises(
        UserError,
        match=rf"tokenizer_name_or_path \(.*\): {len(tokenizer):,} tokens, and the model has {rows:,} embedding rows",
    ):
        load_model(ModelConfig(model_name_or_path=tiny_model), recipe, tokenizer)


def test_missing_tokenizer_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no-tokenizer"):
        load_tokenizer(str(tmp_path / "no-tokenizer"))


# ---------------------------------------------------------------------------
# From scratch


def test_scratch_model_takes_the_tokenizers_vocabulary(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    model_args = ModelConfig(model_name_or_path=None, dtype=None)
    recipe = SimpleNamespace(init_from_scratch=True, architecture="tiny")
    model = load_model(model_args, recipe, tokenizer)
    assert model.config.vocab_size == len(tokenizer) == model.get_input_embeddings().weight.shape[0]
    assert model.config.num_hidden_layers == 12
    assert model.config.hidden_size == 512
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    # Scratch weights train in fp32 unless the recipe names a dtype.
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[tokenizer.bos_token_id, 5, 6]])).logits
    assert logits.shape == (1, 3, len(tokenizer))


def test_scratch_model_with_unknown_architecture(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    model_args = ModelConfig(model_name_or_path=None, dtype=None)
    with pytest.raises(UserError, match="did you mean 'tiny'"):
        load_model(model_args, SimpleNamespace(init_from_scratch=True, architecture="tinyy"), tokenizer)


def test_convert_gguf_refuses_what_is_not_a_gguf_file(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    for source in (str(tmp_path / "missing.gguf"), str(tmp_path / "config.json")):
        with pytest.raises(SystemExit) as exit:
            cli.main(["convert-gguf", source, str(tmp_path / "out")])
        assert exit.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_csv_corpus_is_read_by_its_cells_not_its_lines(tmp_path):
    """A CSV corpus gives the tokenizer its cells' text: no header, no quoting."""
    from medrecipes.models.tiny import train_tokenizer

    corpus = tmp_path / "corpus.csv"
    corpus.write_text('text,id\n"Aspirin inhibits COX enzymes, reducing prostaglandins.",1\n"Metformin, twice.",2\n')
    tokenizer = train_tokenizer([str(corpus)], vocab_size=300)
    vocab = tokenizer.get_vocab()
    assert not any('"' in token for token in vocab if len(token) > 1), "the CSV's quoting was learned as text"
    assert "Aspirin" in tokenizer.decode(tokenizer("Aspirin")["input_ids"], skip_special_tokens=True)


def test_a_parquet_corpus_is_read_by_its_text_cells(tmp_path):
    """A Parquet corpus (the layout of most Hub text datasets) gives the tokenizer its rows' text,
    not its bytes as if it were a text file."""
    from datasets import Dataset

    from medrecipes.models.tiny import train_tokenizer

    corpus = tmp_path / "corpus.parquet"
    Dataset.from_dict({"text": ["Aspirin inhibits COX enzymes."] * 20, "id": list(range(20))}).to_parquet(str(corpus))
    tokenizer = train_tokenizer([str(corpus)], vocab_size=300)
    assert "Aspirin" in tokenizer.decode(tokenizer("Aspirin")["input_ids"], skip_special_tokens=True)
    assert not any("PAR1" in token for token in tokenizer.get_vocab())  # Parquet's magic bytes were not learned


def test_the_command_says_its_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"medrecipes {version('medrecipes')}"


def test_an_adapter_on_the_output_layer_is_refused_for_trl_trainers_only():
    """TRL's trainers refuse LoRA on the output layer once the model loads; the layer is found in
    the model (a name in a list, or a pattern of the whole name), and CPT's Trainer takes it."""
    from transformers import AutoConfig
    from trl import ModelConfig

    from medrecipes.config import CPTConfig, MedSFTConfig
    from medrecipes.errors import UserError
    from medrecipes.models.loading import check_adapter_targets

    config = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64
    )
    cpt, sft = CPTConfig(output_dir="unused", use_cpu=True), MedSFTConfig(output_dir="unused", use_cpu=True)
    for targets in (["q_proj", "lm_head"], ".*(lm_head|q_proj)"):
        model_args = ModelConfig(use_peft=True, lora_target_modules=targets)
        check_adapter_targets(model_args, None, config, cpt)
        with pytest.raises(UserError, match="lm_head is the output layer"):
            check_adapter_targets(model_args, None, config, sft)
    check_adapter_targets(ModelConfig(use_peft=True, lora_target_modules=".*_proj"), None, config, sft)


def test_a_gguf_without_a_tokenizer_is_said_before_transformers_guesses(tmp_path):
    """A weights-only .gguf (no tokenizer.ggml.* metadata): one line where its tokenizer is asked
    for, not transformers' warning about a guessed vocabulary and then its refusal."""
    import gguf

    from medrecipes.errors import UserError
    from medrecipes.models.files import check_tokenizer_files

    path = tmp_path / "weights.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UserError, match="holds no tokenizer \\(no tokenizer.ggml.\\* metadata\\)"):
        check_tokenizer_files(str(path))


def test_another_models_tokenizer_beside_a_model_with_its_own_is_said(tiny_model, tmp_path, caplog):
    """tokenizer_name_or_path naming a tokenizer of other ids than the one saved with the starting
    model: every id would be read as another token, said; the model's own named again, no word."""
    from conftest import CORPUS

    from medrecipes.config import parse_recipe
    from medrecipes.models.loading import recipe_tokenizer
    from medrecipes.models.tiny import build_tiny_model

    other = build_tiny_model(str(tmp_path / "other"), [str(CORPUS)], vocab_size=512)
    for tokenizer, said in ((other, True), (tiny_model, False)):
        recipe, _, model_args = parse_recipe(
            "sft", ["recipes/tiny_sft.yaml", "--model_name_or_path", tiny_model, "--tokenizer_name_or_path", tokenizer]
        )
        caplog.clear()
        with caplog.at_level("WARNING"):
            recipe_tokenizer(recipe, model_args)
        assert ("is not the tokenizer saved with" in caplog.text) == said, caplog.text


def test_ddp_looks_for_unused_parameters_only_in_a_model_that_may_leave_some():
    """Left unset, a dense text model trains under DDP without the search for unused parameters;
    a Mixture-of-Experts model (a router, TRL's sign of one) and a model of several parts (a vision
    tower) keep Trainer's choice, and a recipe's own value stands."""
    from types import SimpleNamespace

    from transformers import Gemma3Config, LlamaConfig, MixtralConfig, Qwen2MoeConfig

    from medrecipes.models.loading import settle_unused_parameters

    for config, settled in (
        (LlamaConfig(), False),
        (MixtralConfig(), None),
        (Qwen2MoeConfig(), None),
        (Gemma3Config(), None),
    ):
        args = SimpleNamespace(ddp_find_unused_parameters=None)
        settle_unused_parameters(config, args)
        assert args.ddp_find_unused_parameters is settled, type(config).__name__
    for given in (True, False):
        args = SimpleNamespace(ddp_find_unused_parameters=given)
        settle_unused_parameters(LlamaConfig(), args)
        assert args.ddp_find_unused_parameters is given


def test_weights_trained_in_bfloat16_that_a_step_cannot_move_are_said(tiny_model, caplog):
    """An Adam-style step is about learning_rate; a bfloat16 weight above 256 x learning_rate
    rounds it away. Said with their share where they are a tenth or more; not for float32 weights,
    nor under DeepSpeed, whose optimizer steps float32 copies."""
    import logging

    from transformers import AutoModelForCausalLM

    from medrecipes.training.run import say_half_precision_weights

    def trainer(dtype, rate, deepspeed=False):
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype)
        return SimpleNamespace(model=model, is_deepspeed_enabled=deepspeed,
                               args=SimpleNamespace(should_log=True, learning_rate=rate))  # fmt: skip

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    weights = torch.cat([p.detach().abs().flatten().float() for p in model.parameters()])
    expected = 100 * (weights > 1e-6 * 256).float().mean().item()
    with caplog.at_level(logging.WARNING, logger="medrecipes.training.run"):
        say_half_precision_weights(trainer(torch.bfloat16, 1e-6))
        assert f"{expected:.0f}% of the {weights.numel():,} trainable weights are held in bfloat16" in caplog.text
        caplog.clear()
        for quiet in (trainer(torch.float32, 1e-6), trainer(torch.bfloat16, 1e-6, deepspeed=True),
                      trainer(torch.bfloat16, 1.0)):  # fmt: skip
            say_half_precision_weights(quiet)
        assert caplog.text == ""
    # The rounding it describes: one step of learning_rate leaves such a weight as it was.
    big = weights.max().to(torch.bfloat16)
    assert big - torch.tensor(1e-6, dtype=torch.bfloat16) == big


def test_a_recipes_template_that_drops_the_models_bos_is_said(tiny_model, caplog):
    import logging

    from transformers import AutoTokenizer

    from medrecipes.models.templates import say_dropped_bos

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    own = tokenizer.chat_template
    plain = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    )
    with caplog.at_level(logging.WARNING, logger="medrecipes.models.templates"):
        say_dropped_bos(tokenizer, own, "{{ bos_token }}" + plain)  # keeps it: nothing said
        assert not caplog.records
        say_dropped_bos(tokenizer, own, plain)
    assert "chat_template_path: the template renders no <|bos|>, which" in caplog.text
