"""The prefix benchmark: the prompt tokens a prefix cache leaves to compute."""
