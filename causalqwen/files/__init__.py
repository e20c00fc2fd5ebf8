"""Files and runs: what is read from disk and written to it.

`checkpoint` (what is read, and the checks before it is trusted), `loading` (strict ``from_pretrained`` and Qwen2
bases), `training_state` (a run's optimizer, scheduler and RNG states, without pickle), `runs` (a training run's
checkpoints, resume checks and metrics log), `rundir` (output directories: claimed, locked), `safe_writes` (never
through a link), `written_files` (the record of what a save wrote, all that is ever removed),
`data` (the synthetic corpus, JSONL, batches).
"""
