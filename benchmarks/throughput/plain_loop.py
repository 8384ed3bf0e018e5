"""The plain loop: the third arm of every case of benchmarks/train_throughput.py.

What a competent user writes in an afternoon instead of a trainer: the case's model built where
it trains, in the recipe's dtype, sdpa attention, the recipe's LoRA through PEFT's
`get_peft_model`, then for each optimizer step `model(input_ids, labels=...)` on each micro-batch,
`loss.backward()`, gradient clipping at the recipe's `max_grad_norm`, `torch.optim.AdamW` (fused
where the device has it) and `zero_grad`. No trainer, callbacks, compile, Liger, fused loss or
metrics. It trains on the rows and positions ours trains on:

- cpt: the case's token blocks, `per_device_train_batch_size` blocks a micro-batch, every
  position trained;
- sft: the case's examples packed as the recipe packs them (TRL's `pack_dataset` with the
  recipe's strategy; each row flattened with positions restarting at every example, as TRL's
  padding-free collator does), the answer tokens alone trained; padded batches when the recipe
  does not pack;
- grpo: the case's prompts, `prompts_per_step` a step, `num_generations` completions each sampled
  with `generate` (the recipe's temperature, top-k and completion length), the recipe's rewards,
  advantages normalised in each group, the policy-gradient loss on the completion tokens plus
  `beta` times the k3 estimate of the KL to a frozen copy of the starting model.

A PlainLoop looks to `train_measured` like a trainer (`train`, `add_callback`, `measured_steps`,
`window_marks`, `clock`, `args.max_steps`), so all three arms are measured by one piece of code.
"""

import copy
from types import SimpleNamespace

import torch


class PlainLoop:
    def __init__(self, bench, changes: dict | None = None):
        from trl import get_peft_config

        from medrecipes.models.loading import resolve_dtype

        recipe, args, model_args = bench.parse(changes or {})
        self.bench, self.args, self.method = bench, args, bench.method
        self.device = torch.device(bench.device)
        self.clock = bench.clock
        self.measured_steps, self.window_marks, self.callbacks = [], [], []
        dtype = resolve_dtype(model_args.dtype)
        dtype = torch.float32 if dtype == "auto" else dtype
        torch.manual_seed(0)
        if self.method == "grpo":
            from transformers import AutoModelForCausalLM

            path = bench.grpo_model_dir(recipe, model_args)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(self.device)
        else:
            from transformers import AutoModelForCausalLM

            with self.device:  # built where it trains, in its dtype: seconds for 4B parameters on a GPU
                model = AutoModelForCausalLM.from_config(
                    bench.model_config(model_args), dtype=dtype, attn_implementation="sdpa"
                )
        self.reference = None
        if self.method == "grpo" and args.beta:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        peft_config = get_peft_config(model_args)
        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        if bench.case.get("baseline", {}).get("activation_checkpointing"):  # where the plain trainer needs it to fit
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.model = model.train()
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        fused = self.device.type in ("cuda", "cpu")
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=args.learning_rate, weight_decay=args.weight_decay, fused=fused
        )
        # bf16 autocast where the recipe keeps fp32 weights and trains in bf16 (the pretraining recipe)
        self.autocast = args.bf16 and dtype == torch.float32
        self.steps = [self._micro_batches(step) for step in range(args.max_steps)] if self.method != "grpo" else None

    # -- the trainer's face, for train_measured ------------------------------------------------

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def settings(self) -> dict:
        return {
            "arm": "plain loop",
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "bf16_autocast": self.autocast,
            "optim": "torch.optim.AdamW" + (" (fused)" if self.optimizer.defaults.get("fused") else ""),
            "attention": self.model.config._attn_implementation,
            "lora": hasattr(self.model, "peft_config"),
            "activation_checkpointing": bool(getattr(self.model, "is_gradient_checkpointing", False)),
            "packing": bool(getattr(self.args, "packing", False)) if self.method == "sft" else None,
        }

    def train(self) -> None:
        state = SimpleNamespace(global_step=0, max_steps=self.args.max_steps)
        for step in range(self.args.max_steps):
            record = {"start": self.clock.mark(), "fwd_bwd": [], "tokens": [], "generation": [], "scoring": []}
            record["generated"] = 0
            self.measured_steps.append(record)
            if self.method == "grpo":  # generation and scoring inside the first micro-batch's step, as in TRL
                record["data_end"] = first = self.clock.mark()
                batches = self._grpo_batches(step, record)
            else:
                batches = [{k: v.to(self.device, non_blocking=True) for k, v in b.items()} for b in self.steps[step]]
                record["data_end"] = first = self.clock.mark()
            for number, batch in enumerate(batches):
                begin = first if number == 0 else self.clock.mark()
                stats = batch.pop("stats")
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                    # use_cache off, as any trainer's loss asks: with a cache the model builds no
                    # block-diagonal mask for packed rows, and their examples would attend to each other
                    loss = (
                        self._grpo_loss(batch) if self.method == "grpo" else self.model(**batch, use_cache=False).loss
                    )
                (loss / len(batches)).backward()
                record["fwd_bwd"].append((begin, self.clock.mark()))
                record["tokens"].append(stats)
            torch.nn.utils.clip_grad_norm_(self.trainable, self.args.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            state.global_step = step + 1
            for callback in self.callbacks:
                callback.on_step_end(self.args, state, None)

    # -- rows and positions --------------------------------------------------------------------

    def _micro_batches(self, step: int) -> list[dict]:
        """The micro-batches of one optimizer step, on the host (moved to the device in the loop)."""
        accumulation, rows = self.args.gradient_accumulation_steps, self.args.per_device_train_batch_size
        if self.method == "sft" and self.args.packing:
            data = self._packed()
        elif self.method == "sft":
            data, rows = self.bench.data, self.bench.padded_batch(self.args)
        else:
            data = self.bench.data
        first = step * accumulation * rows
        return [self._batch(data[first + i * rows : first + (i + 1) * rows]) for i in range(accumulation)]

    def _packed(self):
        if not hasattr(self, "_packed_rows"):
            from trl import pack_dataset

            strategy = getattr(self.args, "packing_strategy", "bfd")
            packed = pack_dataset(self.bench.data, self.args.max_length, strategy)
            self._packed_rows = packed.shuffle(seed=self.args.seed)  # as a DataLoader with shuffle=True
        return self._packed_rows

    def _batch(self, rows: dict) -> dict:
        """One micro-batch: flattened with restarting positions (packed rows), right-padded
        (examples) or as they are (blocks); labels on the trained positions; its token counts."""
        ids = rows["input_ids"]
        trained = rows.get("completion_mask", [[1] * len(row) for row in ids])
        labels = [
            [t if m else -100 for t, m in zip(row, mask, strict=True)] for row, mask in zip(ids, trained, strict=True)
        ]
        if "seq_lengths" in rows:
            lengths = [n for row in rows["seq_lengths"] for n in row]
            batch = {
                "input_ids": torch.tensor([[t for row in ids for t in row]]),
                "labels": torch.tensor([[t for row in labels for t in row]]),
                "position_ids": torch.tensor([[p for n in lengths for p in range(n)]]),
            }
        elif len({len(row) for row in ids}) == 1:
            lengths = [len(row) for row in ids]
            batch = {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}
        else:
            lengths = [len(row) for row in ids]
            width, pad = max(lengths), self.bench.tokenizer.pad_token_id
            batch = {
                "input_ids": torch.tensor([row + [pad] * (width - len(row)) for row in ids]),
                "labels": torch.tensor([row + [-100] * (width - len(row)) for row in labels]),
                "attention_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
            }
        batch["stats"] = torch.tensor([sum(lengths), sum(n * n for n in lengths)])
        return batch

    # -- GRPO ----------------------------------------------------------------------------------

    def _grpo_batches(self, step: int, record: dict) -> list[dict]:
        """Generate `num_generations` completions of the step's prompts, score them and return
        the training micro-batches (prompt + completion, advantages)."""
        from medrecipes.rewards import reward_functions

        args, tokenizer = self.args, self.bench.tokenizer
        if not hasattr(self, "_rewards"):
            self._rewards = reward_functions(args.rewards)
        questions = args.prompts_per_step
        data = self.bench.data
        rows = data[[(step * questions + i) % len(data) for i in range(questions)]]
        prompts = [p for p in rows["prompt"] for _ in range(args.num_generations)]
        columns = {k: [v for v in values for _ in range(args.num_generations)] for k, values in rows.items()}
        tokenizer.padding_side = "left"
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        begin = self.clock.mark()
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                **encoded, do_sample=True, temperature=args.temperature, top_k=args.top_k or None, top_p=1.0,
                max_new_tokens=args.max_completion_length, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        self.model.train()
        record["generation"].append((begin, self.clock.mark()))
        width = encoded["input_ids"].shape[1]
        completion = out[:, width:]
        # the completion's tokens up to and with its first end of sequence
        eos = completion == tokenizer.eos_token_id
        ended = eos.cumsum(-1) - eos.long() > 0
        completion_mask = (~ended).long()
        texts = tokenizer.batch_decode(completion.masked_fill(ended, tokenizer.pad_token_id), skip_special_tokens=True)
        ids_of = [row[: int(n)] for row, n in zip(completion.tolist(), completion_mask.sum(-1).tolist(), strict=True)]
        functions, weights = self._rewards
        rewards = torch.zeros(len(prompts))
        for function, weight in zip(
            functions, weights, strict=True
        ):  # TRL's arguments: prompts, completions, ids, columns
            values = function(prompts=prompts, completions=texts, completion_ids=ids_of, **columns)
            rewards += weight * torch.tensor([0.0 if v is None else v for v in values])
        grouped = rewards.view(-1, args.num_generations)
        advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        record["generated"] += int(completion_mask.sum())
        ids = torch.cat([encoded["input_ids"], completion], 1)
        mask = torch.cat([encoded["attention_mask"], completion_mask], 1)
        batches, size = [], args.per_device_train_batch_size
        for first in range(0, len(prompts), size):
            part = slice(first, first + size)
            lengths = mask[part].sum(-1)
            batches.append({
                "input_ids": ids[part], "attention_mask": mask[part], "completion_mask": completion_mask[part],
                "advantages": advantages[part].to(self.device), "prompt_width": width,
                "stats": torch.stack([lengths.sum(), (lengths * lengths).sum()]),
            })  # fmt: skip
        record["scoring"].append((begin, self.clock.mark()))
        return batches

    def _token_logprobs(self, model, batch: dict):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        width = batch["prompt_width"]
        logits = logits[:, width - 1 : -1].float() / self.args.temperature
        return torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, width:, None]).squeeze(-1)

    def _grpo_loss(self, batch: dict):
        logprobs = self._token_logprobs(self.model, batch)
        # on-policy: the ratio is 1 and its gradient that of the log-probability
        per_token = -torch.exp(logprobs - logprobs.detach()) * batch["advantages"][:, None]
        if self.reference is not None:
            with torch.no_grad():
                reference = self._token_logprobs(self.reference, batch)
            per_token = per_token + self.args.beta * (torch.exp(reference - logprobs) - (reference - logprobs) - 1)
        mask = batch["completion_mask"]
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
