"""The paper's experiment: its relQuery trace under each policy and rate, on the simulator."""
