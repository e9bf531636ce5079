"""The packing stage's checks, one module each (OBJ901-OBJ904); `_common.py` measures once."""
