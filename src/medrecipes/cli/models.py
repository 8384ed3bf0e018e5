"""The commands that make or use a model: tiny-model, merge-lora, convert-gguf, generate, serve."""

from medrecipes.cli.arguments import COUNT, SEED, Number, input_path, output_path
from medrecipes.errors import UserError

DEFAULT_CORPUS = ["data/medical_text/train.jsonl"]


def add_commands(commands) -> None:
    """tiny-model, merge-lora, convert-gguf, generate and serve."""
    tiny = commands.add_parser("tiny-model", help="build a random 2-layer model and a local tokenizer")
    tiny.add_argument("out_dir", type=output_path)
    tiny.add_argument("--arch", default="llama", choices=["llama", "gemma3_text", "qwen2"])
    tiny.add_argument(
        "--corpus",
        type=input_path,
        nargs="+",
        help="text, JSON, JSONL, CSV or Parquet files to train the tokenizer on",
    )
    # The tokenizer needs its 256 byte symbols and special tokens; attention has 4 heads; tiny means small.
    tiny.add_argument("--vocab-size", type=Number(int, least=300, most=2**18), default=1024)
    tiny.add_argument("--seed", type=SEED, default=0)
    tiny.add_argument("--hidden-size", type=Number(int, least=8, most=4096), default=64)
    tiny.add_argument("--layers", type=Number(int, least=1, most=64), default=2)
    tiny.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    tiny.set_defaults(func=cmd_tiny_model)

    merge = commands.add_parser("merge-lora", help="fold a LoRA adapter into its base model and save the result")
    merge.add_argument("adapter_dir", type=input_path, help="the folder a LoRA run saved (with adapter_config.json)")
    merge.add_argument("out_dir", type=output_path, help="where to save the merged model and tokenizer")
    merge.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], help="weights dtype (default: the base checkpoint's)"
    )
    merge.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    merge.set_defaults(func=cmd_merge_lora)

    convert = commands.add_parser("convert-gguf", help="save a .gguf model as an ordinary model folder, once")
    convert.add_argument("gguf", type=input_path, help="the .gguf model file")
    convert.add_argument("out_dir", type=output_path, help="where to save the model, tokenizer and generation config")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    convert.set_defaults(func=cmd_convert_gguf)

    gen = commands.add_parser("generate", help="the model's greedy answer to one prompt")
    gen.add_argument("model", type=input_path, help="a model folder (e.g. output_dir/final) or Hub id")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", help="a system turn before the prompt")
    gen.add_argument("--max-new-tokens", type=COUNT, default=256)
    gen.set_defaults(func=cmd_generate)

    serve = commands.add_parser("serve", help="an OpenAI-compatible server for one model (docs/serving.md)")
    serve.add_argument(
        "model", type=input_path, help="a model or LoRA adapter folder (e.g. output_dir/final) or Hub id"
    )
    serve.add_argument("--host", default="127.0.0.1", help="127.0.0.1: this machine only (the default)")
    serve.add_argument("--port", type=Number(int, least=1, most=65535), default=8000)
    serve.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' (better: the MEDRECIPES_API_KEY environment variable)"
    )
    serve.add_argument(
        "--max-body-bytes", type=Number(int, least=1024, most=2**30), default=2**20, help="larger bodies get a 413"
    )
    serve.add_argument(
        "--max-tokens",
        type=Number(int, least=1, most=2**20),
        default=1024,
        help="the most max_tokens a request may ask",
    )
    serve.add_argument(
        "--served-model-name",
        help="the name clients ask for (default: the run's, output_dir's name for output_dir/final)",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_tiny_model(args) -> None:
    from transformers import AutoTokenizer

    from medrecipes.models.gguf import check_folder_name
    from medrecipes.models.tiny import build_tiny_model
    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged

    if args.hidden_size % 8:  # 4 heads, each of an even width: rotary positions turn its dimensions in pairs
        low, high = args.hidden_size // 8 * 8, args.hidden_size // 8 * 8 + 8
        raise UserError(
            f"tiny-model: --hidden-size must be a multiple of 8 (4 attention heads, each of an even width for "
            f"rotary positions), got {args.hidden_size}; use {f'{low} or ' if low else ''}{high}"
        )
    corpus = args.corpus or DEFAULT_CORPUS
    check_folder_name(args.out_dir, "tiny-model OUT_DIR")
    claim_output(args.out_dir, "tiny-model", "tiny-model OUT_DIR", corpus, args.overwrite, folder=True)
    with staged(args.out_dir, folder=True, kind="tiny-model") as path:
        build_tiny_model(path, corpus, args.arch, args.vocab_size, args.seed, args.hidden_size, args.layers)
    learned = len(AutoTokenizer.from_pretrained(args.out_dir))
    fewer = (
        f", {learned} of the {args.vocab_size} asked: the corpus holds too little text for more"
        if learned < args.vocab_size
        else ""
    )
    print(f"tiny {args.arch} model and tokenizer ({learned} tokens{fewer}) saved to {args.out_dir}")


def cmd_merge_lora(args) -> None:
    from medrecipes.models.saving import merge_lora

    merge_lora(args.adapter_dir, args.out_dir, args.dtype, args.overwrite)
    print(f"adapter {args.adapter_dir} merged into its base model; saved to {args.out_dir}")


def cmd_convert_gguf(args) -> None:
    from medrecipes.models.saving import convert_gguf

    convert_gguf(args.gguf, args.out_dir, args.overwrite)
    print(f"{args.gguf} saved as a model folder in {args.out_dir}")


def cmd_generate(args) -> None:
    from medrecipes.serving import generate

    print(generate(args.model, args.prompt, args.system, args.max_new_tokens))


def cmd_serve(args) -> None:
    from medrecipes.serving import serve

    serve(args.model, args.host, args.port, args.api_key, args.max_body_bytes, args.max_tokens, args.served_model_name)
