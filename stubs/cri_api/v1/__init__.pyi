# Written by scripts/gen_cri_stubs.py; a namespace package at run time.
