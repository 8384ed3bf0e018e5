"""The arms of a case that train through a trainer: ours (the recipe's own path) and the plain
trainer, with the data, tokenizer and model config the case's runs share (`Bench`); the third
arm, the plain loop, is `plain_loop.PlainLoop`."""

import importlib.util
import math
import os
import tempfile

from .cases import example_lengths, grpo_prompts, parse_case, sft_examples, token_blocks, vocabulary_tokenizer
from .measure import Clock, measured
from .plain_loop import PlainLoop


class Bench:
    """One case: its data, tokenizer and model config, shared by every run in the process."""

    def __init__(self, case: dict, device: str, workdir: str, profile: bool = False, census: bool = False):
        from medrecipes.models.scratch import scratch_config
        from medrecipes.plan.hardware import GPUS, gpu_type

        self.case, self.device, self.workdir = case, device, workdir
        self.profile = profile  # --profile: each run under torch.profiler
        self.census = census  # --census: each run's operators counted (op_census.py)
        self.clock = Clock(device == "cuda")
        vocab = scratch_config(case["architecture"]).vocab_size
        self.tokenizer = vocabulary_tokenizer(vocab)
        self.method = case["method"]
        recipe, args, model_args = self.parse({})
        self.base_args = args
        if self.method == "grpo":
            self.data = grpo_prompts(recipe, args.prompt_format, case["data"]["source"])
        elif self.method == "sft":
            spec = case["data"]["lengths"]
            rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * case["steps"]
            prompts, answer = example_lengths(spec, 1000)
            self.mean_length = float(prompts.mean()) + answer
            count = math.ceil(1.3 * rows * args.max_length / self.mean_length) + 8
            self.data = sft_examples(spec, count, vocab)
        else:
            count = args.per_device_train_batch_size * args.gradient_accumulation_steps * case["steps"]
            self.data = token_blocks(count, args.max_length, vocab)
        self.saved_model = None
        self.shape, self.trains_base = self.model_shape(model_args), not model_args.use_peft
        self.gpu = gpu_type(device_name(device)) if device == "cuda" else None
        self.peak_tflops = GPUS[self.gpu][1] if self.gpu else None

    def model_shape(self, model_args):
        """plan.shape.model_shape of the architecture, counted on the meta device (plan.shape.meta_model)."""
        from medrecipes.plan.shape import meta_model

        meta = meta_model(self.model_config(model_args))
        return model_shape(meta.config, meta)

    def uses_liger(self, changes: dict) -> bool:
        value = changes.get("use_liger_kernel", getattr(self.base_args, "use_liger_kernel", False))
        return str(value).lower() == "true"

    def parse(self, changes: dict):
        run_dir = tempfile.mkdtemp(dir=self.workdir)
        return parse_case(self.case, changes, self.device, run_dir)

    def settled(self, changes: dict):
        """The recipe as its script runs it: parsed, then settled before the model loads
        (`runs.settle.settle_run`: activation checkpointing by the memory plan where the recipe
        leaves it to the plan, GRPO's reward functions)."""
        from medrecipes.runs.settle import settle_run

        recipe, args, model_args = self.parse(changes)
        return recipe, args, model_args, settle_run(self.method, recipe, args, model_args, self.tokenizer)

    def padded_batch(self, args) -> int:
        """Examples per padded micro-batch that carry about the tokens of the packed one's rows."""
        return max(1, round(self.base_args.per_device_train_batch_size * args.max_length / self.mean_length))

    def model_config(self, model_args):
        from medrecipes.models.scratch import scratch_config

        tok = self.tokenizer
        ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
        return scratch_config(self.case["architecture"], vocab_size=len(tok), **ids)

    def grpo_model_dir(self, recipe, model_args) -> str:
        """GRPO starts from a checkpoint (its reference model is loaded from the same path): the
        random model is saved once and both runs load it."""
        import torch

        from medrecipes.models.loading import load_model

        if self.saved_model is None:
            self.saved_model = os.path.join(self.workdir, "model")
            torch.manual_seed(0)
            model = load_model(model_args, recipe, self.tokenizer)
            model.save_pretrained(self.saved_model)
            self.tokenizer.save_pretrained(self.saved_model)
            del model
        return self.saved_model

    def ours(self, changes: dict):
        """The recipe's trainer, as its script builds it (with `changes` to the recipe's keys)."""
        import torch
        from trl import get_peft_config

        from medrecipes.models.loading import load_model
        from medrecipes.training.callbacks import recipe_callbacks

        recipe, args, model_args, run = self.settled(changes)
        if self.method == "sft" and not args.packing:
            args.per_device_train_batch_size = self.padded_batch(args)
        if self.method == "grpo":
            model_args.model_name_or_path = self.grpo_model_dir(recipe, model_args)
            recipe.init_from_scratch = False
        torch.manual_seed(0)
        # A scratch model is initialised where it trains (seconds for 4B parameters on a GPU, minutes on a CPU).
        with torch.device(self.device if recipe.init_from_scratch else "cpu"):
            model = load_model(model_args, recipe, self.tokenizer, run.activation_checkpointing)
        common = {
            "model": model,
            "args": args,
            "train_dataset": self.data,
            "processing_class": self.tokenizer,
            "callbacks": recipe_callbacks(recipe, args),
        }
        if self.method == "cpt":
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            from medrecipes.training.trainers import CausalLMTrainer

            collator = DataCollatorForLanguageModeling(pad_token_id=self.tokenizer.pad_token_id)
            return measured(CausalLMTrainer, self.clock)(data_collator=collator, **common)
        if self.method == "sft":
            from medrecipes.training.trainers import MedSFTTrainer as trainer_class

            return measured(trainer_class, self.clock)(peft_config=get_peft_config(model_args), **common)
        from medrecipes.training.trainers import MedGRPOTrainer as trainer_class

        return measured(trainer_class, self.clock)(
            reward_funcs=list(run.reward_funcs), peft_config=get_peft_config(model_args), **common
        )

    def plain_loop(self, changes: dict):
        """The loop a user writes without a trainer (benchmarks/throughput/plain_loop.py), with the `--set` keys."""
        return PlainLoop(self, changes)

    def baseline(self):
        """The plain trainer with its defaults on the same model, data, precision and batch shape."""
        import torch
        from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

        from medrecipes.models.loading import resolve_dtype

        recipe, ours, model_args = self.parse({})
        dtype = resolve_dtype(model_args.dtype)
        shape = {
            "output_dir": ours.output_dir,
            "max_steps": ours.max_steps,
            "logging_steps": ours.logging_steps,
            "per_device_train_batch_size": ours.per_device_train_batch_size,
            "gradient_accumulation_steps": ours.gradient_accumulation_steps,
            "bf16": ours.bf16,
            "use_cpu": self.device == "cpu",
            "report_to": "none",
            "save_strategy": "no",
            **self.case.get("baseline", {}),
        }
        torch.manual_seed(0)
        if self.method == "grpo":
            path = self.grpo_model_dir(recipe, model_args)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
            model.to(self.device)
        else:
            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(
                    self.model_config(model_args),
                    dtype=torch.float32 if dtype == "auto" else dtype,
                    attn_implementation="sdpa",
                )
        if self.method == "cpt":
            from transformers import DataCollatorForLanguageModeling

            args = TrainingArguments(**shape)
            collator = DataCollatorForLanguageModeling(self.tokenizer, mlm=False)
            return measured(Trainer, self.clock)(
                model=model, args=args, train_dataset=self.data, data_collator=collator
            )
        if self.method == "sft":
            from trl import SFTConfig, SFTTrainer, get_peft_config

            shape["per_device_train_batch_size"] = self.padded_batch(ours)
            args = SFTConfig(max_length=ours.max_length, packing=False, completion_only_loss=True, **shape)
            return measured(SFTTrainer, self.clock)(
                model=model,
                args=args,
                train_dataset=self.data,
                processing_class=self.tokenizer,
                peft_config=get_peft_config(model_args),
            )
        from trl import GRPOConfig, GRPOTrainer

        from medrecipes.rewards import reward_functions

        reward_funcs, weights = reward_functions(ours.rewards)
        args = GRPOConfig(
            num_generations=ours.num_generations,
            max_completion_length=ours.max_completion_length,
            temperature=ours.temperature,
            top_k=ours.top_k,
            beta=ours.beta,
            reward_weights=weights,
            # The recipe's algorithm, TRL's own options (enhanced GRPO): the same in both runs.
            sync_ref_model=ours.sync_ref_model,
            ref_model_sync_steps=ours.ref_model_sync_steps,
            ref_model_mixup_alpha=ours.ref_model_mixup_alpha,
            off_policy_mask_threshold=ours.off_policy_mask_threshold,
            use_bias_correction_kl=ours.use_bias_correction_kl,
            **shape,
        )
        return measured(GRPOTrainer, self.clock)(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=self.data, processing_class=self.tokenizer
        )

    def settings(self, trainer) -> dict:
        """The speed settings a run trained with, as its trainer resolved them."""
        args, model = trainer.args, trainer.model
        keys = ("bf16", "tf32", "optim", "torch_compile", "use_liger_kernel", "logging_nan_inf_filter")
        found = {key: getattr(args, key, None) for key in keys}
        found["optim"] = str(getattr(args.optim, "value", args.optim))
        found["activation_checkpointing"] = bool(
            getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False)
        )
        found["attention"] = model.config._attn_implementation
        # as the CPT trainer resolved it; TRL's SFT and GRPO trainers always use the chunked head
        found["fused_lm_head"] = getattr(trainer, "fused_lm_head", self.method != "cpt")
        if self.method == "sft":
            found["packing"] = args.packing
        if hasattr(model, "peft_config"):
            found["lora_dropout"] = model.peft_config["default"].lora_dropout
        found["per_device_train_batch_size"] = args.per_device_train_batch_size
        found["gradient_accumulation_steps"] = args.gradient_accumulation_steps
        return found

    def knobs(self) -> list[dict]:
        """One change per speed setting, each switching it from what ours uses."""
        from medrecipes.models.loading import resolve_attention

        _, args, model_args, _ = self.settled({})
        cuda = self.device == "cuda"
        changes = []
        if self.method == "cpt":  # its default (None) is on where a GPU trains
            fused = cuda if args.fused_lm_head is None else args.fused_lm_head
            changes.append({"fused_lm_head": not fused})
        if self.method == "sft":
            changes.append({"packing": not args.packing})
        if model_args.use_peft and model_args.lora_dropout:
            # LoRA's dropout draws a mask over each adapted layer's input, in every layer (a CPU
            # profile of sft_lora_tiny has it second among the operators): the step without it
            changes.append({"lora_dropout": 0.0})
        if cuda and importlib.util.find_spec("liger_kernel") is not None:
            changes.append({"use_liger_kernel": not args.use_liger_kernel})
        if cuda and self.method != "grpo":
            changes.append({"torch_compile": not args.torch_compile})
        changes.append({"activation_checkpointing": not args.activation_checkpointing})
        changes.append({"logging_nan_inf_filter": not args.logging_nan_inf_filter})
        optim = str(getattr(args.optim, "value", args.optim))
        other = {"adamw_torch_fused": "adamw_torch", "adamw_torch": "adamw_torch_fused"}.get(optim)
        if other:
            changes.append({"optim": other})
        if cuda and resolve_attention(model_args.attn_implementation) != "sdpa":
            changes.append({"attn_implementation": "sdpa"})
        return changes


def model_shape(config, model):
    from medrecipes.plan.shape import model_shape as count

    return count(config, model)


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"
