"""Multiple-choice accuracy of a model, scored two ways, overall and by subject.

`loglik` reproduces lm-evaluation-harness 0.4's multiple-choice scoring: the log-likelihood
of each answer string (" A", " B", ...) after the task's prompt (`evaluation.tasks`);
the prediction is the first option with the highest sum (acc), or with the highest sum per
character of the answer string (acc_norm). `generate` asks the question with the chat
template (`usmle.chat_messages`), lets the model answer (greedy unless a temperature is set)
and reads the letter with the shared extractor; an answer it cannot read counts as wrong and
is reported as unparseable. Accuracies come with a Wilson 95% interval; macro-F1 over the gold
answers' classes (PubMedQA's other standard metric; a baseline that always answers "yes" scores
55% accuracy there and 0.24 macro-F1) with a seeded bootstrap 95% interval over questions.
"""
