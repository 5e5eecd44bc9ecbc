"""The idle-CPU benchmark: what the walkthrough's pipeline costs with nothing flowing."""
