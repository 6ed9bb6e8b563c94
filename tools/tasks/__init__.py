"""Task files: the shipped YAML tasks (this folder), their loader (task.py) and the per-service settings a
task gives the stack (config.py). Used by `apprentice demo` (tools/demo/) and `apprentice up --task` (tools/stack/)."""
