"""The invariants stage's checks, one module per rule (see objdebug/stages/invariants.py)."""
