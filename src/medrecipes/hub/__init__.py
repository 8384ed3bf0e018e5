"""The Hub end of a run, by job: the model card (`card`: what a run's card says, and `medrecipes
card`), the push of final/ with its card (`push`, the recipe scripts' last step) and the
checkpoints pushed to branches during training (`checkpoints`, the one module training imports).
Its modules import down: push, then card, then checkpoints."""
