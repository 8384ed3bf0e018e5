"""Where commands write: never over their own input, never over anything this project did not
write, over an earlier result of ours only when the user says so, and atomically, so that a
kill leaves the old result or the new one, never a part. Every command and recipe script
claims its output with `claims.claim_output` before it starts work; a training run also locks its
folder (`claims.lock_folder`).

How a result is written, in `writes`; the record of what wrote it, in `records`; a run's
checkpoints, in `checkpoints`.
"""
